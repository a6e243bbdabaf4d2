"""The demo at a terminal shows what a person reads: progress, summary, files, next steps."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _run_at_a_terminal(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; its exit code and text."""
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal,
                            env=env, cwd=cwd)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: every holder of the terminal has closed it
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return proc.wait(timeout=300), ANSI.sub("", b"".join(chunks).decode(errors="replace"))


def test_demo_at_a_terminal_prints_no_log_lines_or_numpy_warnings(tmp_path: Path) -> None:
    # numpy made unimportable for the demo and its ranks, as after a plain `pip install -e .`
    hidden = tmp_path / "hide-numpy"
    hidden.mkdir()
    (hidden / "numpy.py").write_text("raise ModuleNotFoundError('numpy hidden by the test', name='numpy')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TORCHELASTIC_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(hidden), str(REPO)]), COLUMNS="100")
    code, text = _run_at_a_terminal(
        [sys.executable, "-m", "otel_train.cli", "demo", "--steps", "3", "--no-compile",
         "--workers", "0", "--output-dir", str(tmp_path / "runs")], env, tmp_path)

    assert code == 0, text[-4000:]
    assert "NumPy" not in text and "numpy" not in text, text[-4000:]
    assert '"level"' not in text and '"event"' not in text, text[-4000:]  # no JSON log lines
    assert "Mean time per step" in text
    run_dirs = list((tmp_path / "runs").iterdir())
    assert len(run_dirs) == 1
    assert f"telemetry: runs/{run_dirs[0].name}/" in text
    assert re.search(r"otel-train report runs\s", text) and re.search(r"otel-train check runs\s",
                                                                       text), text[-2000:]


def test_a_rank_that_trained_uninstrumented_makes_the_demo_fail_and_say_why(
        tmp_path: Path) -> None:
    """Issue 16, item 13: a rank whose instrumentation did not start trains on, but the demo
    (whose point is the telemetry) exits non-zero naming the rank and the reason. Caused for
    real here by the OpenTelemetry switch every rank reads, OTEL_SDK_DISABLED=true."""
    done = subprocess.run(
        [sys.executable, "-m", "otel_train.cli", "demo", "--ranks", "2", "--steps", "3",
         "--no-compile", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "OTEL_SDK_DISABLED": "true"})
    assert done.returncode == 1, done.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank} trained uninstrumented: " in done.stderr
    assert "OTEL_SDK_DISABLED" in done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["uninstrumented_ranks"] == [0, 1] and result["run_dir"] is None
