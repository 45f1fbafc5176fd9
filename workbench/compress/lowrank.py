"""Low rank: each dense weight of the transformer blocks replaced by its best rank-r approximation.

Truncated SVD (Eckart-Young: the rank-r approximation of least Frobenius error), W (out x in) =
U S V^T ~ (U_r S_r)(V_r^T), of the same prunable set as unstructured pruning
(`workbench.compress.unstructured.dense_layers`). Two forms:

- `lowrank_product(model, rank)`: the rank-r product stored back into the same shapes, so the model
  stays a plain transformers checkpoint that every probe reads (what the sweep saves);
- `factorize(model, rank)`: each layer replaced by two smaller Linear layers (in -> r, r -> out,
  the bias on the second): r(in + out) weights instead of in * out, what the savings are.

A rank-r factorisation of an m x n matrix keeps r(m + n) numbers, the same as magnitude pruning
that matrix to sparsity 1 - r(m + n)/(mn) (`equal_parameter_sparsity`): the sweep compares the two
at equal parameter counts (the "replacing matrices with smaller matrices" of the seed question;
cf. Noach & Goldberg 2020, low-rank BERT compression).
"""

from __future__ import annotations

import torch

from workbench.compress.unstructured import dense_layers, output_axis
from workbench.errors import ConfigError


def _as_out_in(module: torch.nn.Module) -> torch.Tensor:
    w = module.weight.detach().float()
    return w if output_axis(module) == 0 else w.t()


def svd_factors(weight: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, B) with A = U_r S_r (out x r) and B = V_r^T (r x in): A @ B is the best rank-r
    approximation of `weight` (out x in)."""
    if rank < 1 or rank > min(weight.shape):
        raise ConfigError(f"rank must be from 1 to {min(weight.shape)} for a {tuple(weight.shape)} matrix, got {rank}")
    u, s, vh = torch.linalg.svd(weight.double(), full_matrices=False)
    return (u[:, :rank] * s[:rank]).float(), vh[:rank].float()


def lowrank_product(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """Each prunable weight replaced in place by its rank-`rank` product (same shapes); a matrix
    whose factors would not be smaller (r(m + n) >= mn, as `factorize` decides) is left as it is,
    so the point matches its equal-parameter magnitude twin matrix by matrix. Returns `model`."""
    with torch.no_grad():
        for module in dense_layers(model).values():
            w = _as_out_in(module)
            m, n = w.shape
            if rank * (m + n) >= m * n:
                continue
            a, b = svd_factors(w, rank)
            approx = a @ b
            module.weight.copy_((approx if output_axis(module) == 0 else approx.t()).to(module.weight.dtype))
    return model


class Factorized(torch.nn.Module):
    """A dense layer as two: x -> x B^T (r features) -> A (out) + bias."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.down = torch.nn.Linear(b.shape[1], b.shape[0], bias=False)
        self.up = torch.nn.Linear(a.shape[1], a.shape[0], bias=bias is not None)
        with torch.no_grad():
            self.down.weight.copy_(b)
            self.up.weight.copy_(a)
            if bias is not None:
                self.up.bias.copy_(bias)

    def forward(self, x):
        return self.up(self.down(x))


def factorize(model: torch.nn.Module, rank: int) -> torch.nn.Module:
    """Replace each prunable dense layer of `model` (in place) by a `Factorized` pair at `rank`,
    where that saves parameters (r(in + out) < in * out). Returns `model`."""
    modules = dict(model.named_modules())
    for module in list(dense_layers(model).values()):
        w = _as_out_in(module)
        m, n = w.shape
        if rank * (m + n) >= m * n:
            continue
        a, b = svd_factors(w, rank)
        owner_name = next(k for k, v in modules.items() if v is module)
        parent_name, _, attr = owner_name.rpartition(".")
        parent = modules[parent_name] if parent_name else model
        bias = module.bias.detach().float() if getattr(module, "bias", None) is not None else None
        setattr(parent, attr, Factorized(a, b, bias).to(module.weight.device))
    return model


def equal_parameter_sparsity(shape: tuple[int, int], rank: int) -> float:
    """The sparsity at which magnitude pruning of a matrix of `shape` keeps as many numbers as its
    rank-`rank` factorisation: 1 - r(m + n)/(mn), and 0 where the factors are not smaller."""
    m, n = shape
    return max(0.0, 1.0 - rank * (m + n) / (m * n))


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
