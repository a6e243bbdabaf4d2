"""The report's plots as inline SVG strings: a Gantt timeline, per-rank box plots, per-rank
stacked parts of the step and the breakdown over time. Every plot is an
``<svg class="plot" data-plot=...>``; every phase mark carries the class ``ph-<phase>`` so the
page's legend can hide and show a phase.

Every axis has round ticks (0, 50, 100 ms, never two ticks at odd values), each labelled
with its unit, and gridlines; the tick marks carry the class ``tick``. On every per-rank
plot the straggler's row is marked (a tinted band, its label in bold red with the word
"straggler", ``data-straggler`` on the row's group) and a key beneath the plot says why it
is named."""

from __future__ import annotations

import math
from collections.abc import Callable
from html import escape

from otel_train.analysis.report_model import RankBreakdown, Report, StepTimeline
from otel_train.analysis.terminal import SPLIT_LABELS, straggler_lines
from otel_train.analysis.traces import PHASES, UNTIMED, UNTIMED_PARTS

COLORS = {
    "data_wait": "#e4572e", "forward": "#17becf", "backward": "#1f77b4",
    "optimizer": "#9467bd", "regions": "#aec7e8", "exposed_comm": "#f2a541",
    "compile": "#7f7f7f",
    "collective": "#2ca02c", "untimed": "#c7c7c7",
    # untimed time's parts, where the run records them (sources/gaps.py)
    "device_wait": "#8c564b", "gpu_outside_phases": "#e377c2", "host_busy": "#bcbd22",
    "not_explained": "#d9d9d9",
}
#: the straggler's marks: its label, band and key
STRAGGLER = "#c0392b"
STRAGGLER_BAND = "#fbe3e0"
WARMUP_BAND = "#fff1c9"
WIDTH, LEFT, RIGHT = 960, 150, 110
PLOT_W = WIDTH - LEFT - RIGHT
#: font sizes: rank labels and keys, tick labels, axis titles
LABEL_PX, TICK_PX, TITLE_PX = 12, 11, 12


# --- the parts of a rank's step --------------------------------------------------------------


def part_keys(report: Report) -> list[tuple[str, str]]:
    """(key, label) of the disjoint parts of a rank's steady step that hold time on some
    rank, in the order every surface shows them: untimed time as its parts (blocked on the
    device, host busy, not explained) once the run records them, else whole."""
    rows = report.rank_rows
    split = any(row.untimed_split_s.get(part, 0.0) > 0 for row in rows for part in UNTIMED_PARTS)
    keys: list[tuple[str, str]] = []
    for phase in PHASES:
        if phase == UNTIMED and split:
            keys += [(key, label) for key, label in SPLIT_LABELS.items()]
        else:
            keys.append((phase, phase.replace("_", " ")))
    return [(key, label) for key, label in keys if any(part_s(row, key) > 0 for row in rows)]


def part_s(row: RankBreakdown, key: str) -> float:
    """A rank's mean seconds a step in one part of ``part_keys``."""
    if key in row.phase_mean_s:
        return row.phase_mean_s[key]
    return row.untimed_split_s.get(key, 0.0)


def mean_step_s(row: RankBreakdown, keys: list[tuple[str, str]]) -> float:
    """A rank's mean step: the sum of its disjoint parts (``part_keys``)."""
    return sum(part_s(row, key) for key, _ in keys)


# --- axes ------------------------------------------------------------------------------------


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering lo..hi:
    at least four ticks, about ``target`` intervals."""
    if not hi > lo:
        hi = lo + (abs(lo) or 1e-3)
    raw = (hi - lo) / target
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw * (1 - 1e-9))
    start = math.floor(lo / step + 1e-9) * step
    count = max(3, math.ceil((hi - start) / step - 1e-9))
    return [round(start + i * step, 12) for i in range(count + 1)]


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit ticks up to ``seconds`` are written in, and its size in seconds."""
    if seconds >= 1:
        return "s", 1.0
    if seconds >= 1e-3:
        return "ms", 1e-3
    return "µs", 1e-6


