"""The CLI a new user meets: fast to start, readable at 80 columns and in a file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.report_fixtures import RunSpec, write_run

import otel_train
from otel_train.cli import main

REPO = Path(__file__).resolve().parents[2]
SPEC = RunSpec(ranks=8, steps=60, straggler_rank=2, spike_steps=(17,))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_run(SPEC, tmp_path_factory.mktemp("runs"))


def _python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                          text=True, timeout=120)


# --- fitting the terminal ----------------------------------------------------------------------


@pytest.mark.parametrize("command", ["report", "check"])
def test_tables_at_80_columns_cut_no_header_or_cell(command: str, run_dir: Path,
                                                     monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    main([command, str(run_dir)])
    out = capsys.readouterr().out
    assert "…" not in out, out
    assert max(len(line) for line in out.splitlines()) <= 80
    if command == "report":
        for header in ("steps", "median", "p95", "max", "forward", "backward", "optimizer"):
            assert header in out
    else:
        for check_id in ("trace_coverage", "same_trace_across_ranks", "sampling_consistency"):
            assert check_id in out


@pytest.mark.parametrize("columns", ["40", "60", "100", "200"])
def test_report_fits_narrow_and_wide_terminals(columns: str, run_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", columns)
    main(["report", str(run_dir)])
    out = capsys.readouterr().out
    assert "…" not in out and "forward" in out and "optimizer" in out


def test_report_and_check_piped_to_a_file_cut_nothing(run_dir: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    for command in ("report", "check"):
        out = tmp_path / f"{command}.txt"
        with out.open("w") as f:
            subprocess.run([sys.executable, "-m", "otel_train.cli", command, str(run_dir)],
                           stdout=f, env={**env, "PYTHONPATH": str(REPO)}, timeout=120)
        text = out.read_text()
        assert "…" not in text and "rank" in text, text


def test_json_output_is_unaffected_by_the_width(run_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("COLUMNS", "40")
    main(["report", str(run_dir), "--json"])
    assert json.loads(capsys.readouterr().out)["world_size"] == SPEC.ranks
    main(["check", str(run_dir), "--json"])
    assert "checks" in json.loads(capsys.readouterr().out)


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"otel-train {otel_train.__version__}"


# --- starting without torch ----------------------------------------------------------------------

READS_WITHOUT_TORCH = """
import sys
from otel_train.cli import main
codes = [main(["report", sys.argv[1]]), main(["check", sys.argv[1]])]
heavy = sorted(m for m in ("torch", "numpy", "opentelemetry.sdk") if sys.modules.get(m))
print(codes, heavy)
"""


def test_report_and_check_import_no_torch(run_dir: Path) -> None:
    done = _python(READS_WITHOUT_TORCH, str(run_dir))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[0, 0] []"


def test_report_and_check_work_where_torch_is_not_installed(run_dir: Path) -> None:
    done = _python('import sys; sys.modules["torch"] = None\n' + READS_WITHOUT_TORCH,
                   str(run_dir))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[0, 0] []"


def test_import_otel_train_imports_no_torch() -> None:
    done = _python("import sys, otel_train; print(otel_train.__version__, 'torch' in sys.modules)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [otel_train.__version__, "False"]


# --- the public API, loaded on first use ---------------------------------------------------------

PUBLIC_API = """
import sys, warnings
{first}
import otel_train
import torch
from otel_train import instrument
module = sys.modules["otel_train.instrument"]
assert otel_train.instrument is module.instrument is instrument, otel_train.instrument
assert otel_train.Instrumentation is module.Instrumentation
assert issubclass(otel_train.ConfigWarning, Warning) and otel_train.Config is not None
assert set(otel_train.__all__) <= set(dir(otel_train))
model = torch.nn.Linear(2, 2)
with otel_train.instrument(model, exporter="none", console_log_level="warning") as inst:
    model(torch.ones(1, 2))
assert isinstance(inst, otel_train.Instrumentation)
import otel_train.instrument  # a second import of the submodule keeps the function too
assert callable(otel_train.instrument) and otel_train.instrument is module.instrument
print("ok")
"""


@pytest.mark.parametrize("first", [
    "",
    "import otel_train.instrument",
    "from otel_train.instrument import Instrumentation",
    "import importlib; importlib.import_module('otel_train.instrument')",
    "import otel_train; otel_train.Instrumentation",
])
def test_otel_train_instrument_stays_the_function(first: str) -> None:
    done = _python(PUBLIC_API.format(first=first))
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "ok"


def test_unknown_attribute_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        otel_train.no_such_name  # noqa: B018
