"""otel-train: OpenTelemetry observability for distributed PyTorch training.

    import otel_train
    with otel_train.instrument(model):
        for batch in loader:
            loss = model(batch).loss; loss.backward(); opt.step(); opt.zero_grad()

Every sampled step becomes one trace shared by all ranks, with a span per rank and per
phase; step and phase histograms carry exemplars of those traces; log lines carry their
trace and span ids. See README.md for configuration.
"""

from otel_train.config import Config, ConfigWarning
from otel_train.instrument import Instrumentation, instrument

__all__ = ["Config", "ConfigWarning", "Instrumentation", "instrument"]
__version__ = "0.1.0"