def tick_label(value: float, unit: str, size: float) -> str:
    number = f"{round(value / size, 9):.6g}"
    return f"{number} {unit}" if unit else number


def _x_axis(y: float, ticks: list[float], x_of: Callable[[float], float], grid_top: float,
            title: str, unit: str = "", size: float = 1.0) -> list[str]:
    """An x axis at ``y``: a gridline up to ``grid_top``, a tick and a label at each tick
    value, and the axis title (with its unit) beneath."""
    out = [f'<g class="axis x-axis">'
           f'<line x1="{LEFT}" y1="{y}" x2="{LEFT + PLOT_W}" y2="{y}" stroke="#888"/>']
    for value in ticks:
        x = x_of(value)
        out += [f'<line class="grid" x1="{x:.1f}" y1="{grid_top}" x2="{x:.1f}" y2="{y}" '
                'stroke="#e6e6e6"/>',
                f'<line class="tick" x1="{x:.1f}" y1="{y}" x2="{x:.1f}" y2="{y + 5}" '
                'stroke="#888"/>',
                _text(x, y + 17, tick_label(value, unit, size), "middle", TICK_PX)]
    out += [_text(LEFT + PLOT_W / 2, y + 34, title, "middle", TITLE_PX, cls="axis-title"),
            "</g>"]
    return out


def _y_axis(x: float, ticks: list[float], y_of: Callable[[float], float], grid_right: float,
            title: str, unit: str, size: float) -> list[str]:
    out = [f'<g class="axis y-axis">'
           f'<line x1="{x}" y1="{y_of(ticks[0]):.1f}" x2="{x}" y2="{y_of(ticks[-1]):.1f}" '
           'stroke="#888"/>']
    for value in ticks:
        y = y_of(value)
        out += [f'<line class="grid" x1="{x}" y1="{y:.1f}" x2="{grid_right}" y2="{y:.1f}" '
                'stroke="#e6e6e6"/>',
                f'<line class="tick" x1="{x - 5}" y1="{y:.1f}" x2="{x}" y2="{y:.1f}" '
                'stroke="#888"/>',
                _text(x - 8, y + 4, tick_label(value, unit, size), "end", TICK_PX)]
    mid = (y_of(ticks[0]) + y_of(ticks[-1])) / 2
    out += [f'<text class="axis-title" x="16" y="{mid:.1f}" font-size="{TITLE_PX}" '
            f'text-anchor="middle" transform="rotate(-90 16 {mid:.1f})">{escape(title)}</text>',
            "</g>"]
    return out


def _time_axis(y: float, lo: float, hi: float, grid_top: float, title: str,
               exact: bool = False) -> tuple[list[str], Callable[[float], float], list[float]]:
    """A seconds axis over lo..hi (widened to round ticks, unless ``exact``: then it ends
    at ``hi`` and the round ticks inside it are drawn) and its value-to-x function."""
    if exact:
        ticks = [t for t in nice_ticks(lo, hi, 6) if t <= hi * (1 + 1e-9)]
        first, last = lo, hi
    else:
        ticks = nice_ticks(lo, hi)
        first, last = ticks[0], ticks[-1]
    unit, size = time_unit(ticks[-1])

    def x_of(value: float) -> float:
        return LEFT + PLOT_W * (value - first) / (last - first)

    return _x_axis(y, ticks, x_of, grid_top, f"{title} ({unit})", unit, size), x_of, ticks


# --- marks -----------------------------------------------------------------------------------


def _svg(kind: str, height: float, body: list[str], label: str) -> str:
    return (f'<svg class="plot" data-plot="{kind}" role="img" aria-label="{escape(label)}" '
            f'xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0f}" '
            f'viewBox="0 0 {WIDTH} {height:.0f}">' + "".join(body) + "</svg>")


def _rect(x: float, y: float, w: float, h: float, kind: str, tip: str) -> str:
    return (f'<rect class="ph-{kind}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0.5):.1f}" '
            f'height="{h:.1f}" fill="{COLORS.get(kind, "#444")}"><title>{escape(tip)}</title>'
            "</rect>")


