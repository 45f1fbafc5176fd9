"""Minimum description length of a probing task: the online code of Voita & Titov (2020).

How many bits the labels cost when each block of examples is sent with a probe fitted on the blocks
already sent (`mdl_online_code`); compression = uniform code length / online code length. Every
block's probe is the batched probe of `probes.core.fitting`, all layers at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from probes.core.fitting import (
    ProbeConfig,
    evaluate_heads,
    fit_layer_group,
    label_tensor,
    layer_tensor,
    merge_config,
    standardisation,
)
from workbench.errors import ConfigError
from workbench.progress import progress


MDL_FRACTIONS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)


@dataclass
class MDLResult:
    """Online code (Voita & Titov 2020), per layer. Code lengths in bits."""

    layers: np.ndarray  # [L]
    online_codelength: np.ndarray  # [L]
    uniform_codelength: float  # N log2 C
    compression: np.ndarray  # [L] uniform / online
    block_ends: np.ndarray  # [T] cumulative example counts at the timestamps
    block_codelengths: np.ndarray  # [L, T]: block 0 = uniform code, block i = cost under the model fitted on blocks < i
    num_classes: int
    num_examples: int


def mdl_online_code(
    x,
    y,
    num_classes: int | None = None,
    layers: Sequence[int] | None = None,
    fractions: Sequence[float] = MDL_FRACTIONS,
    config: ProbeConfig | Mapping[str, Any] | None = None,
    seed: int = 0,
    holdout: float = 0.1,
    **overrides,
) -> MDLResult:
    """Online code length of labels `y` given features `x` ([L, N, H]), all layers batched.

    Voita & Titov (2020): shuffle the examples (seeded), cut at the timestamps t_1 < ... < t_T = N
    (fractions of the data), send the first t_1 labels with the uniform code (log2 C bits each),
    then for each i train a probe on the first t_i examples and pay -log2 p(y | x) for examples
    t_i+1 .. t_{i+1}. Compression = N log2 C / online code length.

    The probe is `config`'s kind: the linear probe, or (`kind: mlp`, the syntax probes'
    `mdl_probe: mlp`) Hewitt & Liang (2019)'s MLP probe with one ReLU hidden layer of
    `config.hidden` units, the probe family Voita & Titov report their headline code lengths with
    (their width and layer count may differ from ours: we use the workbench's MLP probe as it is).

    Choices of ours: each block's probe is our batched probe with `config`, early-stopped on the
    held-out loss of the last `holdout` share of its own prefix (data already transmitted, so the
    code stays decodable; without it a probe fitted on noise overfits and codes worse than
    uniform), checked every 5 iterations when the block fits with L-BFGS and every epoch when its
    features are large enough for "auto" to take Adam (`fitting.AUTO_LBFGS_MAX_ENTRIES`); feature
    standardisation uses all x, which the receiver knows (only labels are transmitted).
    """
    cfg = merge_config(config, overrides, defaults={"stop_on": "loss", "eval_every": 5})
    n_layers = x.shape[0]
    layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    y_all, c = label_tensor(y, x.shape[1], num_classes, "y")
    n = len(y_all)
    fr = np.asarray(fractions, dtype=np.float64)
    if (np.diff(fr) <= 0).any() or fr[-1] != 1.0 or fr[0] <= 0:
        raise ConfigError(f"MDL fractions must increase strictly to 1.0, got {fractions}")
    ends = np.unique(np.clip(np.round(fr * n).astype(np.int64), 1, n))
    perm = np.random.default_rng(seed).permutation(n)
    group = cfg.layer_batch or len(layers)
    codes = np.zeros((len(layers), len(ends)))
    codes[:, 0] = ends[0] * math.log2(c)
    for g in range(0, len(layers), group):
        sel = layers[g : g + group]
        xg = layer_tensor(x, sel, cfg.device)[:, torch.as_tensor(perm)]
        yg = y_all[torch.as_tensor(perm)].to(cfg.device)
        stats = standardisation(xg, cfg.standardize)
        for i in progress(range(len(ends) - 1), desc="MDL blocks", disable=not cfg.progress, leave=False):
            a, b = int(ends[i]), int(ends[i + 1])
            block_cfg = replace(cfg, seed=cfg.seed + i)
            n_hold = int(round(holdout * a)) if cfg.early_stopping and a >= 10 else 0
            fit_x, fit_y = xg[:, : a - n_hold], yg[: a - n_hold]
            dev_x, dev_y = (xg[:, a - n_hold : a], yg[a - n_hold : a]) if n_hold else (None, None)
            fitted = fit_layer_group(fit_x, fit_y, dev_x, dev_y, c, list(range(len(sel))), block_cfg, stats=stats)
            logp, _, _, _ = evaluate_heads(fitted["module"], xg[:, a:b], None, want_logp=True)
            nll = -logp.gather(-1, yg[a:b].view(1, -1, 1).expand(len(sel), -1, 1)).squeeze(-1)
            codes[g : g + len(sel), i + 1] = (nll.sum(1) / math.log(2)).cpu().numpy()
    online = codes.sum(1)
    uniform = n * math.log2(c)
    return MDLResult(
        layers=np.asarray(layers), online_codelength=online, uniform_codelength=uniform,
        compression=uniform / online, block_ends=ends, block_codelengths=codes, num_classes=c, num_examples=n,
    )  # fmt: skip
