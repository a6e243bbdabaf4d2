"""External binaries (the collector built from ``collector/``, Prometheus, promtool,
kustomize, chromium) may be absent on a developer's machine: tests that need one call
``require_binary``, which skips locally but fails when ``OTEL_TRAIN_REQUIRE_BINARIES=1``
(``.ci/run`` sets it), so CI can never pass by skipping.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest


def binaries_required() -> bool:
    return os.environ.get("OTEL_TRAIN_REQUIRE_BINARIES", "") not in ("", "0", "false")


def require_binary(name: str, env_var: str | None = None, default: Path | None = None) -> str:
    """Path of binary ``name`` (from ``env_var``, ``default``, or PATH), else skip or fail."""
    candidates = []
    if env_var and os.environ.get(env_var):
        candidates.append(os.environ[env_var])
    if default is not None:
        candidates.append(str(default))
    for candidate in candidates:
        if Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found:
        return found
    message = f"binary {name!r} not found (set {env_var or 'PATH'})"
    if binaries_required():
        pytest.fail(message + " and OTEL_TRAIN_REQUIRE_BINARIES=1 forbids skipping")
    pytest.skip(message)
