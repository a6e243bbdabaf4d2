"""otel-train: OpenTelemetry observability for distributed PyTorch training.

    import otel_train
    with otel_train.instrument(model):
        for batch in loader:
            loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()

Every sampled step becomes one trace shared by all ranks, with a span per rank and per
phase; step and phase histograms carry exemplars of those traces; log lines carry their
trace and span ids. See README.md for configuration.

The public names load on first use (PEP 562), so ``import otel_train`` imports neither torch
nor the OpenTelemetry SDK: ``otel-train report`` and ``check`` start fast and read runs on a
machine without torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and editors see; at run time these load lazily
    from otel_train.config import Config, ConfigWarning
    from otel_train.instrument import Instrumentation, instrument
    from otel_train.regions import region

from otel_train._version import __version__

__all__ = ["Config", "ConfigWarning", "Instrumentation", "__version__", "instrument", "region"]

#: public name -> the submodule that defines it
_LAZY = {
    "Config": "otel_train.config",
    "ConfigWarning": "otel_train.config",
    "Instrumentation": "otel_train.instrument",
    "instrument": "otel_train.instrument",
    "region": "otel_train.regions",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The package module, keeping ``otel_train.instrument`` the function.

    ``instrument`` is both the public function and the submodule ``otel_train/instrument.py``.
    Importing a submodule makes the import system set it as an attribute of its package, so
    the first ``import otel_train.instrument`` (ours, lazily, or a user's) would replace the
    function with the module and break ``otel_train.instrument(model)``. The function wins;
    the module stays reachable as ``sys.modules["otel_train.instrument"]``.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "instrument" and isinstance(value, types.ModuleType):
            value = value.instrument
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
