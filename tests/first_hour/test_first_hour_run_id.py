"""Ranks agree on one run id on a plain install, which has no numpy."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import otlp_files

from otel_train import semconv

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

# One gloo rank of a two-rank job, with numpy unimportable as on a fresh `pip install -e .`
# (torch does not depend on numpy). Prints what instrument() agreed on.
RANK_SCRIPT = """
import sys
sys.modules["numpy"] = None  # `import numpy` now raises ImportError, as without numpy
import json, warnings
import torch, torch.distributed as dist
import otel_train

dist.init_process_group("gloo")
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with otel_train.instrument(model, optimizer=opt, output_dir=sys.argv[1]) as inst:
        for _ in range(3):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
print(json.dumps({"rank": dist.get_rank(), "run_id": inst.run_id,
                  "warnings": [str(w.message) for w in caught]}))
dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OTEL_", "TORCHELASTIC_")) and k != "TRACEPARENT"}
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(port), OTEL_TRAIN_EXPORTER="file",
               PYTHONPATH=str(REPO))
    return env


def test_ranks_agree_on_a_run_id_without_numpy(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out_dir = tmp_path / "runs"
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, str(script), str(out_dir)],
                              env=_rank_env(rank, port), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    reports = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr[-4000:]
        reports.append(json.loads(stdout.strip().splitlines()[-1]))

    for report in reports:
        assert not [w for w in report["warnings"] if "could not start" in w], report
    run_ids = {report["run_id"] for report in reports}
    assert len(run_ids) == 1 and None not in run_ids, reports
    (run_id,) = run_ids
    ranks = {int(otlp_files.attrs(span)[semconv.ATTR_RANK])
             for span in otlp_files.spans(out_dir / run_id)
             if span["name"] == semconv.SPAN_RANK_STEP}
    assert ranks == {0, 1}
