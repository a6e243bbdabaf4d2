"""``otel-train report --json`` and ``otel-train check --json`` print, byte for byte, what
they printed before the readers were made faster (``tests/golden/``, recorded with the
readers of commit 590e164 by ``tests/report_golden.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_golden import CASES, GOLDEN, outputs


@pytest.fixture(scope="module")
def run_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: write(tmp_path_factory.mktemp(name)) for name, (write, _) in CASES.items()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_report_and_check_print_what_they_printed_before(case: str,
                                                         run_dirs: dict[str, Path]) -> None:
    for file, text in outputs(run_dirs[case], CASES[case][1]).items():
        assert text == (GOLDEN / f"{case}.{file}").read_text(encoding="utf-8"), file
