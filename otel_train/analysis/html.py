"""The report as one self-contained HTML file: inline CSS, inline SVG, a few lines of inline
JavaScript for the legend; nothing is fetched from anywhere."""

from __future__ import annotations

from html import escape

from otel_train.analysis import svg
from otel_train.analysis.report_model import Report
from otel_train.analysis.terminal import (
    arrival_lines,
    column_s,
    fmt_bytes,
    fmt_s,
    late_rows,
    phase_columns,
    straggler_lines,
    warmup_lines,
)

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:20px} h2{font-size:16px;margin-top:28px} h3{font-size:13px;margin:12px 0 2px}
table{border-collapse:collapse;font-size:12px} td,th{padding:3px 8px;border-bottom:1px solid #ddd;
text-align:right} th{background:#f4f4f4} td.l,th.l{text-align:left}
.legend span{cursor:pointer;margin-right:14px;font-size:12px;user-select:none}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:middle}
.legend span.off{opacity:.35} svg.plot text{font-family:system-ui,sans-serif;fill:#333}
"""

# Clicking a legend entry hides that phase in every plot (the marks share ph-<phase>).
SCRIPT = """
document.querySelectorAll('.legend span[data-kind]').forEach(function (entry) {
  entry.addEventListener('click', function () {
    var off = entry.classList.toggle('off');
    document.querySelectorAll('.ph-' + entry.dataset.kind).forEach(function (mark) {
      mark.style.display = off ? 'none' : '';
    });
  });
});
document.body.dataset.ready = 'true';
"""


def render_html(report: Report) -> str:
    title = f"otel-train report: {report.run_id}"
    parts = [f"<h1>{escape(title)}</h1>", _summary(report), _legend(report),
             "<h2>Slowest steps across ranks</h2>", _slow_table(report)]
    for timeline in report.timelines:
        parts += [f"<h3>step {timeline.step}: {fmt_s(timeline.duration_s)}</h3>",
                  svg.gantt(timeline)]
    parts += ["<h2>Step time per rank</h2>", svg.distributions(report),
              "<h2>Mean phase time per rank, steady state</h2>", svg.phase_shares(report),
              _untimed_split(report),
              "<h2>Breakdown over time</h2>", svg.over_time(report),
              "<h2>Collectives</h2>", _collectives(report), _late_table(report),
              "<h2>Memory, overlap and CPU throttling</h2>", _resources(report)]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            + "\n".join(parts) + f"<script>{SCRIPT}</script></body></html>\n")


def _summary(report: Report) -> str:
    items = [f"{report.world_size} ranks", f"{report.sampled_steps} sampled steps"
             + (f" of {report.trained_steps} trained" if report.trained_steps else ""),
             f"wall {fmt_s(report.wall_s)}"]
    items.extend(fate.sentence for fate in report.rank_fates)
    items.extend(warmup_lines(report))
    if report.unreadable_ranks:
        items.append(f"ranks whose traces could not be read (damaged or truncated files): "
                     f"{report.unreadable_ranks}")
    if report.missing_ranks:
        items.append(f"ranks that sent no telemetry: {report.missing_ranks}")
    if report.straggler is not None:
        items.extend(straggler_lines(report))
    items.extend(arrival_lines(report))
    if report.samples_per_s:
        items.append(f"{report.samples_per_s:,.1f} samples/s")
    c = report.compile
    items.append(f"compile: {c.compilations} compilations, {fmt_s(c.total_s)}, "
                 f"{c.graph_breaks} graph breaks, {c.recompiles} recompiles")
    if any(report.dropped.values()):
        items.append(f"telemetry dropped: {report.dropped}")
    return "<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>"


def _legend(report: Report) -> str:
    kinds = [*report.phases, "collective"]
    return '<p class="legend">' + "".join(
        f'<span data-kind="{k}"><i style="background:{svg.COLORS[k]}"></i>'
        f'{escape(k.replace("_", " "))}</span>' for k in kinds if k in svg.COLORS) + "</p>"


def _table(header: list[str], rows: list[list[str]], left: int = 0) -> str:
    def cell(tag: str, i: int, value: str) -> str:
        cls = ' class="l"' if i < left else ""
        return f"<{tag}{cls}>{escape(value)}</{tag}>"
    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _slow_table(report: Report) -> str:
    return _table(["cause", "step", "duration", "rank"],
                  [[s.cause, str(s.step), fmt_s(s.duration_s), str(s.rank)]
                   for s in report.slow_steps], left=1)


def _untimed_split(report: Report) -> str:
    """Untimed time's parts per rank, where the run records them (sources/gaps.py)."""
    columns = [c for c in phase_columns(report) if c[1] == "split"]
    if not columns:
        return ""
    rows = []
    for row in report.rank_rows:
        step_mean = sum(row.phase_mean_s.values()) or 1.0
        rows.append([str(row.rank)] + [
            f"{fmt_s(column_s(row, kind, key))} ({column_s(row, kind, key) / step_mean:.0%})"
            for _, kind, key in columns])
    return ("<h3>Untimed time: blocked on the device, busy on the host, not explained</h3>"
            + _table(["rank"] + [header for header, _, _ in columns], rows))


def _collectives(report: Report) -> str:
    if not report.collectives:
        return "<p>no collectives recorded</p>"
    return _table(["op", "count", "total", "bytes", "mean bus bw GB/s"],
                  [[r.op, str(r.count), fmt_s(r.total_s), fmt_bytes(r.bytes),
                    "-" if r.mean_bus_bw_gbps is None else f"{r.mean_bus_bw_gbps:.1f}"]
                   for r in report.collectives], left=1)


def _late_table(report: Report) -> str:
    rows = late_rows(report)
    if not rows:
        return ""
    return ("<h3>Who the slowest steps' collectives waited for</h3>"
            + _table(["step", "late rank", "late by", "its latest arrival, after the others"],
                     rows))


def _resources(report: Report) -> str:
    return _table(["rank", "peak allocated", "reserved", "comm overlap", "cpu throttled"],
                  [[str(r.rank), fmt_bytes(r.memory_peak_bytes), fmt_bytes(r.memory_reserved_bytes),
                    "-" if r.comm_overlap is None else f"{r.comm_overlap:.0%}",
                    fmt_s(r.cpu_throttled_s)] for r in report.resources])
