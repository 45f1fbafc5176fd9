"""Tolerances derived from the computation, for tests that compare two code paths in float32.

Two evaluations of one model on bit-identical weights can differ in the last bits when the weights
sit in different buffers (a model reloaded from safetensors against the one in memory, a block
copied into a new module): the BLAS kernel picks its blocking and vector tails by the buffers'
alignment and by the CPU kind, so the same sums are added in another order. Measured on an AMD
EPYC: 7.5e-9 on logits of ~0.04 (relative 2e-7); on an Intel Xeon the same pair was bit-identical.

The bound used is the one for reordered float32 sums (Higham 2002, recursive summation: a sum of K
terms carries a relative error of at most ~K * eps), accumulated over the model's `depth` layers of
width K. It is a worst case, tight enough that any real difference (a wrong layer, a missing
weight, another attention mask) fails it by orders of magnitude, and the weights themselves are
compared bit for bit where the test is about copying them.
"""

from __future__ import annotations

import torch

EPS32 = torch.finfo(torch.float32).eps


def reorder_tolerance(config) -> float:
    """Relative tolerance for one forward pass of a transformers model of this config in float32."""
    width = max(getattr(config, name, 0) or 0 for name in
                ("hidden_size", "intermediate_size", "dim", "hidden_dim", "n_embd", "d_model", "d_ff"))
    depth = (getattr(config, "num_hidden_layers", None) or getattr(config, "n_layers", None)
             or getattr(config, "n_layer", None) or getattr(config, "num_layers", None) or 1) + 1
    return depth * width * EPS32


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    """The two models hold the same tensors, bit for bit."""
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys(), sorted(set(sa) ^ set(sb))
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


def assert_same_outputs(actual: torch.Tensor, expected: torch.Tensor, config) -> None:
    """`actual` equals `expected` up to a reordering of float32 sums in a model of `config`'s shape."""
    scale = expected.detach().abs().max().item()
    torch.testing.assert_close(actual, expected, rtol=0, atol=reorder_tolerance(config) * max(scale, 1e-6))
