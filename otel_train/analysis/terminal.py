"""The report as rich tables in the terminal, fitted to its width.

rich squeezes a table wider than the terminal by cutting headers and cells (``ste…``,
``med…``), which is unreadable exactly where people paste reports: an 80-column terminal or
a file (rich assumes 80 columns when not writing to a terminal). So each table is printed in
the first of its layouts that cuts nothing, and otherwise as one block per row, which wraps
at spaces and never cuts.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from otel_train import semconv as sc
from otel_train.analysis.arrivals import LATE_STEP_SHARE
from otel_train.analysis.goodput import BUCKETS
from otel_train.analysis.report_model import RankBreakdown, Report
from otel_train.analysis.traces import NOT_EXPLAINED, UNTIMED, UNTIMED_PARTS

#: what rich draws where a header or cell did not fit its column
CUT_MARK = "…"


def fmt_s(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds == 0:
        return "0 s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_bytes(value: float | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{value:.0f} B"
        value /= 1000
    return "-"


def render_terminal(report: Report, console: Console | None = None) -> None:
    console = console or Console()
    console.print(_header(report))
    if report.rank_rows:
        # one wide table; else step times and phase shares apart; else one block per rank
        print_fitted(console, [_phase_table(report)],
                     [_step_time_table(report), _phase_share_table(report)])
    for table in (_slow_table(report), _late_table(report), _collective_table(report),
                  _resource_table(report)):
        if table.row_count:
            print_fitted(console, [table])
    if report.slow_steps_note and not report.slow_steps:
        console.print(f"slowest steps: none listed: {escape(report.slow_steps_note)}")
    print_goodput(console, report)
    console.print(_compile_line(report))
    if any(report.dropped.values()):
        console.print(f"[bold red]telemetry dropped[/]: {report.dropped}")


# --- fitting the terminal --------------------------------------------------------------------


def print_fitted(console: Console, *layouts: Sequence[Table]) -> None:
    """Print the first layout (a sequence of tables) in which no table is cut at the
    console's width; when every one is, the first layout's tables one block per row."""
    for tables in layouts:
        if not any(is_cut(console, table) for table in tables):
            for table in tables:
                console.print(table)
            return
    for table in layouts[0]:
        console.print(vertical(table))


def is_cut(console: Console, table: Table) -> bool:
    """Whether rich would cut a header or cell of ``table`` at ``console``'s width."""
    scratch = Console(file=io.StringIO(), width=console.width, color_system=None,
                      legacy_windows=False)
    scratch.print(table)
    return CUT_MARK in scratch.file.getvalue()  # type: ignore[attr-defined]


def vertical(table: Table) -> RenderableType:
    """``table`` as one block per row: the first cell as a label, then "header value" pairs
    that wrap at spaces, for terminals too narrow for its columns."""
    headers = [_plain(column.header) for column in table.columns]
    cells = [[_text(cell) for cell in column.cells] for column in table.columns]
    blocks: list[RenderableType] = []
    if table.title:
        blocks.append(Text(_plain(table.title), style="bold"))
    for index, row in enumerate(table.rows):
        label = Text(f"{headers[0]} ", style=row.style or "bold")
        label.append_text(cells[0][index])
        pairs = Text("; ").join(
            Text(f"{header} ").append_text(column[index])
            for header, column in zip(headers[1:], cells[1:]) if column[index].plain)
        blocks += [label, Padding(pairs, (0, 0, 0, 2), expand=False)]
    return Group(*blocks)


def _text(cell: RenderableType) -> Text:
    if isinstance(cell, Text):
        return cell
    return Text.from_markup(str(cell)) if isinstance(cell, str) else Text(str(cell))


def _plain(value: RenderableType) -> str:
    return _text(value).plain.replace("\n", " ")


# --- the tables ------------------------------------------------------------------------------


