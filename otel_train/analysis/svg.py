"""The report's plots as inline SVG strings: a Gantt timeline, per-rank box plots and the
breakdown over time. Every plot is an ``<svg class="plot" data-plot=...>``; every phase mark
carries the class ``ph-<phase>`` so the page's legend can hide and show a phase."""

from __future__ import annotations

from html import escape

from otel_train.analysis.report_model import Report, StepTimeline

COLORS = {
    "data_wait": "#e4572e", "forward": "#17becf", "backward": "#1f77b4",
    "optimizer": "#9467bd", "exposed_comm": "#f2a541", "compile": "#7f7f7f",
    "collective": "#2ca02c", "untimed": "#c7c7c7",
}
WIDTH, LEFT, RIGHT = 960, 70, 20
PLOT_W = WIDTH - LEFT - RIGHT


def _svg(kind: str, height: int, body: list[str], label: str) -> str:
    return (f'<svg class="plot" data-plot="{kind}" role="img" aria-label="{escape(label)}" '
            f'xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
            f'viewBox="0 0 {WIDTH} {height}">' + "".join(body) + "</svg>")


def _rect(x: float, y: float, w: float, h: float, kind: str, tip: str) -> str:
    return (f'<rect class="ph-{kind}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" '
            f'height="{h:.1f}" fill="{COLORS.get(kind, "#444")}"><title>{escape(tip)}</title>'
            "</rect>")


def _text(x: float, y: float, text: str, anchor: str = "end", size: int = 11) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}">'
            f"{escape(text)}</text>")


def _axis(y: float, max_value: float, unit_s: bool = True, ticks: int = 5) -> list[str]:
    out = [f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT_W}" y2="{y}" stroke="#999"/>']
    for i in range(ticks + 1):
        value = max_value * i / ticks
        x = LEFT + PLOT_W * i / ticks
        label = f"{value:.3g} s" if unit_s else f"{value:.3g}"
        out += [f'<line x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 4}" stroke="#999"/>',
                _text(x, y + 16, label, "middle", 10)]
    return out


def gantt(timeline: StepTimeline) -> str:
    """One step across ranks: phase bars on each rank's lane, collectives beneath them."""
    ranks = sorted({b.rank for b in timeline.bars})
    lane, top = 30, 10
    span = max([b.end_s for b in timeline.bars] + [timeline.duration_s, 1e-9])
    scale = PLOT_W / span
    body = []
    for row, rank in enumerate(ranks):
        y = top + row * lane
        body.append(_text(LEFT - 6, y + 15, f"rank {rank}"))
        for bar in (b for b in timeline.bars if b.rank == rank):
            sub = bar.kind == "collective"
            tip = f"rank {rank} {bar.label}: {bar.end_s - bar.start_s:.4f} s at {bar.start_s:.4f} s"
            body.append(_rect(LEFT + bar.start_s * scale, y + (18 if sub else 2),
                              (bar.end_s - bar.start_s) * scale, 8 if sub else 15, bar.kind, tip))
    height = top + len(ranks) * lane + 24
    body += _axis(top + len(ranks) * lane, span)
    return _svg("gantt", height, body, f"timeline of step {timeline.step}")


