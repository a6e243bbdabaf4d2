"""The report as one self-contained HTML file: inline CSS, inline SVG, a few lines of inline
JavaScript for the legend; nothing is fetched from anywhere."""

from __future__ import annotations

import math
from html import escape

from otel_train.analysis import svg, terminal
from otel_train.analysis.report_model import Report
from otel_train.analysis.terminal import (
    arrival_lines,
    fmt_bytes,
    fmt_s,
    late_rows,
    straggler_lines,
    warmup_lines,
)

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:20px} h2{font-size:17px;margin-top:30px} h3{font-size:14px;margin:16px 0 4px}
table{border-collapse:collapse;font-size:12px} td,th{padding:3px 8px;border-bottom:1px solid #ddd;
text-align:right;white-space:nowrap} th{background:#f4f4f4} td.l,th.l{text-align:left;
white-space:normal} i.swatch{display:inline-block;width:10px;height:10px;margin-right:5px}
tr.total td{font-weight:bold} th.straggler-col{color:#c0392b;background:#fbe3e0}
.legend.static span{cursor:default}
th.sub{font-weight:normal;color:#666;font-size:11px}
tr.straggler td{background:#fbe3e0} tr.straggler td.rank{color:#c0392b;font-weight:bold}
.badge{color:#fff;background:#c0392b;border-radius:3px;padding:0 5px;font-size:11px;
margin-left:6px;font-weight:bold} td.above{font-weight:bold;background:#fff1c9}
tr.straggler td.above{background:#f6c9c2}
p.note{font-size:12px;color:#555;margin:4px 0 10px;max-width:960px}
p.why{font-size:13px;margin:6px 0} p.why b{color:#c0392b}
.legend span{cursor:pointer;margin-right:14px;font-size:12px;user-select:none;
white-space:nowrap;display:inline-block}
.legend i{display:inline-block;width:11px;height:11px;margin-right:4px;vertical-align:middle}
.legend span.off{opacity:.35} svg.plot text{font-family:system-ui,sans-serif;fill:#333}
"""

# Clicking a legend entry hides that phase in every plot (the marks share ph-<phase>).
SCRIPT = """
// Every legend (the page's, the per-rank chart's) shows the same state.
document.querySelectorAll('.legend span[data-kind]').forEach(function (entry) {
  entry.addEventListener('click', function () {
    var kind = entry.dataset.kind, off = !entry.classList.contains('off');
    document.querySelectorAll('.legend span[data-kind="' + kind + '"]').forEach(function (e) {
      e.classList.toggle('off', off);
    });
    document.querySelectorAll('.ph-' + kind).forEach(function (mark) {
      mark.style.display = off ? 'none' : '';
    });
  });
});
document.body.dataset.ready = 'true';
"""


def render_html(report: Report) -> str:
    title = f"otel-train report: {report.run_id}"
    steady = _steady_words(report)
    parts = [f"<h1>{escape(title)}</h1>", _summary(report), _legend(report),
             f"<h2>Which rank? Per rank, {escape(steady)}</h2>", _straggler_why(report),
             _per_rank_table(report),
             f"<h3>Mean step per rank, split into its parts ({escape(steady)})</h3>",
             _legend(report, per_rank=True), svg.phase_shares(report), _parts_note(report),
             f"<h3>Step time per rank ({escape(steady)})</h3>", svg.distributions(report),
             '<p class="note">Box: p25 to p75; thick line: median; dashed tick: p95; '
             "whiskers: fastest to slowest steady step.</p>",
             _warmup(report),
             "<h2>Slowest steps across ranks</h2>", _slow_table(report)]
    for timeline in report.timelines:
        parts += [f"<h3>step {timeline.step}: {fmt_s(timeline.duration_s)}</h3>",
                  svg.gantt(timeline, report)]
        if timeline.ranks_of is not None:
            shown = len({bar.rank for bar in timeline.bars})
            parts.append(f'<p class="note">{shown} of the step\'s {timeline.ranks_of:,} '
                         "ranks: those its cause names, the run's straggler, its slowest and "
                         "its fastest, and ranks spread evenly over the others.</p>")
    parts += ["<h2>Breakdown over time</h2>", svg.over_time(report), _over_time_note(report),
              _goodput(report),
              "<h2>Collectives</h2>", _collectives(report), _late_table(report),
              "<h2>Memory, overlap and CPU throttling</h2>", _resources(report)]
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            + "\n".join(p for p in parts if p) + f"<script>{SCRIPT}</script></body></html>\n")


def _steady_words(report: Report) -> str:
    """What the per-rank numbers are: the steady state's steps, the warm-up ones apart."""
    warm = [s.step for s in report.warmup_steps]
    if not warm:
        return f"all {report.steady_steps or report.sampled_steps} sampled steps"
    return (f"steady state: {report.steady_steps} sampled steps, without warm-up "
            f"step{'s' if len(warm) > 1 else ''} {_steps(warm)}")


def _steps(steps: list[int], most: int = 8) -> str:
    shown = ", ".join(map(str, steps[:most]))
    return shown + (f" and {len(steps) - most} more" if len(steps) > most else "")


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
    items.extend(throughput_items(report))
    c = report.compile
    items.append(f"compile: {c.compilations} compilations, {fmt_s(c.total_s)}, "
                 f"{c.graph_breaks} graph breaks, {c.recompiles} recompiles")
    if any(report.dropped.values()):
        items.append(f"telemetry dropped: {report.dropped}")
    return "<ul>" + "".join(f"<li>{escape(i)}</li>" for i in items) + "</ul>"


def _legend(report: Report, per_rank: bool = False) -> str:
    """The phases' colours; a click hides that phase in every plot. The per-rank chart's
    legend names the parts it stacks (untimed time split where the run records it)."""
    if per_rank:
        kinds = [(key, label) for key, label in svg.part_keys(report)]
    else:
        kinds = [(k, k.replace("_", " ")) for k in [*report.phases, "collective"]]
    entries = "".join(
        f'<span data-kind="{k}"><i style="background:{svg.COLORS[k]}"></i>'
        f"{escape(label)}</span>" for k, label in kinds if k in svg.COLORS)
    return f'<p class="legend{" per-rank" if per_rank else ""}">{entries}</p>'


def _table(header: list[str], rows: list[list[str]], left: int = 0) -> str:
    def cell(tag: str, i: int, value: str) -> str:
        cls = ' class="l"' if i < left else ""
        return f"<{tag}{cls}>{escape(value)}</{tag}>"
    head = "".join(cell("th", i, h) for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(r)) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _slow_table(report: Report) -> str:
    note = getattr(report, "slow_steps_note", None)
    if not report.slow_steps:
        return f'<p class="note">{escape(f"none listed: {note}" if note else "none")}</p>'
    return _table(["cause", "step", "duration", "rank"],
                  [[s.cause, str(s.step), fmt_s(s.duration_s), str(s.rank)]
                   for s in report.slow_steps], left=1)


def rounded(values: list[float], decimals: int, total: float | None = None) -> list[float]:
    """``values`` rounded to ``decimals`` so that they add up to ``total`` (their sum unless
    given) rounded the same way: largest remainders get the last units, so a table's row of
    parts adds up to the total it shows."""
    scale = 10 ** decimals
    target = round((sum(values) if total is None else total) * scale)
    scaled = [v * scale for v in values]
    floors = [math.floor(v) for v in scaled]
    order = sorted(range(len(values)), key=lambda i: floors[i] - scaled[i])
    for k in range(max(target - sum(floors), 0)):
        floors[order[k % len(order)]] += 1
    return [f / scale for f in floors]


def _per_rank_table(report: Report) -> str:
    """The steady step's disjoint parts per rank, in ms and % of the rank's mean step (a
    row's parts add up to its mean step, its percentages to 100%), then its step time's
    median, p95 and max; the straggler's row marked. A part well above the ranks' median
    for it (by a quarter, and 1% of the step) is highlighted."""
    rows, keys = report.rank_rows, svg.part_keys(report)
    if not rows:
        return "<p>no steps</p>"
    means = [svg.mean_step_s(row, keys) for row in rows]
    # each rank's steady throughput, where the report model has it (read with getattr)
    rates = [name for name in ("samples", "tokens")
             if any(getattr(row, f"{name}_per_s", None) for row in rows)][:1]
    decimals = 1 if max(means) >= 0.01 else 3
    head = ('<tr><th rowspan="2">rank</th><th rowspan="2">steps</th>'
            '<th rowspan="2">mean step<br><span class="sub">= sum of parts</span></th>'
            + "".join(f'<th colspan="2" data-part="{key}">{escape(label)}</th>'
                      for key, label in keys)
            + '<th rowspan="2">median</th><th rowspan="2">p95</th><th rowspan="2">max</th>'
            + "".join(f'<th rowspan="2">{name}/s</th>' for name in rates)
            + "</tr>"
            + "<tr>" + '<th class="sub">ms</th><th class="sub">%</th>' * len(keys) + "</tr>")
    medians = {key: _median([svg.part_s(row, key) for row in rows]) for key, _ in keys}
    body = []
    for row, mean in zip(rows, means, strict=True):
        seconds = [svg.part_s(row, key) for key, _ in keys]
        ms = rounded([v * 1e3 for v in seconds], decimals)
        pct = rounded([100 * v / mean if mean else 0.0 for v in seconds], 1,
                      100.0 if mean else 0.0)
        straggler = row.rank == report.straggler
        cells = [f'<td class="rank">{row.rank}'
                 + ('<span class="badge">straggler</span>' if straggler else "") + "</td>",
                 f"<td>{row.steps}</td>",
                 f'<td class="mean" data-ms="{sum(ms):.{decimals}f}">'
                 f"{sum(ms):.{decimals}f} ms</td>"]
        for (key, label), value, part_ms, part_pct in zip(keys, seconds, ms, pct, strict=True):
            above = _above(value, medians[key], mean)
            cls = ' class="above"' if above else ""
            tip = (f' title="{escape(label)} {value / medians[key]:.1f}x the ranks\' median"'
                   if above and medians[key] else "")
            cells += [f'<td{cls} data-part="{key}" data-ms="{part_ms:.{decimals}f}"{tip}>'
                      f"{part_ms:.{decimals}f}</td>",
                      f'<td{cls} data-part-pct="{key}" data-pct="{part_pct:.1f}">'
                      f"{part_pct:.1f}%</td>"]
        cells += [f"<td>{fmt_s(v)}</td>" for v in (row.median_s, row.p95_s, row.max_s)]
        cells += [f"<td>{_rate(getattr(row, f'{name}_per_s', None))}</td>" for name in rates]
        attrs = (' class="straggler" data-straggler="true"' if straggler else "")
        body.append(f'<tr data-rank="{row.rank}"{attrs}>' + "".join(cells) + "</tr>")
    return (f'<table class="per-rank" data-table="per-rank">{head}{"".join(body)}</table>'
            '<p class="note">Each row is one rank\'s steady steps (warm-up and compile steps '
            "are apart, below). A step's parts are disjoint: they add up to the step, so a "
            "row's parts add up to its mean step and its percentages to 100%. Highlighted: a "
            "part at least a quarter above the ranks' median for it. median, p95, max: of the "
            "rank's steady step times"
            + (f"; {rates[0]}/s: its steady steps' {rates[0]} over their time"
               if rates else "") + ".</p>")


def _rate(value: float | None) -> str:
    return "-" if not value else f"{value:,.1f}" if value < 1e4 else f"{value:,.0f}"


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _above(value: float, median: float, mean_step: float) -> bool:
    return value >= 1.25 * median and value - median >= 0.01 * mean_step > 0


def _straggler_why(report: Report) -> str:
    """Who the straggler is and why it is named, above the per-rank numbers."""
    lines = straggler_lines(report)
    if not lines:
        return ""
    text = escape(lines[0])
    if report.straggler is not None:
        name = f"rank {report.straggler}"
        text = text.replace(escape(name), f"<b>{escape(name)}</b>", 1)
    return (f'<p class="why" data-straggler-rank="{"" if report.straggler is None else report.straggler}">'
            f"{text}. It is marked in red on every per-rank table and chart.</p>"
            if report.straggler is not None else f'<p class="why">{text}.</p>')


def _parts_note(report: Report) -> str:
    """Beneath the stacked chart: how the straggler shows in it. Bars of a synchronous run
    are about as long on every rank (the others wait for the straggler); what differs is
    what the time went to."""
    rows, keys = report.rank_rows, svg.part_keys(report)
    note = ("A bar's length is the rank's mean steady step; its segments are the step's "
            "disjoint parts. ")
    straggler = next((r for r in rows if r.rank == report.straggler), None)
    others = [r for r in rows if r is not straggler]
    if straggler is not None and others:
        diffs = [(svg.part_s(straggler, key) - _median([svg.part_s(r, key) for r in others]),
                  label) for key, label in keys]
        more, less = max(diffs), min(diffs)
        if more[0] > 0:
            note += (f"Rank {straggler.rank} spends {svg.fmt_time(more[0])} a step more in "
                     f"{more[1]} than the other ranks' median")
            note += (f"; the others spend {svg.fmt_time(-less[0])} more in {less[1]}, waiting "
                     "for it, so its bar is no longer than theirs. "
                     if less[0] < 0 and report.straggler_signal == "collective_wait" else ". ")
    return f'<p class="note">{escape(note.strip())}</p>'


def _warmup(report: Report) -> str:
    """The warm-up and compile steps, apart from the steady state."""
    if not report.warmup_steps:
        return ""
    rows = [[str(s.step), fmt_s(s.duration_s), str(s.rank) if s.rank >= 0 else "-", s.cause]
            for s in report.warmup_steps]
    return ("<h2>Warm-up and compile steps, not in the per-rank numbers</h2>"
            + _table(["step", "duration", "rank", "cause"], rows).replace(
                "<table>", '<table data-table="warmup">', 1)
            + '<p class="note">The run\'s first step and every step in which a rank compiled. '
            "They are left out of the per-rank table and charts above, which are the steady "
            f"state's {report.steady_steps} sampled steps.</p>")


def _over_time_note(report: Report) -> str:
    warm = svg.warmup_bins(report)
    steps = [s.step for s in report.warmup_steps]
    text = "Each column: the mean step, in its parts, of a bin of consecutive sampled steps, all ranks. "
    if warm:
        text += (f"Shaded: bins that hold a warm-up or compile step ({_steps(steps)}); their "
                 "columns mix it with the steady steps around it. The axis is the steady "
                 "bins'; a taller column is cut and its height written above it.")
    else:
        text += "A column taller than the axis is cut and its height written above it."
    return f'<p class="note">{escape(text)}</p>'


def throughput_items(report: Report) -> list[str]:
    """Throughput in words: the steady state's where the report model has it, and the whole
    run's (read with getattr: older report models have only ``samples_per_s``)."""
    items = []
    for name, unit in (("samples", "samples/s"), ("tokens", "tokens/s")):
        steady = getattr(report, f"steady_{name}_per_s", None)
        whole = getattr(report, f"run_{name}_per_s", None)
        if steady is None and whole is None and not hasattr(report, f"steady_{name}_per_s"):
            whole = getattr(report, f"{name}_per_s", None)  # an older report model
        def fmt(rate: float) -> str:
            return f"{rate:,.1f}" if rate < 1e4 else f"{rate:,.0f}"

        if steady:
            items.append(f"{fmt(steady)} {unit} in the steady state ({report.steady_steps} "
                         "steps, summed over the ranks)"
                         + (f"; {fmt(whole)} over the whole run, warm-up included"
                            if whole else ""))
        elif whole:
            items.append(f"{fmt(whole)} {unit} over the whole run, warm-up included")
    return items


def _goodput(report: Report) -> str:
    """The goodput section, where the report model has one and the run recorded it (read
    with getattr: the HTML works with report models without it)."""
    goodput = getattr(report, "goodput", None)
    if goodput is None:
        return ""
    lines_of = getattr(terminal, "goodput_lines", None)
    lines = lines_of(report) if lines_of is not None else []
    buckets = svg.goodput_buckets(report)
    if not buckets:
        return ("<h2>Goodput</h2>" + "".join(f'<p class="note">{escape(line)}</p>'
                                             for line in lines)) if lines else ""
    labels = getattr(terminal, "GOODPUT_LABELS", {})
    legend = '<p class="legend static">' + "".join(
        f'<span><i style="background:{svg.GOODPUT_COLORS.get(b, "#444")}"></i>'
        f"{escape(labels.get(b, b.replace('_', ' ')))}</span>" for b in buckets) + "</p>"
    ranks = goodput.ranks if len(goodput.ranks) <= 8 else []
    head = "<tr><th class=\"l\">bucket</th><th>mean rank</th><th>share</th>" + "".join(
        f'<th class="straggler-col" data-straggler="true">rank {r.rank}'
        '<span class="badge">straggler</span></th>' if r.rank == report.straggler
        else f"<th>rank {r.rank}</th>" for r in ranks) + "</tr>"
    wall = goodput.wall_s or 1.0
    body = []
    for bucket in buckets:
        seconds = goodput.buckets_s.get(bucket, 0.0)
        body.append(f'<tr data-bucket="{bucket}"><td class="l"><i class="swatch" style="'
                    f'background:{svg.GOODPUT_COLORS.get(bucket, "#444")}"></i>'
                    f"{escape(labels.get(bucket, bucket.replace('_', ' ')))}</td>"
                    f"<td>{fmt_s(seconds)}</td><td>{seconds / wall:.1%}</td>"
                    + "".join(f"<td>{fmt_s(r.buckets_s.get(bucket))}</td>" for r in ranks)
                    + "</tr>")
    body.append(f'<tr class="total"><td class="l">wall clock</td><td>{fmt_s(goodput.wall_s)}'
                "</td><td>100%</td>" + "".join(f"<td>{fmt_s(r.total_s)}</td>" for r in ranks)
                + "</tr>")
    return ("<h2>Goodput: the run's wall clock, productive time and losses</h2>"
            + "".join(f'<p class="why">{escape(line)}</p>' for line in lines)
            + legend + svg.goodput(report)
            + f'<table data-table="goodput">{head}{"".join(body)}</table>'
            '<p class="note">A rank\'s buckets are disjoint and add up to its time from its '
            "start to its last step's end; the mean rank's, with the time after the last step "
            "and the rest, to the run's wall clock. Productive: the compute parts of steady "
            "steps.</p>")


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
