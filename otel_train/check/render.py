"""Verdicts as a rich table or as JSON."""

from __future__ import annotations

import json
from typing import TextIO

from rich.console import Console
from rich.table import Table

from otel_train.check.model import FAIL, PASS, CheckResult, failed

STYLE = {PASS: "green", FAIL: "bold red"}


def render_table(results: list[CheckResult], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="Production attribution checklist", show_lines=True)
    for column in ("item", "status", "evidence", "fix"):
        table.add_column(column, overflow="fold")
    for r in results:
        style = STYLE.get(r.status, "dim")
        table.add_row(f"{r.id}\n[dim]{r.item}[/]", f"[{style}]{r.status}[/]", r.evidence, r.fix)
    console.print(table)
    verdict = "[bold red]FAIL[/]" if failed(results) else "[green]PASS[/]"
    counts = {s: sum(1 for r in results if r.status == s) for s in (PASS, FAIL)}
    console.print(f"{verdict}: {counts[PASS]} passed, {counts[FAIL]} failed, "
                  f"{len(results) - counts[PASS] - counts[FAIL]} not applicable")


def write_json(results: list[CheckResult], out: TextIO) -> None:
    json.dump({"ok": not failed(results), "checks": [r.to_dict() for r in results]}, out,
              indent=1)
    out.write("\n")
