"""Seeded construction of tiny models for the tests (one helper, imported by conftest and the tests)."""

from __future__ import annotations

from typing import Callable

import torch


def seeded(seed: int, make: Callable[[], torch.nn.Module]) -> torch.nn.Module:
    """`make()` under torch's global generator seeded with `seed`, in eval mode; the caller's random
    state is restored after (`torch.random.fork_rng`), so building a model draws nothing from it."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return make().eval()
