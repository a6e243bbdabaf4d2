"""The report as rich tables in the terminal."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from otel_train.analysis.model import Report


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
    for table in (_phase_table(report), _slow_table(report), _collective_table(report),
                  _resource_table(report)):
        if table.row_count:
            console.print(table)
    console.print(_compile_line(report))
    if any(report.dropped.values()):
        console.print(f"[bold red]telemetry dropped[/]: {report.dropped}")


def _header(report: Report) -> str:
    trained = f" of {report.trained_steps} trained" if report.trained_steps else ""
    lines = [f"[bold]run {report.run_id}[/]: {report.world_size} ranks, "
             f"{report.sampled_steps} sampled steps{trained}, wall {fmt_s(report.wall_s)}"]
    lines.extend(straggler_lines(report, bold=True))
    if report.samples_per_s:
        tokens = f", {report.tokens_per_s:,.0f} tokens/s" if report.tokens_per_s else ""
        lines.append(f"throughput: {report.samples_per_s:,.1f} samples/s{tokens}")
    return "\n".join(lines)


def _phase_table(report: Report) -> Table:
    table = Table(title="Where the step time went, per rank: mean ms per sampled step, share")
    for column in ("rank", "steps", "median", "p95", "max"):
        table.add_column(column, justify="right")
    for phase in report.phases:
        table.add_column(phase.replace("_", " "), justify="right")
    for row in report.rank_rows:
        step_mean = sum(row.phase_mean_s.values()) or 1.0
        cells = [f"{row.phase_mean_s[p] * 1e3:.1f} {row.phase_mean_s[p] / step_mean:.0%}"
                 for p in report.phases]
        style = "bold red" if row.rank == report.straggler else None
        table.add_row(str(row.rank), str(row.steps), fmt_s(row.median_s), fmt_s(row.p95_s),
                      fmt_s(row.max_s), *cells, style=style)
    return table


def _slow_table(report: Report) -> Table:
    table = Table(title="Slowest steps and what made each slow")
    for column in ("step", "duration", "rank"):
        table.add_column(column, justify="right")
    table.add_column("cause")
    for slow in report.slow_steps:
        table.add_row(str(slow.step), fmt_s(slow.duration_s), str(slow.rank), slow.cause)
    return table


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
    table = Table(title="Memory, overlap and CPU throttling per rank")
    for column in ("rank", "peak allocated", "reserved", "comm overlap", "cpu throttled"):
        table.add_column(column, justify="right")
    for row in report.resources:
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
    if report.straggler is not None and report.straggler_signal == "collective_wait":
        busy = (f"; its own work is {report.straggler_busy_ratio:.2f}x the median rank's"
                if report.straggler_busy_ratio else "")
        return [f"straggler: {b}rank {report.straggler}{e}: the other ranks wait for it in "
                f"collectives {wait:.0%} of a step{busy}"]
    if report.straggler is not None and report.straggler_busy_ratio:
        return [f"straggler: {b}rank {report.straggler}{e}, busy "
                f"{report.straggler_busy_ratio:.2f}x the median rank, slowest in "
                f"{report.straggler_slowest_share or 0:.0%} of steps"]
    if report.straggler_busy_ratio or wait is not None:
        parts = []
        if report.straggler_busy_ratio:
            parts.append(f"the busiest rank is {report.straggler_busy_ratio:.2f}x the median rank")
        if wait is not None:
            parts.append(f"no rank is waited for over {max(wait, 0):.0%} of a step "
                         f"(rank {report.straggler_wait_rank} most)")
        return ["no straggler: " + "; ".join(parts)]
    return []