def _text(x: float, y: float, text: str, anchor: str = "end", size: int = LABEL_PX,
          cls: str = "", weight: str = "", fill: str = "") -> str:
    extra = (f' class="{cls}"' if cls else "") + (f' font-weight="{weight}"' if weight else "")
    extra += f' style="fill:{fill}"' if fill else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
            f"{escape(text)}</text>")


def fmt_time(seconds: float) -> str:
    unit, size = time_unit(seconds)
    return f"{seconds / size:.1f} {unit}" if unit != "s" else f"{seconds:.2f} s"


def _rank_row(report: Report, rank: int, y: float, lane: float) -> tuple[str, list[str]]:
    """The opening tag of a rank's row group, and its label; the straggler's row gets a
    tinted band across the plot, a bold red label and ``data-straggler``."""
    if rank != report.straggler:
        return (f'<g class="rank-row" data-rank="{rank}">',
                [_text(LEFT - 8, y + lane / 2 + 4, f"rank {rank}")])
    return (f'<g class="rank-row straggler" data-rank="{rank}" data-straggler="true">',
            [f'<rect class="straggler-band" x="4" y="{y:.1f}" width="{WIDTH - 8}" '
             f'height="{lane:.1f}" fill="{STRAGGLER_BAND}"/>',
             _text(10, y + lane / 2 + 4, "straggler \u25b6", "start", TICK_PX, weight="bold",
                   fill=STRAGGLER, cls="straggler-label"),
             _text(LEFT - 8, y + lane / 2 + 4, f"rank {rank}", weight="bold", fill=STRAGGLER)])


def straggler_reason(report: Report) -> str:
    """Why the straggler is named (or why none is), in words: the terminal's verdict."""
    lines = straggler_lines(report)
    return lines[0] if lines else ""


def _straggler_key(report: Report, y: float) -> tuple[list[str], float]:
    """The key beneath a per-rank plot: the straggler's mark and why it is named. Returns
    the marks and the height they take."""
    reason = straggler_reason(report)
    if not reason:
        return [], 0.0
    if report.straggler is None:
        return [f'<g class="straggler-key">{_text(LEFT, y + 12, reason, "start", LABEL_PX)}</g>'
                ], 20.0
    return [f'<g class="straggler-key" data-straggler-rank="{report.straggler}">'
            f'<rect x="{LEFT}" y="{y + 2:.1f}" width="14" height="12" fill="{STRAGGLER_BAND}" '
            f'stroke="{STRAGGLER}"/>'
            + _text(LEFT + 20, y + 12, reason, "start", LABEL_PX) + "</g>"], 20.0


# --- the plots -------------------------------------------------------------------------------


def gantt(timeline: StepTimeline, report: Report | None = None) -> str:
    """One step across ranks: phase bars on each rank's lane, collectives beneath them."""
    ranks = sorted({b.rank for b in timeline.bars})
    lane, top = 30, 8
    span = max([b.end_s for b in timeline.bars] + [timeline.duration_s, 1e-9])
    axis_y = top + len(ranks) * lane + 2
    axis, x_of, _ = _time_axis(axis_y, 0.0, span, top, "time since the step's start",
                               exact=True)
    body = list(axis)
    lanes: dict[int, list] = {rank: [] for rank in ranks}
    for bar in timeline.bars:
        lanes[bar.rank].append(bar)
    for row, rank in enumerate(ranks):
        y = top + row * lane
        if report is not None:
            group, label = _rank_row(report, rank, y, lane)
        else:
            group, label = f'<g class="rank-row" data-rank="{rank}">', [
                _text(LEFT - 8, y + lane / 2 + 4, f"rank {rank}")]
        body += [group, *label]
        for bar in lanes[rank]:
            sub = bar.kind == "collective"
            tip = (f"rank {rank} {bar.label}: {fmt_time(bar.end_s - bar.start_s)} "
                   f"at {fmt_time(bar.start_s)}")
            body.append(_rect(x_of(bar.start_s), y + (19 if sub else 3),
                              x_of(bar.end_s) - x_of(bar.start_s), 8 if sub else 15,
                              bar.kind, tip))
        body.append("</g>")
    height = axis_y + 42
    if report is not None:
        key, key_h = _straggler_key(report, height - 4)
        body += key
        height += key_h
    return _svg("gantt", height, body, f"timeline of step {timeline.step}")


