"""Verdicts as a rich table or as JSON."""

from __future__ import annotations

import json
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

from otel_train.analysis.terminal import is_cut
from otel_train.check.verdicts import FAIL, PASS, CheckResult, failed

STYLE = {PASS: "green", FAIL: "bold red"}
TITLE = "Production attribution checklist"


def render_table(results: list[CheckResult], console: Console | None = None,
                 unread: list[str] | None = None) -> None:
    """The verdicts as a table where it fits the console without cutting a word (ids such
    as ``same_trace_across_ranks`` need about 110 columns), else one block per item; then
    the verdict, never PASS where a source given was ``unread`` (those it could read
    passing is not what was asked)."""
    console = console or Console()
    table = _table(results)
    console.print(_blocks(results) if is_cut(console, table) else table)
    console.print(verdict_line(results, unread or []))


def verdict_line(results: list[CheckResult], unread: list[str]) -> str:
    if failed(results):
        verdict = "[bold red]FAIL[/]"
    else:
        verdict = "[bold red]INCOMPLETE[/]" if unread else "[green]PASS[/]"
    counts = {s: sum(1 for r in results if r.status == s) for s in (PASS, FAIL)}
    line = (f"{verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, "
            f"{len(results) - counts[PASS] - counts[FAIL]} not applicable")
    if unread:  # each named on stderr
        line += f"; not read: {len(unread)} source{'s' if len(unread) > 1 else ''}"
    return line


def _table(results: list[CheckResult]) -> Table:
    table = Table(title=TITLE, show_lines=True)
    for column in ("item", "status", "evidence", "fix"):
        table.add_column(column)  # cut, not folded, where too narrow: render_table checks
    for r in results:
        style = STYLE.get(r.status, "dim")
        table.add_row(f"{r.id}\n[dim]{r.item}[/]", f"[{style}]{r.status}[/]", r.evidence, r.fix)
    return table


def _blocks(results: list[CheckResult]) -> RenderableType:
    """One block per item: status and id, then what it checks, the evidence and the fix,
    indented; text wraps at spaces instead of being cut."""
    blocks: list[RenderableType] = [Text(TITLE, style="bold")]
    for r in results:
        head = Text(f"{r.status:<4}", style=STYLE.get(r.status, "dim"))
        head.append(f"  {r.id}", style="bold")
        body = [Text(r.item, style="dim"), Text(r.evidence)]
        if r.fix:
            body.append(Text(f"fix: {r.fix}"))
        blocks += [head, Padding(Group(*body), (0, 0, 0, 2), expand=False)]
    return Group(*blocks)


def write_json(results: list[CheckResult], out: TextIO, unread: list[str] | None = None
               ) -> None:
    """``ok``, the verdicts, and where a source given could not be read, ``not_read``: why
    each was not."""
    body: dict[str, Any] = {"ok": not failed(results) and not unread,
                            "checks": [r.to_dict() for r in results]}
    if unread:
        body["not_read"] = unread
    json.dump(body, out, indent=1)
    out.write("\n")