def _header(report: Report) -> str:
    trained = f" of {report.trained_steps} trained" if report.trained_steps else ""
    ranks = "rank" if report.world_size == 1 else "ranks"
    lines = [f"[bold]run {report.run_id}[/]: {report.world_size} {ranks}, "
             f"{report.sampled_steps} sampled steps{trained}, wall {fmt_s(report.wall_s)}"]
    for fate in report.rank_fates:
        lines.append(f"[bold red]{escape(fate.sentence)}[/]")
    if report.unreadable_ranks:
        lines.append(f"[bold red]ranks whose traces could not be read: "
                     f"{report.unreadable_ranks}[/] (their files are damaged or truncated: "
                     "see the warnings above)")
    if report.missing_ranks:
        lines.append(f"[bold red]ranks that sent no telemetry: {report.missing_ranks}[/] "
                     f"(of {report.world_size}; their instrumentation did not start or "
                     "their export failed: see their stderr)")
    lines.extend(warmup_lines(report))
    lines.extend(straggler_lines(report, bold=True))
    lines.extend(arrival_lines(report, bold=True))
    lines.extend(throughput_lines(report))
    return "\n".join(lines)


def _rate(samples: float | None, tokens: float | None) -> str:
    text = f"{samples:,.1f} samples/s" if samples else ""
    if tokens:
        text += (", " if text else "") + f"{tokens:,.0f} tokens/s"
    return text


def throughput_lines(report: Report) -> list[str]:
    """The steady-state throughput, as users quote it, and the whole run's (terminal and
    HTML)."""
    steady = _rate(report.steady_samples_per_s, report.steady_tokens_per_s)
    run = _rate(report.run_samples_per_s, report.run_tokens_per_s)
    if steady:
        ranks = len([r for r in report.rank_rows if r.samples_per_s or r.tokens_per_s])
        text = (f"throughput: {steady} in the steady state ({report.steady_steps} steps, "
                f"summed over {ranks} rank{'s' if ranks != 1 else ''})")
        return [text + (f"; whole run, warm-up included: {run}" if run else "")]
    return [f"throughput (whole run, warm-up included): {run}"] if run else []


PHASE_TITLE = ("Where the step time went, per rank, in the steady state: mean ms per "
               "sampled step, share")


def warmup_lines(report: Report) -> list[str]:
    """The warm-up and compile steps, apart from the steady state the tables show."""
    if not report.warmup_steps:
        return []
    parts = []
    for slow in report.warmup_steps:
        where = slow.segment or slow.phase.replace("_", " ")
        parts.append(f"step {slow.step} {fmt_s(slow.duration_s)} (rank {slow.rank} {where} "
                     f"{fmt_s(slow.phase_s)})" if slow.rank >= 0 else
                     f"step {slow.step} {fmt_s(slow.duration_s)}")
    return [f"warm-up and compile steps, apart from the steady state "
            f"({report.steady_steps} steps): " + "; ".join(parts)]


def _phase_table(report: Report) -> Table:
    return _per_rank_table(report, PHASE_TITLE, times=True, phases=True)


def _step_time_table(report: Report) -> Table:
    return _per_rank_table(report, "Step time per rank", times=True, phases=False)


def _phase_share_table(report: Report) -> Table:
    return _per_rank_table(report, PHASE_TITLE, times=False, phases=True)


#: the parts of untimed time, as the per-rank tables name them
SPLIT_LABELS = {"device_wait": "blocked on device",
                "gpu_outside_phases": "GPU work outside phases", "host_busy": "host busy",
                NOT_EXPLAINED: "not explained"}


#: a column no rank spends this long in a steady step is left out of the per-rank tables:
#: it would read 0.0 ms (the steady rows' parts still add up to the step without it)
MIN_COLUMN_S = 5e-5


def phase_columns(report: Report) -> list[tuple[str, str, str]]:
    """(header, "phase" or "split", key) of the per-rank tables' phase columns: untimed time
    shown as its parts (blocked on the device, host busy, not explained) once a run records
    them (sources/gaps.py), else whole; a part no rank holds ``MIN_COLUMN_S`` of in a
    steady step (compile, once warm-up is apart) left out."""
    split = any(row.untimed_split_s.get(part, 0.0) > 0 for row in report.rank_rows
                for part in UNTIMED_PARTS)
    columns = []
    for phase in report.phases:
        if phase == UNTIMED and split:
            columns += [(label, "split", key) for key, label in SPLIT_LABELS.items()]
        else:
            columns.append((phase.replace("_", " "), "phase", phase))
    return [(header, kind, key) for header, kind, key in columns
            if any(column_s(row, kind, key) >= MIN_COLUMN_S for row in report.rank_rows)]


def column_s(row: RankBreakdown, kind: str, key: str) -> float:
    return (row.untimed_split_s if kind == "split" else row.phase_mean_s).get(key, 0.0)