def distributions(report: Report) -> str:
    """Per-rank step-time box plots of the steady steps: whiskers min..max, box p25..p75,
    median, p95 tick. The axis spans the ranks' steps from the fastest to a little past the
    slowest p95, so that one slow step cannot squash every box; a whisker past it is cut and
    its maximum written at the plot's edge."""
    rows, lane, top = report.rank_rows, 28, 8
    if not rows:
        return _svg("distributions", 30, [_text(LEFT, 20, "no steps", "start")], "empty")
    lo = min(r.quantiles_s[0] for r in rows)
    p95 = max(r.quantiles_s[4] for r in rows)
    pad = max(p95 - lo, 0.02 * p95, 1e-9) * 0.5
    hi = min(max(r.quantiles_s[5] for r in rows), p95 + pad)
    axis_y = top + len(rows) * lane + 2
    axis, x_of, ticks = _time_axis(axis_y, lo - 0.1 * pad, hi, top,
                                   "step time, steady steps")
    body = list(axis)

    def x(v: float) -> float:
        return x_of(min(max(v, ticks[0]), ticks[-1]))

    for i, row in enumerate(rows):
        group, label = _rank_row(report, row.rank, top + i * lane, lane)
        q = [x(v) for v in row.quantiles_s]
        y = top + i * lane + lane / 2
        color = STRAGGLER if row.rank == report.straggler else "#34495e"
        tip = ("rank {}: min {}, p25 {}, median {}, p75 {}, p95 {}, max {}".format(
            row.rank, *(fmt_time(v) for v in row.quantiles_s)))
        body += [group, *label,
                 f'<line x1="{q[0]:.1f}" y1="{y}" x2="{q[5]:.1f}" y2="{y}" stroke="{color}"/>',
                 f'<rect class="box" x="{q[1]:.1f}" y="{y - 8}" width="{max(q[3] - q[1], 1):.1f}"'
                 f' height="16" fill="#dfe6ee" stroke="{color}"><title>{escape(tip)}</title>'
                 "</rect>",
                 f'<line x1="{q[2]:.1f}" y1="{y - 8}" x2="{q[2]:.1f}" y2="{y + 8}" '
                 f'stroke="{color}" stroke-width="2"/>',
                 f'<line x1="{q[4]:.1f}" y1="{y - 5}" x2="{q[4]:.1f}" y2="{y + 5}" '
                 f'stroke="{color}" stroke-dasharray="2,1"/>',
                 _text(WIDTH - RIGHT + 8, y + 4, f"median {fmt_time(row.median_s)}", "start",
                       TICK_PX)]
        if row.quantiles_s[5] > ticks[-1]:
            body.append(_text(LEFT + PLOT_W - 2, y - 4, f"max {fmt_time(row.quantiles_s[5])} \u2192",
                              "end", TICK_PX))
        body.append("</g>")
    height = axis_y + 42
    key, key_h = _straggler_key(report, height - 4)
    return _svg("distributions", height + key_h, body + key, "step time per rank")


