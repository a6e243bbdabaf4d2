"""``otel-train report --json`` and ``otel-train check --json`` print, byte for byte, what
they printed before the readers were made faster (``tests/report/golden/``, recorded with
the readers of commit 590e164 by ``tests/support/report_golden.py``), whether the traces files are read
in this process or spread over worker processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.report_golden import CASES, GOLDEN, outputs

from otel_train import semconv as sc
from otel_train.analysis import parallel
from otel_train.analysis.otlp import signal_files

#: the CLI with three forked workers however small the files and few the CPUs, in a fresh
#: interpreter: workers are forked only from a single-threaded process, and the test
#: process may hold other tests' threads
_WITH_WORKERS = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from otel_train import semconv as sc
from otel_train.analysis import parallel
from otel_train.analysis.otlp import signal_files
from support.report_golden import CASES, outputs
parallel.MIN_PARALLEL_BYTES = 0
parallel.usable_cpus = lambda: 3
run_dir, case = Path(sys.argv[2]), sys.argv[3]
workers = parallel.worker_count(signal_files(run_dir, sc.TRACES_GLOB))
print(json.dumps({"workers": workers, "outputs": outputs(run_dir, CASES[case][1])}))
"""


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: write(tmp_path_factory.mktemp(name)) for name, (write, _) in CASES.items()}


@pytest.mark.parametrize("reading", ["one process", "three workers"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_report_and_check_print_what_they_printed_before(
        case: str, reading: str, run_dirs: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch) -> None:
    files = signal_files(run_dirs[case], sc.TRACES_GLOB)
    if reading == "one process":
        monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", float("inf"))
        assert parallel.worker_count(files) == 1
        got = outputs(run_dirs[case], CASES[case][1])
    else:
        done = subprocess.run(
            [sys.executable, "-c", _WITH_WORKERS, str(Path(__file__).parents[1]),
             str(run_dirs[case]), case], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        child = json.loads(done.stdout.splitlines()[-1])
        assert child["workers"] == min(3, len(files))
        got = child["outputs"]
    for file, text in got.items():
        assert text == (GOLDEN / f"{case}.{file}").read_text(encoding="utf-8"), file


def test_workers_are_not_forked_from_a_process_with_threads(run_dirs: dict[str, Path],
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    import threading

    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert parallel.worker_count(signal_files(run_dirs["healthy"], sc.TRACES_GLOB)) == 1
