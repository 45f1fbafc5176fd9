"""A scalar mix over layers (Peters et al. 2018) and where in depth a task is read (Tenney et al. 2019).

A linear probe on a learned softmax-weighted sum of all layers gives the mixing weights and their
centre of gravity; the cumulative mixes of layers 0..l give Tenney et al.'s differential scores and
expected layer (`fit_scalar_mix`, `centre_of_gravity`, `expected_layer`). The mixes are heads of
the batched program of `probes.core.fitting`, trained by its loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np
import torch
from torch import nn

from probes.core.fitting import (
    Heads,
    ProbeConfig,
    evaluate_heads,
    label_tensor,
    layer_tensor,
    merge_config,
    prior_bias,
    standardisation,
    train_heads,
)


class _ScalarMixHeads(Heads):
    """Head m = softmax regression on gamma_m * sum_l s_ml * z_l, s_m = softmax over allowed layers.

    Peters et al. (2018) mix; `allowed[m]` restricts head m to a subset of layers (Tenney et al.
    2019's cumulative mixes of layers 0..l). Layers are standardised before mixing, as Peters et al.
    found layer normalisation before weighting helpful.
    """

    def __init__(self, allowed: torch.Tensor, h: int, c: int, mu: torch.Tensor, sd: torch.Tensor):
        super().__init__()
        m = allowed.shape[0]
        self.register_buffer("allowed", allowed)
        self.register_buffer("mu", mu)  # [L, H]
        self.register_buffer("sd", sd)
        self.logits = nn.Parameter(torch.zeros(allowed.shape))
        self.gamma = nn.Parameter(torch.ones(m))
        self.w = nn.Parameter(torch.zeros(m, h, c))
        self.b = nn.Parameter(torch.zeros(m, c))

    def penalised(self):
        return [self.w]

    def mix_weights(self) -> torch.Tensor:
        return torch.softmax(self.logits.masked_fill(~self.allowed, float("-inf")), dim=1)

    def forward(self, x):  # x: [L, B, H] raw layers -> [M, B, C]
        z = (x - self.mu.unsqueeze(1)) / self.sd.unsqueeze(1)
        mixed = torch.einsum("ml,lbh->mbh", self.mix_weights() * self.gamma.unsqueeze(1), z)
        return torch.baddbmm(self.b.unsqueeze(1), mixed, self.w)


@dataclass
class ScalarMixResult:
    """Scalar mixes over layers (Peters et al. 2018; Tenney et al. 2019).

    Head l mixes layers 0..l (the cumulative probes); the last head mixes all layers and gives the
    mixing weights and centre of gravity.
    """

    weights: np.ndarray  # [L] softmax weights of the all-layer mix
    gamma: float
    centre_of_gravity: float  # sum_l l * s_l
    cumulative_weights: np.ndarray  # [L, L] row l: weights of the mix of layers 0..l
    cumulative_dev_accuracy: np.ndarray  # [L] score(l) of the probe on layers 0..l
    deltas: np.ndarray  # [L] Delta_l = score(l) - score(l-1) (Delta_0 = 0)
    expected_layer: float  # sum l Delta_l / sum Delta_l
    dev_accuracy: float  # of the all-layer mix


def centre_of_gravity(weights) -> float:
    """Tenney et al. (2019): E_s[l] = sum_l l * s_l of the scalar-mix weights."""
    w = np.asarray(weights, dtype=np.float64)
    return float((np.arange(len(w)) * w).sum() / w.sum())


def expected_layer(scores) -> tuple[np.ndarray, float]:
    """Tenney et al. (2019) cumulative scoring: Delta_l = score(l) - score(l-1), E[l] = sum l Delta_l / sum Delta_l.

    `scores[l]` is the score of a probe on the mix of layers 0..l. Returns (deltas with Delta_0 = 0,
    expected layer); NaN when the deltas sum to zero.
    """
    s = np.asarray(scores, dtype=np.float64)
    deltas = np.concatenate([[0.0], np.diff(s)])
    total = deltas[1:].sum()
    return deltas, float((np.arange(len(s)) * deltas).sum() / total) if total != 0 else float("nan")


def fit_scalar_mix(
    x_train,
    y_train,
    x_dev,
    y_dev,
    num_classes: int | None = None,
    config: ProbeConfig | Mapping[str, Any] | None = None,
    **overrides,
) -> ScalarMixResult:
    """Learn softmax layer weights jointly with a linear probe on the mix; all cumulative mixes at once.

    One batched program with L+1 heads: head l is a linear probe on gamma * sum_{j<=l} s_j z_j (z_j =
    standardised layer j). The all-layer head gives the weights and centre of gravity; the heads'
    dev accuracies give Tenney et al.'s differential scores and expected layer. Trained with Adam
    (the mix makes the problem non-convex), early stopping per head on dev loss by default (accuracy
    saturates long before the mix weights settle).
    """
    cfg = merge_config(config, overrides, defaults={"stop_on": "loss", "batch_size": 512, "min_steps": 1000})
    cfg = replace(cfg, optimizer="adam", lr=cfg.lr or 1e-2)
    y_tr, c = label_tensor(y_train, x_train.shape[1], num_classes, "y_train")
    c = max(c, int(np.max(y_dev)) + 1) if num_classes is None and len(y_dev) else c
    y_dv = label_tensor(y_dev, x_dev.shape[1], c, "y_dev")[0].to(cfg.device)
    n_layers = x_train.shape[0]
    x = layer_tensor(x_train, range(n_layers), cfg.device)
    xd = layer_tensor(x_dev, range(n_layers), cfg.device)
    mu, sd = standardisation(x, True)
    allowed = torch.tril(torch.ones(n_layers, n_layers, dtype=torch.bool))
    module = _ScalarMixHeads(allowed, x.shape[2], c, mu, sd)
    prior_bias(module, y_tr, c)
    module.to(cfg.device)
    train_heads(module, x, y_tr.to(cfg.device), xd, y_dv, cfg, torch.Generator().manual_seed(cfg.seed))
    _, _, acc, _ = evaluate_heads(module, xd, y_dv)
    acc = acc.cpu().numpy()
    with torch.no_grad():
        weights = module.mix_weights().cpu().numpy()
    deltas, expected = expected_layer(acc)
    return ScalarMixResult(
        weights=weights[-1], gamma=float(module.gamma[-1].detach()), centre_of_gravity=centre_of_gravity(weights[-1]),
        cumulative_weights=weights, cumulative_dev_accuracy=acc, deltas=deltas, expected_layer=expected,
        dev_accuracy=float(acc[-1]),
    )  # fmt: skip
