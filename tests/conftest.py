"""Fixtures shared across the test folders (helpers live in ``tests/support/``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist
from support.pipeline_fixtures import free_port


@pytest.fixture
def single_rank_group() -> Iterator[None]:
    """A one-rank gloo process group in this process, destroyed afterwards."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()
