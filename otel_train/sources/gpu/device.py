"""Which CUDA device a run trains on, decided once at start without touching the GPU.

The GPU sources switch themselves on only where the run already uses CUDA: a CPU run on a
machine with GPUs must not get a CUDA context (hundreds of MB) from its telemetry.
"""

from __future__ import annotations

from typing import Any

import torch


def training_device(model: Any = None) -> int | None:
    """The CUDA device index the run trains on, or None (CPU, or CUDA not in use yet)."""
    if not torch.cuda.is_available():
        return None
    if model is not None:
        try:
            for param in model.parameters():
                device = param.device
                if device.type == "cuda":
                    return device.index if device.index is not None else 0
                if device.type != "meta":
                    return None
        except Exception:  # an unusual module: fall back to the process's state
            pass
    if torch.cuda.is_initialized():
        return torch.cuda.current_device()
    return None
