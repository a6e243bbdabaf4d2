"""Every private torch API otel-train touches is probed against the installed torch
(otel_train/torch_compat.py): a release that moves one fails here, by name, with the reason
otel-train needs it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from otel_train import torch_compat

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(torch_compat.PROBES))
def test_the_installed_torch_has_each_private_api(name: str) -> None:
    why, present = torch_compat.PROBES[name]
    if name in torch_compat.CUDA_ONLY and torch.version.cuda is None:
        pytest.skip(f"{name}: a CUDA build of torch only")
    assert present(), f"torch {torch.__version__} lacks {name} ({why}): update torch_compat"


def test_every_private_torch_name_is_reached_through_torch_compat() -> None:
    """No module but torch_compat names torch's private modules or attributes."""
    pattern = re.compile(r"torch\.[\w.]*\b_[a-z]\w*|from torch\._|_BaseDataLoaderIter|"
                         r"\._compiled_call_impl\b|\._task_info|\._rcvd_idx|\.pg_map|"
                         r"\._call_impl\b|_get_default_store|_get_object_coll_device|"
                         r"_get_ddp_logging_data|\b_comm_hooks\b")
    found = []
    for path in sorted((ROOT / "otel_train").rglob("*.py")):
        if path.name == "torch_compat.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if '"' in code or "'" in code or "``" in line:  # texts and docs may name them
                continue
            if pattern.search(code):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_supported_torch_range_is_said_once_everywhere() -> None:
    least = ".".join(map(str, torch_compat.MIN_TORCH))
    pyproject = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+)
    assert re.findall(r'"torch>=([\d.]+)"', pyproject) == [least], pyproject
    assert f"torch {least} and later" in (ROOT / "README.md").read_text()
    assert torch_compat.torch_version() >= torch_compat.MIN_TORCH
