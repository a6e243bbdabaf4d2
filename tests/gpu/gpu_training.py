"""A small real CUDA training loop for the GPU tests: heavy enough that GPU time shows."""

from __future__ import annotations

import torch
from torch import nn


def setup(width: int = 2048, depth: int = 4, batch: int = 1024, batches: int = 4
          ) -> tuple[nn.Module, torch.optim.Optimizer, list[tuple[torch.Tensor, torch.Tensor]]]:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(width, 1)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    data = [(torch.randn(batch, width, device="cuda"), torch.randn(batch, 1, device="cuda"))
            for _ in range(batches)]
    return model, opt, data


def train(model: nn.Module, opt: torch.optim.Optimizer, data: list, steps: int) -> None:
    """No host-device synchronisation of its own: what the sync checks need."""
    for i in range(steps):
        x, y = data[i % len(data)]
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
