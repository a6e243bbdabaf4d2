"""What the tests share: helpers, fixtures' building blocks and the scripts ranks run.

Imported as ``from support import otlp_files`` (``tests/`` is on ``sys.path``: pytest's
``pythonpath`` setting in pyproject.toml, and ``PYTHONPATH`` for the processes tests start,
which set it to the repository root and ``tests/``).

- ``binaries``: the external binaries a test needs (skip locally, fail in CI)
- ``waits``: waits on a condition with a deadline (``wait_for``), and on the emitter's
  passes (``emitter_passes``): never a fixed delay, which a loaded machine outlasts
- ``otlp_files``: OTLP JSON lines read back, over the package's own reader
- ``training``: the small models and loops the tests train
- ``torchrun_train``, ``sigkill_train``, ``sigterm_train``: scripts started by path
- ``report_fixtures``, ``report_golden``: synthetic runs for the report and the checker
- ``damage``: a run directory's files damaged on purpose (bytes appended, a line torn, ...)
- ``pipeline_fixtures``, ``collector_faults``, ``alert_replay``, ``loki_standin``: the real
  collector and Prometheus, the faults put in their way, and a Loki stand-in
"""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