def distributions(report: Report) -> str:
    """Per-rank step-time box plots: whiskers min..max, box p25..p75, median, p95 tick."""
    rows, lane, top = report.rank_rows, 26, 10
    # the axis ends past the p95s: a single compile step must not squash every box
    span = max([r.quantiles_s[4] * 1.5 for r in rows] + [1e-9])
    body = []
    for i, row in enumerate(rows):
        q = [LEFT + PLOT_W * min(v, span) / span for v in row.quantiles_s]
        y = top + i * lane + 12
        color = "#c0392b" if row.rank == report.straggler else "#34495e"
        tip = "rank {}: min {:.4f}, p25 {:.4f}, median {:.4f}, p75 {:.4f}, p95 {:.4f}, " \
              "max {:.4f} s".format(row.rank, *row.quantiles_s)
        body += [_text(LEFT - 6, y + 4, f"rank {row.rank}"),
                 f'<line x1="{q[0]:.1f}" y1="{y}" x2="{q[5]:.1f}" y2="{y}" stroke="{color}"/>',
                 f'<rect class="box" x="{q[1]:.1f}" y="{y - 8}" width="{max(q[3] - q[1], 1):.1f}"'
                 f' height="16" fill="#dfe6ee" stroke="{color}"><title>{escape(tip)}</title></rect>',
                 f'<line x1="{q[2]:.1f}" y1="{y - 8}" x2="{q[2]:.1f}" y2="{y + 8}" '
                 f'stroke="{color}" stroke-width="2"/>',
                 f'<line x1="{q[4]:.1f}" y1="{y - 5}" x2="{q[4]:.1f}" y2="{y + 5}" '
                 f'stroke="{color}" stroke-dasharray="2,1"/>']
        if row.quantiles_s[5] > span:
            body.append(_text(LEFT + PLOT_W, y - 3, f"max {row.quantiles_s[5]:.3g} s", "end", 9))
    body += _axis(top + len(rows) * lane, span)
    return _svg("distributions", top + len(rows) * lane + 24, body, "step time per rank")


def phase_shares(report: Report) -> str:
    """Per-rank stacked bars of the mean time in each phase."""
    rows, lane, top = report.rank_rows, 24, 10
    span = max([sum(r.phase_mean_s[p] for p in report.phases) for r in rows] + [1e-9])
    body = []
    for i, row in enumerate(rows):
        y, x = top + i * lane, float(LEFT)
        body.append(_text(LEFT - 6, y + 14, f"rank {row.rank}"))
        for phase in report.phases:
            w = PLOT_W * row.phase_mean_s[phase] / span
            body.append(_rect(x, y + 2, w, 16, phase,
                              f"rank {row.rank} {phase}: {row.phase_mean_s[phase]:.4f} s/step"))
            x += w
    body += _axis(top + len(rows) * lane, span)
    return _svg("phases", top + len(rows) * lane + 24, body, "mean phase time per rank")


def over_time(report: Report) -> str:
    """Stacked columns of the mean phase times per bin of consecutive steps. The axis stops at
    three times the median column, so one compile or warm-up bin cannot flatten the rest;
    taller columns are cut and labelled with their height."""
    bins, height, top = report.over_time, 220, 14
    if not bins:
        return _svg("over-time", 40, [_text(LEFT, 20, "no sampled steps", "start")], "empty")
    totals = [sum(b.phase_mean_s[p] for p in report.phases) for b in bins]
    span = min(max(totals), 3 * sorted(totals)[len(totals) // 2]) or max(totals) or 1e-9
    width = PLOT_W / len(bins)
    body = [_text(LEFT - 6, top + 10, f"{span:.3g} s"), _text(LEFT - 6, top + height, "0 s")]
    for i, b in enumerate(bins):
        y = top + height
        for phase in report.phases:
            h = min(height * b.phase_mean_s[phase] / span, y - top)
            y -= h
            body.append(_rect(LEFT + i * width, y, width * 0.9, h, phase,
                              f"steps {b.first_step}-{b.last_step} {phase}: "
                              f"{b.phase_mean_s[phase]:.4f} s/step"))
        if totals[i] > span:
            body.append(_text(LEFT + (i + 0.45) * width, top - 3, f"{totals[i]:.3g} s",
                              "middle", 9))
    first, last = bins[0].first_step, bins[-1].last_step
    body += [_text(LEFT, top + height + 16, f"step {first}", "start", 10),
             _text(LEFT + PLOT_W, top + height + 16, f"step {last}", "end", 10)]
    return _svg("over-time", top + height + 24, body, "phase breakdown over time")
