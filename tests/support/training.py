"""A tiny real training loop for tests: model, optimizer, DataLoader, and the loop itself."""

from __future__ import annotations

import logging
from typing import Any

import structlog
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

user_log = logging.getLogger("user.training")


class LoggingMLP(nn.Module):
    """An MLP whose forward writes a log line, to check ids inside the forward span."""

    def __init__(self, log_in_forward: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.log_in_forward = log_in_forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.log_in_forward:
            user_log.warning("inside forward")
        return self.net(x)


def setup(batches: int = 8, batch_size: int = 4, log_in_forward: bool = False,
          workers: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, DataLoader]:
    torch.manual_seed(0)
    model = LoggingMLP(log_in_forward)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(batches * batch_size, 8), torch.randn(batches * batch_size, 1))
    return model, opt, DataLoader(data, batch_size=batch_size, num_workers=workers)


def train(model: Any, opt: torch.optim.Optimizer, loader: DataLoader, accumulate: int = 1,
          log_after_step: bool = False, epochs: int = 1) -> int:
    """Plain loop; returns the number of optimizer steps taken."""
    steps = 0
    for _ in range(epochs):
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y) / accumulate
            loss.backward()
            if (i + 1) % accumulate == 0:
                opt.step()
                opt.zero_grad()
                steps += 1
                if log_after_step:
                    user_log.warning("after step %d", steps)
                    structlog.get_logger("user").warning("structlog after step", n=steps)
    return steps


def one_step(model: Any, opt: torch.optim.Optimizer, batch: Any) -> None:
    """One optimizer step on one batch (a loop written by hand, batch by batch)."""
    x, y = batch
    nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.zero_grad()
