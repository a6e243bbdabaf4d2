"""``otel-train compare``'s table in the terminal and as one self-contained HTML page."""

from __future__ import annotations

from html import escape

from otel_train.analysis.compare import (
    BETTER,
    BY_KEY,
    NO_INTERVAL,
    WORSE,
    Cell,
    Comparison,
    Row,
)
from otel_train.analysis.compare_runs import in_points
from otel_train.analysis.compare_stats import CONFIDENCE, MIN_STEPS
from otel_train.analysis.terminal import fmt_bytes, fmt_s

VERDICT_STYLE = {BETTER: "green", WORSE: "bold red"}


def value_text(unit: str, value: float | None) -> str:
    if value is None:
        return "none" if unit == "rank" else "-"
    if unit == "s":
        return fmt_s(value) if value >= 0 else f"-{fmt_s(-value)}"
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "ratio":
        return f"{value * 100:.1f}%"
    if unit == "count":
        return f"{value:.0f}"
    if unit == "rank":
        return f"rank {value:.0f}"
    return f"{value:,.1f} {unit}"


def change_text(row: Row, cell: Cell) -> str:
    """``+31.2% [27.0, 35.1]``; the difference where there is no relative change (a figure
    that can be 0 or below, a baseline of 0): ``+5.6 ms [2.1, 9.0]``."""
    figure = row.figure
    if cell.delta is None or figure.better is None:
        return "-"
    if cell.change is not None:
        text = f"{cell.change * 100:+.1f}%"
        interval = cell.change_interval
        return text + (" [{:.1f}, {:.1f}]".format(*(x * 100 for x in interval))
                       if interval else "")
    text = _signed(figure.unit, cell.delta)
    if cell.delta_interval is not None:
        text += " [{}, {}]".format(*(_signed(figure.unit, x) for x in cell.delta_interval))
    return text


def _signed(unit: str, value: float) -> str:
    return ("+" if value >= 0 else "-") + value_text(unit, abs(value))


def verdict_text(row: Row, cell: Cell) -> str:
    if cell.verdict == NO_INTERVAL and not cell.delta:
        return "same (no interval)"
    unit = " pts" if in_points(row.figure) else "%"
    if cell.verdict == NO_INTERVAL and row.figure.tolerance is not None:
        return f"within ±{row.figure.tolerance * 100:g}{unit} (no interval)"
    if cell.verdict in (BETTER, WORSE) and not row.figure.stepwise:
        return f"{cell.verdict} (beyond ±{(row.figure.tolerance or 0) * 100:g}{unit})"
    return cell.verdict


def gate_lines(result: Comparison) -> list[str]:
    gates = ", ".join(f"{key} {threshold.text(BY_KEY[key])}"
                      for key, threshold in result.gates.items()) or "none"
    if not result.failures:
        return [f"gate: passed ({gates})"]
    lines = [f"gate: FAILED ({gates})"]
    for failure in result.failures:
        row = next(r for r in result.rows if r.figure.key == failure.key)
        cell = next(c for c in row.cells if c.run == failure.run)
        lines.append(f"  {failure.run}: {failure.key} {change_text(row, cell)}, worse than "
                     f"its {failure.threshold} threshold")
    return lines


def method_line(result: Comparison) -> str:
    return (f"change vs {result.baseline.label} with its {CONFIDENCE:.0%} interval: a circular "
            f"block bootstrap over each run's steady steps ({result.resamples} replicates; "
            f"runs with fewer than {MIN_STEPS} steady steps get none); figures without "
            "per-step series: a verdict only beyond their tolerance")


def terminal(result: Comparison) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from otel_train.analysis.terminal import print_fitted

    console = Console()
    runs = result.runs
    console.print(", ".join(f"{r.label}: {len(r.report.ranks)} ranks, {r.steady_steps} steady "
                            f"steps" for r in runs) + f"; baseline {result.baseline.label}")
    table = Table(title=f"{' vs '.join(r.label for r in runs)}")
    table.add_column("figure", justify="left")
    for run in runs:
        table.add_column(run.label, justify="right")
    for run in runs[1:]:
        table.add_column(f"{run.label} vs {result.baseline.label}", justify="right")
        table.add_column("verdict", justify="left")
    for row in result.rows:
        cells: list[str | Text] = [row.figure.label]
        cells += [value_text(row.figure.unit, v) for v in row.values]
        for cell in row.cells:
            style = VERDICT_STYLE.get(cell.verdict, "")
            cells += [change_text(row, cell), Text(verdict_text(row, cell), style=style)]
        table.add_row(*cells)
    print_fitted(console, [table])
    console.print(Text(method_line(result), style="dim"))
    for where in result.where:
        console.print(where.sentence)
    for line in gate_lines(result):
        console.print(Text(line, style="bold red" if result.failures else ""))


CSS_EXTRA = """
td.better{color:#1e7b34;font-weight:bold} td.worse{color:#c0392b;font-weight:bold}
td.dim{color:#777}
"""


def html(result: Comparison) -> str:
    from otel_train.analysis.html import CSS

    runs = result.runs
    title = "otel-train compare: " + " vs ".join(r.label for r in runs)
    head = "".join(f"<th>{escape(r.label)}</th>" for r in runs)
    head += "".join(f"<th>{escape(r.label)} vs {escape(result.baseline.label)}</th>"
                    "<th class=\"l\">verdict</th>" for r in runs[1:])
    body = []
    for row in result.rows:
        cells = [f'<td class="l">{escape(row.figure.label)}</td>']
        cells += [f"<td>{escape(value_text(row.figure.unit, v))}</td>" for v in row.values]
        for cell in row.cells:
            cls = cell.verdict if cell.verdict in (BETTER, WORSE) else "dim"
            cells += [f"<td>{escape(change_text(row, cell))}</td>",
                      f'<td class="l {cls}">{escape(verdict_text(row, cell))}</td>']
        body.append("<tr>" + "".join(cells) + "</tr>")
    runs_list = "".join(f"<li><b>{escape(r.label)}</b>{' (baseline)' if i == 0 else ''}: "
                        f"{escape(str(r.path))}, {len(r.report.ranks)} ranks, "
                        f"{r.steady_steps} steady steps</li>" for i, r in enumerate(runs))
    sentences = "".join(f'<p class="why">{escape(w.sentence)}</p>' for w in result.where)
    gate = "".join(f"<p class=\"note\">{escape(line)}</p>" for line in gate_lines(result))
    return ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{CSS}{CSS_EXTRA}</style></head><body>"
            f"<h1>{escape(title)}</h1><ul>{runs_list}</ul>"
            f"<h2>Where the time moved</h2>{sentences}"
            f"<h2>The runs side by side</h2><table><tr><th class=\"l\">figure</th>{head}</tr>"
            f"{''.join(body)}</table><p class=\"note\">{escape(method_line(result))}</p>"
            f"<h2>Gate</h2>{gate}</body></html>")


__all__ = ["html", "terminal"]