def step_mean_s(row: RankBreakdown) -> float:
    """The rank's mean step as the per-rank tables show it: the sum of its columns (the
    step's parts, disjoint, which add up to the step), so that the shares add up to 100%."""
    return sum(row.phase_mean_s.values())


#: the per-rank tables show every rank of a run of up to this many ranks; of a larger run,
#: the ranks that stand out (a table of 16,384 rows is read by no one, and takes rich minutes)
TERMINAL_RANKS = 32
SLOWEST_SHOWN, FASTEST_SHOWN = 20, 5


def shown_rank_rows(report: Report) -> tuple[list[RankBreakdown], str | None]:
    """The per-rank rows the terminal shows, in rank order, and what a table of fewer than
    every rank says of them (None where it shows every rank): of a run of more than
    ``TERMINAL_RANKS`` ranks, the straggler, the ``SLOWEST_SHOWN`` slowest by mean step,
    the median rank and the ``FASTEST_SHOWN`` fastest."""
    rows = report.rank_rows
    if len(rows) <= TERMINAL_RANKS:
        return rows, None
    by_mean = sorted(rows, key=lambda r: (-step_mean_s(r), r.rank))
    picked = by_mean[:SLOWEST_SHOWN] + [by_mean[len(by_mean) // 2]] + by_mean[-FASTEST_SHOWN:]
    picked += [r for r in rows if r.rank == report.straggler]
    shown = sorted({r.rank: r for r in picked}.values(), key=lambda r: r.rank)
    straggler = ", the straggler (red)" if report.straggler is not None else ""
    return shown, (f"{len(shown)} of {len(rows):,} ranks: the {SLOWEST_SHOWN} slowest by mean "
                   f"step, the median, the {FASTEST_SHOWN} fastest{straggler}; every rank: "
                   "--json or --html")


def _per_rank_table(report: Report, title: str, times: bool, phases: bool) -> Table:
    rows, caption = shown_rank_rows(report)
    table = Table(title=title, caption=caption)
    columns = phase_columns(report) if phases else []
    headers = ["rank"] + (["steps", "mean", "median", "p95", "max"] if times else [])
    headers += [header for header, _, _ in columns]
    for header in headers:
        table.add_column(header, justify="right")
    for row in rows:
        cells = [str(row.rank)]
        if times:
            cells += [str(row.steps), fmt_s(step_mean_s(row)), fmt_s(row.median_s),
                      fmt_s(row.p95_s), fmt_s(row.max_s)]
        if phases:
            step_mean = step_mean_s(row) or 1.0
            cells += [f"{column_s(row, kind, key) * 1e3:.1f} "
                      f"{column_s(row, kind, key) / step_mean:.0%}" for _, kind, key in columns]
        style = "bold red" if row.rank == report.straggler else None
        table.add_row(*cells, style=style)
    return table


def _slow_table(report: Report) -> Table:
    table = Table(title="Slowest steps and what made each slow")
    for column in ("step", "duration", "rank"):
        table.add_column(column, justify="right")
    table.add_column("cause")
    for slow in report.slow_steps:
        table.add_row(str(slow.step), fmt_s(slow.duration_s), str(slow.rank), slow.cause)
    return table


def _late_table(report: Report) -> Table:
    table = Table(title="Who the slowest steps' collectives waited for (arrival times)")
    for column in ("step", "late rank", "late by"):
        table.add_column(column, justify="right")
    table.add_column("its latest arrival, after the others")
    for row in late_rows(report):
        table.add_row(*row)
    return table


def late_rows(report: Report) -> list[list[str]]:
    """(step, late rank, late by, its latest arrival) of each slowest step whose
    collectives were matched across ranks (terminal and HTML)."""
    return [[str(s.step), str(late.rank), fmt_s(late.lag_s), late.worst.at]
            for s in report.slow_steps if (late := s.late_arrival) is not None]


def _collective_table(report: Report) -> Table:
    table = Table(title="Collectives")
    for column in ("op", "count", "total", "bytes", "mean bus bw", "max bus bw"):
        table.add_column(column, justify="right")
    for row in report.collectives:
        bw = [f"{v:.1f} GB/s" if v is not None else "-"
              for v in (row.mean_bus_bw_gbps, row.max_bus_bw_gbps)]
        table.add_row(row.op, str(row.count), fmt_s(row.total_s), fmt_bytes(row.bytes), *bw)
    return table


def _resource_table(report: Report) -> Table:
    rows, caption = report.resources, None
    if len(rows) > TERMINAL_RANKS:  # the per-rank tables' ranks, and the most memory
        ranks = {r.rank for r in shown_rank_rows(report)[0]}
        most = sorted(rows, key=lambda r: -(r.memory_peak_bytes or 0))[:FASTEST_SHOWN]
        ranks |= {r.rank for r in most}
        rows = [r for r in rows if r.rank in ranks]
        caption = (f"{len(rows)} of {len(report.resources):,} ranks: those above, and the "
                   f"{FASTEST_SHOWN} with the highest peak allocated; every rank: --json or "
                   "--html")
    table = Table(title="Memory, overlap and CPU throttling per rank", caption=caption)
    for column in ("rank", "peak allocated", "reserved", "comm overlap", "cpu throttled"):
        table.add_column(column, justify="right")
    for row in rows:
        overlap = "-" if row.comm_overlap is None else f"{row.comm_overlap:.0%}"
        table.add_row(str(row.rank), fmt_bytes(row.memory_peak_bytes),
                      fmt_bytes(row.memory_reserved_bytes), overlap, fmt_s(row.cpu_throttled_s))
    return table


def _compile_line(report: Report) -> str:
    c = report.compile
    if not c.compilations and not c.recompiles:
        return "compile: none recorded"
    reasons = ", ".join(f"{reason} x{n}" for reason, n in sorted(c.reasons.items()))
    return (f"compile (all ranks): {c.compilations} compilations, {fmt_s(c.total_s)}, "
            f"{c.graph_breaks} graph breaks, {c.recompiles} recompiles"
            + (f"; reasons: {reasons}" if reasons else ""))


def straggler_lines(report: Report, bold: bool = False) -> list[str]:
    """The straggler verdict in words (terminal and HTML)."""
    b, e = ("[bold]", "[/]") if bold else ("", "")
    wait = report.straggler_wait_share
    throttled = (f"; cause: its cgroup's CPU quota throttled it "
                 f"{report.straggler_throttled_s:.3g} s a step"
                 if report.straggler_throttled_s else "")
    if report.straggler is not None and report.straggler_signal == "collective_wait":
        busy = (f"; its own work is {report.straggler_busy_ratio:.2f}x the median rank's"
                if report.straggler_busy_ratio else "")
        return [f"straggler: {b}rank {report.straggler}{e}: the other ranks wait for it in "
                f"collectives {wait:.0%} of a step{busy}{throttled}"]
    if report.straggler is not None and report.straggler_signal == "cpu_throttled":
        return [f"straggler: {b}rank {report.straggler}{e}: its cgroup's CPU quota throttled "
                f"it {report.straggler_throttled_s or 0:.3g} s a step"]
    if report.straggler is not None and report.straggler_busy_ratio:
        return [f"straggler: {b}rank {report.straggler}{e}, busy "
                f"{report.straggler_busy_ratio:.2f}x the median rank, slowest in "
                f"{report.straggler_slowest_share or 0:.0%} of steps{throttled}"]
    if report.straggler_busy_ratio or wait is not None:
        parts = []
        if report.straggler_busy_ratio:
            parts.append(f"the busiest rank is {report.straggler_busy_ratio:.2f}x the median rank")
        if wait is not None:
            parts.append(f"no rank is waited for over {max(wait, 0):.0%} of a step "
                         f"(rank {report.straggler_wait_rank} most)")
        return ["no straggler: " + "; ".join(parts)]
    return []


def arrival_lines(report: Report, bold: bool = False) -> list[str]:
    """The late-arrival verdict in words (terminal and HTML): who arrived last at the
    collectives, matched across ranks by sequence number, and what could not be compared."""
    b, e = ("[bold]", "[/]") if bold else ("", "")
    a = report.arrivals
    if report.world_size <= 1:  # one rank: nobody to arrive before or after
        return []
    skipped = [f"{n} {what}" for n, what in (
        (a.unmatched, "seen on only some ranks"),
        (a.mismatched, "whose sequence numbers did not line up across ranks"),
        (a.summarised, "in summary spans (OTEL_TRAIN_COLLECTIVE_SPANS)")) if n]
    not_compared = f" ({', '.join(skipped)}: not compared)" if skipped else ""
    if not a.matched:
        return [f"late arrivals: not known{not_compared}"] if skipped else []
    total = next((r.total_lag_s for r in a.ranks if r.rank == a.late_rank), 0.0)
    if a.late_rank is None:
        verdict = "no rank arrived late"
    elif a.late_steps:
        verdict = (f"the others waited most for {b}rank {a.late_rank}{e} ({fmt_s(total)} in "
                   f"{a.steps} sampled steps): by {LATE_STEP_SHARE:.0%} of a step or more in "
                   f"{a.late_steps} of them, a median {fmt_s(a.median_lag_s)}")
    else:
        verdict = (f"the others waited most for {b}rank {a.late_rank}{e} ({fmt_s(total)} in "
                   f"{a.steps} sampled steps), in none by {LATE_STEP_SHARE:.0%} of a step")
    worst = (f"; worst: {a.worst.sentence} (step {a.worst.step})"
             if a.worst is not None else "")
    return [f"late arrivals ({a.matched} collectives matched across ranks): "
            f"{verdict}{worst}{not_compared}"]


# --- goodput ---------------------------------------------------------------------------------

#: the goodput buckets as the report names them
GOODPUT_LABELS = {
    "productive": "productive (steady steps' compute)",
    "startup": "startup (to the first step)",
    "compile": "compile",
    "warmup": "warm-up steps (less compile)",
    "data_wait": "data wait",
    "exposed_comm": "exposed communication",
    "device_wait": "blocked on device",
    "checkpoint": "checkpoint (regions named checkpoint)",
    "outside_phases": "outside the phases (host work, GPU work queued there, other regions, "
                      "not explained)",
    "between_steps": "between steps (eval, checkpoints)",
    "after_last_step": "after the last step (teardown)",
    "restart": "restart (between attempts under the run id)",
    "other": "other (ranks' start and end apart)",
}
#: ranks shown as columns of the goodput table, at most
GOODPUT_RANK_COLUMNS = 8


def goodput_lines(report: Report) -> list[str]:
    """The goodput verdict in words (terminal and HTML)."""
    g = report.goodput
    if g.source is None:
        return [f"goodput: {g.note}"] if g.note else []
    where = (sc.METRIC_GOODPUT_TIME if g.source == "metrics"
             else "derived from the run and step spans")
    text = (f"goodput: {g.ratio or 0:.0%} of the run's wall clock {fmt_s(g.wall_s)} was "
            f"productive ({fmt_s(g.productive_s)} of steady steps' compute, mean over "
            f"{len(g.ranks)} rank{'s' if len(g.ranks) != 1 else ''}; {where})")
    lines = [text]
    throttled = [r for r in g.ranks if r.cpu_throttled_s]
    if throttled:
        most = max(throttled, key=lambda r: r.cpu_throttled_s or 0.0)
        lines.append(f"cause beside the buckets: CPU throttling by the cgroup's quota, "
                     f"{fmt_s(g.cpu_throttled_s)} a rank on average, rank {most.rank} the most "
                     f"({fmt_s(most.cpu_throttled_s)}); it lies inside the buckets above, not "
                     "added to them")
    if g.note:
        lines.append(f"goodput: {g.note}")
    return lines


def print_goodput(console: Console, report: Report) -> None:
    g = report.goodput
    lines = goodput_lines(report)
    if g.source is not None:
        print_fitted(console, [_goodput_table(report, per_rank=True)],
                     [_goodput_table(report, per_rank=False)])
    for line in lines:
        console.print(escape(line))


def _goodput_table(report: Report, per_rank: bool) -> Table:
    g = report.goodput
    table = Table(title="Goodput: the run's wall clock, productive time and losses "
                  "(mean over ranks)")
    table.add_column("bucket", justify="left")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    ranks = g.ranks if per_rank and len(g.ranks) <= GOODPUT_RANK_COLUMNS else []
    for rank in ranks:
        table.add_column(f"rank {rank.rank}", justify="right")
    for bucket in BUCKETS:
        seconds = g.buckets_s.get(bucket, 0.0)
        if not seconds and bucket != "productive":
            continue
        share = f"{seconds / g.wall_s:.0%}" if g.wall_s else "-"
        cells = [fmt_s(r.buckets_s[bucket]) if bucket in r.buckets_s else "" for r in ranks]
        table.add_row(GOODPUT_LABELS.get(bucket, bucket), fmt_s(seconds), share, *cells)
    table.add_row("wall clock", fmt_s(g.wall_s), "100%",
                  *[fmt_s(r.total_s) for r in ranks], style="bold")
    return table
