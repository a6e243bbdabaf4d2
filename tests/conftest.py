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


#: the modules whose tests wait on time or on a background thread (an emitter pass, a
#: sampler's tick, a server's scrape or evaluation, an exporter process's restart): marked
#: ``timing``, they run again beside two CPU hogs in CI (scripts/test.sh). Each waits on a
#: condition with a deadline (tests/support/waits.py), never on a fixed delay or a rate.
TIMING_MODULES = frozenset({
    "tests/sdk/test_wakeups.py",
    "tests/sdk/test_exporter_process.py",
    "tests/sdk/test_reliability.py",
    "tests/sdk/test_instrument.py",
    "tests/sdk/test_source_interface.py",
    "tests/sdk/test_tracker_core.py",
    "tests/sdk/test_series_budget.py",
    "tests/sdk/test_semconv_metrics.py",
    "tests/check/test_check_prometheus.py",
    "tests/collectives/test_nccl_plugin.py",
    "tests/first_hour/test_readme_claims.py",
})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        if item.get_closest_marker("idle_only") is not None:
            continue  # its precondition does not hold beside the hogs: it says why
        if item.path.relative_to(root).as_posix() in TIMING_MODULES:
            item.add_marker(pytest.mark.timing)