def phase_shares(report: Report) -> str:
    """Per-rank stacked bars of the disjoint parts of the mean steady step: a bar's length
    is the rank's mean step, its segments what the step's time went to."""
    rows, lane, top = report.rank_rows, 26, 8
    if not rows:
        return _svg("phases", 30, [_text(LEFT, 20, "no steps", "start")], "empty")
    keys = part_keys(report)
    span = max([mean_step_s(r, keys) for r in rows] + [1e-9])
    axis_y = top + len(rows) * lane + 2
    axis, x_of, _ = _time_axis(axis_y, 0.0, span, top, "mean time per steady step")
    body = list(axis)
    for i, row in enumerate(rows):
        y = top + i * lane
        group, label = _rank_row(report, row.rank, y, lane)
        body += [group, *label]
        x, mean = float(LEFT), mean_step_s(row, keys) or 1.0
        for key, name in keys:
            seconds = part_s(row, key)
            w = x_of(seconds) - LEFT
            body.append(_rect(x, y + 4, w, lane - 8, key,
                              f"rank {row.rank} {name}: {fmt_time(seconds)} a step, "
                              f"{seconds / mean:.1%}"))
            x += w
        body += [_text(x + 6, y + lane / 2 + 4, fmt_time(mean), "start", TICK_PX,
                       cls="bar-total"), "</g>"]
    height = axis_y + 42
    key, key_h = _straggler_key(report, height - 4)
    return _svg("phases", height + key_h, body + key, "mean step per rank, split into its parts")


def warmup_bins(report: Report) -> list[int]:
    """Indexes of the over-time bins that hold a warm-up or compile step."""
    warm = {s.step for s in report.warmup_steps}
    return [i for i, b in enumerate(report.over_time)
            if any(b.first_step <= s <= b.last_step for s in warm)]


