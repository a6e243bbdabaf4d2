"""``otel-train check``: the production attribution checklist, verified."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from otel_train.check.render import render_table, write_json
from otel_train.check.verdicts import PASS, CheckResult, failed, merge


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "check", help="verify the production attribution checklist",
        description="One row per checklist item (pass, fail, n/a) with evidence and fix. "
                    "Exit status 1 when an item fails, 2 when no source could be read "
                    "or no item was applicable (nothing verified).")
    parser.add_argument("run", type=Path, nargs="?", help="run directory (or the root "
                        "holding runs: the newest is read)")
    parser.add_argument("--prometheus", metavar="URL", help="Prometheus base URL (HTTP API)")
    parser.add_argument("--run-id", help="only this run (files holding several runs, such as "
                        "a collector's output, and live series)")
    parser.add_argument("--jaeger", metavar="URL", help="Jaeger query base URL (HTTP API, "
                        "e.g. http://127.0.0.1:16686); needs the run id")
    parser.add_argument("--loki", metavar="URL", help="Loki base URL (HTTP API, "
                        "e.g. http://127.0.0.1:3100); needs the run id")
    parser.add_argument("--json", action="store_true", help="print JSON only")
    parser.set_defaults(func=run)


def gather_results(args: argparse.Namespace) -> list[CheckResult]:
    results: list[CheckResult] = []
    run_id = args.run_id
    live: frozenset[tuple[str, str]] | None = None
    if args.run is not None:
        from otel_train.analysis.otlp import resolve_run_dir
        from otel_train.check.rundir import check_run_dir

        run_dir = resolve_run_dir(args.run, args.run_id)
        run_id = run_id or _run_json_id(run_dir)
        live = _live_exemplars(args.prometheus, run_id)
        results += check_run_dir(run_dir, args.run_id, live)
    if args.prometheus:
        from otel_train.check.prometheus import check_prometheus

        results += check_prometheus(args.prometheus, args.run_id)
    if args.jaeger:
        from otel_train.check.jaeger import check_jaeger

        jaeger_run = _needs_run_id("--jaeger", run_id)
        if live is None:
            live = _live_exemplars(args.prometheus, jaeger_run)
        results += check_jaeger(args.jaeger, jaeger_run, live)
    if args.loki:
        from otel_train.check.loki import check_loki

        results += check_loki(args.loki, _needs_run_id("--loki", run_id))
    return merge(results)


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


def _live_exemplars(prometheus: str | None, run_id: str | None
                    ) -> frozenset[tuple[str, str]] | None:
    """With a run directory and Prometheus both given, the run's live exemplars: checked
    against the files' spans, which is how exemplars resolve without a trace backend."""
    if not prometheus or not run_id:
        return None
    from otel_train.check.prometheus import live_exemplar_ids

    return frozenset(live_exemplar_ids(prometheus, run_id))


def run(args: argparse.Namespace) -> int:
    if args.run is None and not (args.prometheus or args.jaeger or args.loki):
        print("otel-train check: give a run directory or a live endpoint (--prometheus ...)",
              file=sys.stderr)
        return 2
    try:
        results = gather_results(args)
    except (FileNotFoundError, OSError) as err:
        print(f"otel-train check: {err}", file=sys.stderr)
        return 2
    if args.json:
        write_json(results, sys.stdout)
    else:
        render_table(results)
    status = exit_status(results)
    if status == 2:
        print("otel-train check: no checklist item was applicable to what was given; nothing "
              "was verified", file=sys.stderr)
    return status


def exit_status(results: list[CheckResult]) -> int:
    """1 when an item failed; 2 when none passed either (every row n/a: nothing was
    verified, which must not read as success); else 0."""
    if failed(results):
        return 1
    return 0 if any(r.status == PASS for r in results) else 2
