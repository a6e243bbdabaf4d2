"""Fixed run directories and the CLI output they give: ``otel-train report --json`` and
``otel-train check --json`` on each, recorded in ``tests/report/golden/`` so that a change to the
readers (speed, parallel parsing) can be proven not to change a byte of what users see.

    PYTHONPATH=. python tests/support/report_golden.py   # rewrite tests/report/golden/ (only on purpose)
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, when run as a script

from support.report_fixtures import (  # noqa: E402
    RunSpec,
    break_rank_sampling,
    break_step_trace_ids,
    write_run,
)

GOLDEN = Path(__file__).resolve().parents[1] / "report" / "golden"
LAUNCHER = ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")


def _healthy(root: Path) -> Path:
    return write_run(RunSpec(ranks=4, steps=200, traceparent=LAUNCHER), root)


def _sampled(root: Path) -> Path:
    return write_run(RunSpec(ranks=3, steps=300, run_id="sampled", micro_batches=2,
                             sample_ratio=0.5, straggler_rank=1, spike_steps=(40, 210),
                             recompile_step=150, seed=11), root)


def _damaged(root: Path) -> Path:
    run = write_run(RunSpec(ranks=4, steps=120, run_id="damaged", spike_steps=(30,),
                            recompile_step=50, metrics_every=20), root)
    break_rank_sampling(run, 1)
    break_step_trace_ids(run, 3)
    return run


def _shared(root: Path) -> Path:
    """A collector's output: two runs appended to the same files."""
    shared = root / "shared"
    shared.mkdir(parents=True)
    for run_id, ranks in (("first", 2), ("second", 3)):
        run = write_run(RunSpec(ranks=ranks, steps=40, run_id=run_id, spike_steps=(9,),
                                recompile_step=20, metrics_every=10), root / "runs")
        for path in sorted(run.glob("*.jsonl")):
            signal = path.name.split(".")[0]
            with open(shared / f"{signal}.jsonl", "a", encoding="utf-8") as out:
                out.write(path.read_text(encoding="utf-8"))
    return shared


#: name: (writes the run directory under a root, extra CLI arguments)
CASES: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "healthy": (_healthy, ()),
    "sampled": (_sampled, ()),
    "damaged": (_damaged, ()),
    "shared": (_shared, ()),
    "shared-second": (_shared, ("--run-id", "second")),
}


def cli_output(argv: list[str]) -> tuple[int, str]:
    """Exit status and stdout of ``otel-train ARGV``, run in this process."""
    from otel_train.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(argv)
    return status, out.getvalue()


def outputs(run_dir: Path, extra: tuple[str, ...]) -> dict[str, str]:
    """``report --json`` and ``check --json`` of a run directory, with the exit status."""
    got = {}
    for command in ("report", "check"):
        status, text = cli_output([command, str(run_dir), "--json", *extra])
        got[f"{command}.json"] = f"exit {status}\n{text}"
    return got


def main() -> None:
    import tempfile

    GOLDEN.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, (write, extra) in CASES.items():
            run_dir = write(Path(tmp) / name)
            for file, text in outputs(run_dir, extra).items():
                (GOLDEN / f"{name}.{file}").write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