def over_time(report: Report) -> str:
    """Stacked columns of the mean phase times per bin of consecutive steps. Bins holding a
    warm-up or compile step are shaded and labelled, and the axis is the steady bins': it
    stops at three times their median column, so a compile or warm-up bin cannot flatten
    the rest; taller columns are cut and labelled with their height."""
    bins, height, top = report.over_time, 220, 34
    if not bins:
        return _svg("over-time", 40, [_text(LEFT, 20, "no sampled steps", "start")], "empty")
    totals = [sum(b.phase_mean_s.get(p, 0.0) for p in report.phases) for b in bins]
    warm = set(warmup_bins(report))
    steady = [t for i, t in enumerate(totals) if i not in warm] or totals
    span = min(max(steady), 3 * sorted(steady)[len(steady) // 2]) or max(totals) or 1e-9
    y_ticks = nice_ticks(0.0, span)
    unit, size = time_unit(y_ticks[-1])
    base = top + height

    def y_of(value: float) -> float:
        return base - height * value / y_ticks[-1]

    first, last = bins[0].first_step, bins[-1].last_step + 1

    def x_of(step: float) -> float:
        return LEFT + PLOT_W * (step - first) / max(last - first, 1)

    body = _y_axis(LEFT, y_ticks, y_of, LEFT + PLOT_W, f"mean step ({unit})", unit, size)
    # the warm-up bins' shading, consecutive ones merged, with one label each
    runs: list[list[int]] = []
    for i in sorted(warm):
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    for run in runs:
        x0, x1 = x_of(bins[run[0]].first_step), x_of(bins[run[-1]].last_step + 1)
        steps = [s.step for s in report.warmup_steps
                 if bins[run[0]].first_step <= s.step <= bins[run[-1]].last_step]
        body += [f'<g class="warmup-bin" data-steps="{" ".join(map(str, steps))}">'
                 f'<rect x="{x0:.1f}" y="{top - 30}" width="{x1 - x0:.1f}" '
                 f'height="{height + 30}" fill="{WARMUP_BAND}"/>',
                 _text((x0 + x1) / 2, top - 20, "warm-up", "middle", 10, fill="#8a6d00"),
                 "</g>"]
    for i, b in enumerate(bins):
        x0, x1 = x_of(b.first_step), x_of(b.last_step + 1)
        y = base
        for phase in report.phases:
            seconds = b.phase_mean_s.get(phase, 0.0)
            h = min(height * seconds / y_ticks[-1], y - top)
            y -= h
            body.append(_rect(x0 + 1, y, (x1 - x0) * 0.86, h, phase,
                              f"steps {b.first_step}-{b.last_step} {phase}: "
                              f"{fmt_time(seconds)} a step"
                              + (" (holds a warm-up step)" if i in warm else "")))
        if totals[i] > y_ticks[-1]:
            body.append(_text((x0 + x1) / 2, top - 6, fmt_time(totals[i]), "middle", 9,
                              cls="cut"))
    x_ticks = [t for t in nice_ticks(first, last - 1, 6)
               if first <= t <= last - 1 and t == int(t)] or [float(first)]
    body += _x_axis(base, x_ticks, lambda s: x_of(s + 0.5), base,
                    "step (a column: the mean of a bin of consecutive steps)")
    return _svg("over-time", base + 44, body, "phase breakdown over time")


#: the goodput buckets' colours (analysis/goodput.py BUCKETS); productive time green
GOODPUT_COLORS = {
    "productive": "#4daf4a", "startup": "#a6cee3", "compile": "#7f7f7f",
    "warmup": "#cab2d6", "data_wait": "#e4572e", "exposed_comm": "#f2a541",
    "device_wait": "#8c564b", "outside_phases": "#d9d9d9", "between_steps": "#fb9a99",
    "after_last_step": "#6a3d9a", "other": "#eeeeee",
}
#: per-rank goodput bars drawn, at most (the mean rank's always)
GOODPUT_RANK_ROWS = 16


def goodput_buckets(report: Report) -> list[str]:
    """The goodput buckets that hold time, in the report model's order; [] without goodput
    (a report model without the section, or a run that did not record it)."""
    g = getattr(report, "goodput", None)
    if g is None or getattr(g, "source", None) is None:
        return []
    ranks = getattr(g, "ranks", [])
    return [b for b in g.buckets_s
            if g.buckets_s[b] > 0 or any(r.buckets_s.get(b, 0.0) > 0 for r in ranks)]


def goodput(report: Report) -> str:
    """The run's wall clock per rank (and the mean rank's), stacked by goodput bucket:
    productive time first, then the named losses."""
    buckets = goodput_buckets(report)
    if not buckets:
        return ""
    g = report.goodput  # type: ignore[attr-defined]
    rows: list[tuple[int | None, dict[str, float], float]] = [(None, g.buckets_s, g.wall_s)]
    if len(g.ranks) <= GOODPUT_RANK_ROWS:
        rows += [(r.rank, r.buckets_s, r.total_s) for r in g.ranks]
    lane, top = 26, 8
    span = max([sum(b.values()) for _, b, _ in rows] + [1e-9])
    axis_y = top + len(rows) * lane + 2
    axis, x_of, _ = _time_axis(axis_y, 0.0, span, top, "time from the run's start")
    body = list(axis)
    for i, (rank, seconds, total) in enumerate(rows):
        y = top + i * lane
        if rank is None:
            body += ['<g class="rank-row mean-row">',
                     _text(LEFT - 8, y + lane / 2 + 4, "mean rank", weight="bold")]
        else:
            group, label = _rank_row(report, rank, y, lane)
            body += [group, *label]
        x = float(LEFT)
        for bucket in buckets:
            value = seconds.get(bucket, 0.0)
            w = x_of(value) - LEFT
            if value > 0:
                tip = f"{bucket.replace('_', ' ')}: {fmt_time(value)}, {value / (total or 1):.1%}"
                body.append(
                    f'<rect class="gp-{bucket}" x="{x:.1f}" y="{y + 4:.1f}" '
                    f'width="{max(w, 0.5):.1f}" height="{lane - 8}" '
                    f'fill="{GOODPUT_COLORS.get(bucket, "#444")}"><title>{escape(tip)}</title>'
                    "</rect>")
            x += w
        productive = seconds.get("productive", 0.0) / (total or 1)
        body += [_text(x + 6, y + lane / 2 + 4, f"{productive:.0%} productive", "start",
                       TICK_PX), "</g>"]
    height = axis_y + 42
    key, key_h = _straggler_key(report, height - 4)
    return _svg("goodput", height + key_h, body + key, "goodput: the wall clock per rank")
