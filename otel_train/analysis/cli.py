"""``otel-train report RUN``: where the step time went, from exported telemetry."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from otel_train.analysis.build import build_report
from otel_train.analysis.otlp import DamagedFileWarning, no_such_run, resolve_run_dir
from otel_train.analysis.terminal import render_terminal
from otel_train.cli import integer_at_least


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report", help="attribution report of a run's exported telemetry",
        description="Where did the step time go? Reads a run directory (the embedded "
                    "exporter's, or the collector file exporter's output).")
    parser.add_argument("run", type=Path, help="run directory (or the root holding runs: "
                        "the newest is read)")
    parser.add_argument("--run-id", help="only this run (files holding several runs, such as "
                        "a collector's output)")
    parser.add_argument("--top", type=integer_at_least(0), default=10,
                        help="slowest steps to list")
    parser.add_argument("--timelines", type=integer_at_least(0), default=3,
                        help="slowest steps drawn as timelines in --html")
    parser.add_argument("--html", type=Path, metavar="FILE", help="also write one "
                        "self-contained HTML file with the plots")
    parser.add_argument("--json", action="store_true", help="print the report as JSON only")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    unwritable = args.html and cannot_write(args.html)
    if unwritable:  # said before the run is read, which takes a while on a large one
        print(f"otel-train report: --html {unwritable}", file=sys.stderr)
        return 2
    try:
        run_dir = resolve_run_dir(args.run, args.run_id)
        with damage_on_stderr():
            report = build_report(run_dir, top=args.top, timelines=args.timelines,
                                  run_id=args.run_id)
    except OSError as err:  # what was asked is not there, or cannot be read (permissions)
        print(f"otel-train report: {err}", file=sys.stderr)
        return 2
    if not report.ranks and report.trained_steps is None:  # not a report of an empty run
        nothing = (no_such_run(run_dir, args.run_id) if args.run_id else
                   f"{run_dir}: its files hold no telemetry that could be read")
        print(f"otel-train report: {nothing}", file=sys.stderr)
        return 2
    from otel_train.analysis.html import render_html

    return write_outputs("report", args, report.to_dict, lambda: render_html(report),
                         lambda: render_terminal(report))


def write_outputs(command: str, args: argparse.Namespace, as_dict: Callable[[], Any],
                  html: Callable[[], str], terminal: Callable[[], None]) -> int:
    """What ``report`` and ``compare`` print: the ``--html`` page written (1 where that
    fails: the disk filled, or the folder went since it was checked), then ``--json`` or
    the terminal's tables; 0 once written."""
    if args.html:
        try:
            args.html.write_text(html(), encoding="utf-8")
        except OSError as err:
            print(f"otel-train {command}: cannot write --html {args.html}: {err}",
                  file=sys.stderr)
            return 1
    if args.json:
        json.dump(as_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        terminal()
        if args.html:
            print(f"wrote {args.html}")
    return 0


def cannot_write(path: Path) -> str | None:
    """Why a file cannot be written at ``path`` (its folder is missing, is no folder, or is
    read-only; ``path`` is a folder), or None where it can."""
    folder = path.parent
    if path.is_dir():
        return f"{path} is a folder; give the file to write, such as {path / 'report.html'}"
    if not folder.exists():
        return f"{path}: its folder {folder} does not exist"
    if not folder.is_dir():
        return f"{path}: {folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{path}: the folder {folder} is not writable"
    if path.exists() and not os.access(path, os.W_OK):
        return f"{path} is not writable"
    return None


@contextlib.contextmanager
def damage_on_stderr() -> Iterator[None]:
    """Each damaged file the readers warn of as one line on stderr, every time (the worker
    processes reading the traces are forked inside, so they print the same way)."""
    with warnings.catch_warnings():
        warnings.simplefilter("always", DamagedFileWarning)
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], *args: Any,
                 **kwargs: Any) -> None:
            if issubclass(category, DamagedFileWarning):
                print(f"otel-train report: warning: {message}", file=sys.stderr)
            else:
                shown(message, category, *args, **kwargs)

        warnings.showwarning = show
        yield
