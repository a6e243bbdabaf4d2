"""``otel-train check``: the production attribution checklist, verified."""

from __future__ import annotations

import argparse
import json
import sys
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from otel_train.check.render import render_table, write_json
from otel_train.check.verdicts import PASS, CheckResult, failed, merge

T = TypeVar("T")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check", help="verify the production attribution checklist",
        description="One row per checklist item (pass, fail, n/a) with evidence and fix. "
                    "Exit status 1 when an item fails, 2 when a source given could not be "
                    "read (what the others show is still printed) or no item was applicable "
                    "(nothing verified).")
    parser.add_argument("run", type=Path, nargs="?", help="run directory (or the root "
                        "holding runs: the newest is read)")
    parser.add_argument("--prometheus", metavar="URL", type=base_url,
                        help="Prometheus base URL (HTTP API)")
    parser.add_argument("--run-id", help="only this run (files holding several runs, such as "
                        "a collector's output, and live series)")
    parser.add_argument("--jaeger", metavar="URL", type=base_url,
                        help="Jaeger query base URL (HTTP API, "
                        "e.g. http://127.0.0.1:16686); needs the run id")
    parser.add_argument("--loki", metavar="URL", type=base_url,
                        help="Loki base URL (HTTP API, "
                        "e.g. http://127.0.0.1:3100); needs the run id")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.set_defaults(func=run)


def base_url(raw: str) -> str:
    """An argparse ``type``: a backend's base URL, ``http(s)://host[:port][/path]``; what is
    none is a usage error at once, not a source that could not be read after the others
    were (urllib's "unknown url type" for ``host:port`` without its scheme)."""
    try:
        parts = urllib.parse.urlsplit(raw)
        parts.port  # noqa: B018 - raises ValueError where the port is no number or too large
    except ValueError as err:  # "Invalid IPv6 URL", "Port out of range 0-65535"
        raise argparse.ArgumentTypeError(f"{raw!r} is not a URL ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"{raw!r} is not an http:// or https:// URL "
                                         "(give the base URL, http://host:port)")
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"{raw!r}: give the base URL, without ?query or "
                                         "#fragment (the API paths are appended to it)")
    return raw


def gather_results(args: argparse.Namespace) -> tuple[list[CheckResult], list[str]]:
    """The verdicts of every source given, and why each source that could not be read was
    not: one that fails leaves the others' verdicts standing."""
    results: list[CheckResult] = []
    unread: list[str] = []
    run_id = args.run_id
    run_dir = None
    if args.run is not None:
        from otel_train.analysis.otlp import resolve_run_dir

        run_dir = _attempt(unread, lambda: resolve_run_dir(args.run, args.run_id))
        run_id = run_id or (_run_json_id(run_dir) if run_dir else None)
    live = None
    prometheus_down = False  # then its own items are not asked for again
    if args.prometheus and run_id and (run_dir or args.jaeger):
        live = _attempt(unread, lambda: _live_exemplars(args.prometheus, run_id))
        prometheus_down = live is None
    if run_dir is not None:
        from otel_train.check.rundir import check_run_dir

        results += _attempt(unread, lambda: check_run_dir(run_dir, args.run_id, live)) or []
    if args.prometheus and not prometheus_down:
        from otel_train.check.prometheus import check_prometheus

        results += _attempt(unread, lambda: check_prometheus(args.prometheus, args.run_id)) or []
    if args.jaeger:
        from otel_train.check.jaeger import check_jaeger

        results += _attempt(unread, lambda: check_jaeger(
            args.jaeger, _needs_run_id("--jaeger", run_id), live)) or []
    if args.loki:
        from otel_train.check.loki import check_loki

        results += _attempt(unread, lambda: check_loki(
            args.loki, _needs_run_id("--loki", run_id))) or []
    return merge(results), unread


def _attempt(unread: list[str], source: Callable[[], T]) -> T | None:
    """``source()``; None where it could not be read, and why appended to ``unread``."""
    try:
        return source()
    except OSError as err:  # FileNotFoundError, a backend's failure (check/http.py)
        unread.append(str(err))
        return None


def _needs_run_id(flag: str, run_id: str | None) -> str:
    if not run_id:
        raise OSError(f"{flag} needs --run-id (or a run directory whose run.json names the run)")
    return run_id


def _run_json_id(run_dir: Path) -> str | None:
    """The run id the embedded exporter wrote to run.json, when there is one."""
    try:
        return str(json.loads((run_dir / "run.json").read_text(encoding="utf-8"))["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _live_exemplars(prometheus: str, run_id: str) -> frozenset[tuple[str, str]]:
    """The run's exemplars in Prometheus: checked against the files' (or Jaeger's) spans,
    which is how exemplars resolve without a trace backend."""
    from otel_train.check.prometheus import live_exemplar_ids

    return frozenset(live_exemplar_ids(prometheus, run_id))


def run(args: argparse.Namespace) -> int:
    wrong = usage_error(args)
    if wrong:
        print(f"otel-train check: {wrong}", file=sys.stderr)
        return 2
    results, unread = gather_results(args)
    if args.json:
        write_json(results, sys.stdout, unread)
    elif results:
        render_table(results, unread=unread)
    for reason in unread:
        print(f"otel-train check: not read: {reason}", file=sys.stderr)
    status = exit_status(results, unread)
    if status == 2 and not unread:
        print("otel-train check: no checklist item was applicable to what was given; nothing "
              "was verified", file=sys.stderr)
    return status


def usage_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments as given, before any source is read: nothing to
    check, or a backend that needs a run id where nothing can give it."""
    if args.run is None and not (args.prometheus or args.jaeger or args.loki):
        return "give a run directory or a live endpoint (--prometheus ...)"
    if args.run is None and not args.run_id:  # else run.json may name it
        for flag in ("--jaeger", "--loki"):
            if getattr(args, flag[2:]):
                return f"{flag} needs --run-id (or a run directory whose run.json names the run)"
    if args.run_id is not None and not args.run_id.strip():
        return "--run-id is empty"
    return None


def exit_status(results: list[CheckResult], unread: list[str] | None = None) -> int:
    """2 when a source given could not be read (what was asked was not all verified);
    1 when an item failed; 2 when none passed either (every row n/a: nothing was
    verified, which must not read as success); else 0."""
    if unread:
        return 2
    if failed(results):
        return 1
    return 0 if any(r.status == PASS for r in results) else 2
