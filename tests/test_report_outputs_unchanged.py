"""``otel-train report --json`` and ``otel-train check --json`` print, byte for byte, what
they printed before the readers were made faster (``tests/golden/``, recorded with the
readers of commit 590e164 by ``tests/report_golden.py``), whether the traces files are read
in this process or spread over worker processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_golden import CASES, GOLDEN, outputs

from otel_train import semconv as sc
from otel_train.analysis import parallel
from otel_train.analysis.otlp import signal_files


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: write(tmp_path_factory.mktemp(name)) for name, (write, _) in CASES.items()}


@pytest.fixture(params=["one process", "three workers"])
def reading(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "three workers":  # however small the files and few the CPUs
        monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
        monkeypatch.setattr(parallel, "usable_cpus", lambda: 3)
    else:
        monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", float("inf"))
    return request.param


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_and_check_print_what_they_printed_before(
        case: str, reading: str, run_dirs: dict[str, Path]) -> None:
    files = signal_files(run_dirs[case], sc.TRACES_GLOB)
    expected_workers = min(3, len(files)) if reading == "three workers" else 1
    assert parallel.worker_count(files) == expected_workers
    for file, text in outputs(run_dirs[case], CASES[case][1]).items():
        assert text == (GOLDEN / f"{case}.{file}").read_text(encoding="utf-8"), file


def test_workers_are_not_forked_from_a_process_with_threads(run_dirs: dict[str, Path],
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    import threading

    monkeypatch.setattr(parallel, "MIN_PARALLEL_BYTES", 0)
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert parallel.worker_count(signal_files(run_dirs["healthy"], sc.TRACES_GLOB)) == 1
