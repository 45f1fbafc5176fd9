"""Dropout with a cheaper mask on CPU: the one home of the training step's dropout masks.

Dropout (Srivastava et al. 2014): in training, each element is kept independently with probability
1 - p and scaled by 1 / (1 - p), else zeroed. torch draws the CPU mask with `bernoulli_`, one 32-bit
draw of its Mersenne Twister per element (plus a float conversion); on the 2-core Intel Xeon with
AMX that was 20% of the training step's CPU time (docs/benchmarks.md). Here the mask is drawn as
16-bit uniform integers, four per 64-bit output of numpy's PCG64 (O'Neill 2014; `random_raw`), each
element kept when its integer is below round((1 - p) * 65536): the keep probability is quantised
to 1/65536 (|rate - (1 - p)| <= 2^-17, e.g. 0.899994 for p = 0.1), every element independent.

Reproducible and resumable: each call seeds a fresh PCG64 stream with one 63-bit draw from torch's
default generator, so `torch.manual_seed` fixes every mask and the training checkpoint's torch RNG
state (which already covers dropout) covers these too; no mask is reused across calls or layers.
On other devices (CUDA: Philox, already fast) and outside training it is plain `F.dropout`.

`FastDropout` is an `nn.Dropout` (same `p`, same `inplace` flag, so code that reads `.p` or checks
`isinstance(m, nn.Dropout)` is unaffected); `use_fast_dropout(model)` swaps every `nn.Dropout`
module of a model for one. Attention-probability dropout that a model applies functionally (HF's
eager/SDPA attention functions) is not a module and is not swapped.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

KEEP_RESOLUTION = 65536  # the keep probability is a multiple of 1 / 65536


def keep_threshold(p: float) -> int:
    """The 16-bit threshold: an element is kept when its uniform integer in [0, 65536) is below it."""
    return int(round((1.0 - p) * KEEP_RESOLUTION))


def keep_mask(shape: torch.Size | tuple[int, ...], p: float, device: torch.device | str = "cpu") -> torch.Tensor:
    """A bool mask of `shape`, each element True independently with probability keep_threshold(p) / 65536."""
    n = int(np.prod(shape)) if len(shape) else 1
    seed = int(torch.randint(0, 2**63 - 1, (1,), dtype=torch.int64))  # from torch's default generator
    words = np.random.PCG64(seed).random_raw((n + 3) // 4)  # uint64: four 16-bit lanes each
    # as int16 the lanes are uniform on [-32768, 32768), so "below t - 32768" has probability t / 65536
    lanes = torch.from_numpy(words.view(np.int16)[:n])
    return (lanes < keep_threshold(p) - 32768).view(shape).to(device)


class _KeepAndScale(torch.autograd.Function):
    """x * mask / (1 - p), saving only the bool mask for the backward (as `native_dropout` does)."""

    @staticmethod
    def forward(ctx, x, mask, scale):
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return torch.where(mask, x, 0).mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return torch.where(mask, grad, 0).mul_(ctx.scale), None, None


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`F.dropout(x, p, training)` with the 16-bit PCG64 mask on CPU (module doc); F.dropout elsewhere."""
    if not training or p == 0.0 or x.device.type != "cpu":
        return nn.functional.dropout(x, p, training)
    if p >= 1.0:
        return x * 0.0
    return _KeepAndScale.apply(x, keep_mask(x.shape, p), 1.0 / (1.0 - p))


class FastDropout(nn.Dropout):
    """`nn.Dropout` whose training mask comes from `workbench.dropout.dropout` (never in place)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def use_fast_dropout(model: nn.Module) -> int:
    """Replace every `nn.Dropout` module in `model` by a `FastDropout` with the same p; returns how many."""
    swapped = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Dropout:
                setattr(module, child_name, FastDropout(child.p, child.inplace))
                swapped += 1
    return swapped
