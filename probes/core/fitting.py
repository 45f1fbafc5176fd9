"""Probes fitted for every layer at once: linear and MLP classifiers as one batched tensor program.

Every probe package (syntax, coreference, ...) gets word features of shape `[L, N, H]` (layer-major,
as `workbench.activations` stores them) and integer labels. A linear probe (softmax regression with
L2; the linear classifier probes of Alain & Bengio 2017) or an MLP probe (one hidden layer, Hewitt &
Liang 2019) is fitted for ALL layers as one program: weights `[L, H, C]` and `torch.bmm`, one
optimiser, so fitting 13 layers costs one pass over the data per step instead of 13 (`fit_probe`);
a task and its control task, and several seeds, can share that program too (`fit_probe_tasks`).
Features too large for memory come as `LazyFeatures`, built one layer at a time.

The batched heads and their training loop (`Heads`, `train_heads`, `evaluate_heads`, per-head early
stopping) are also what MDL (`probes.core.mdl`) and the scalar mix (`probes.core.scalar_mix`) fit.

Objective of the linear probe (per layer): mean cross-entropy + lambda/2 * ||W||^2 (bias not
penalised). scikit-learn's LogisticRegression minimises C * sum CE + 1/2 ||W||^2, the same
minimiser when C = 1 / (lambda * N_train) (`sklearn_C`).

Optimiser (`ProbeConfig.optimizer`, "auto" by default, `resolved_config`): full-batch L-BFGS to
convergence where one layer's training features are small (it reads them a few hundred times,
which costs nothing there, and reaches the exact minimiser), minibatch Adam with early stopping
above, which reads them ~8 times, then up to 300 full-batch L-BFGS iterations from its weights
(`polish_heads`, issue 49; 125-300 more reads) (issue 42: on a real model's 31 layers the L-BFGS fit took 2.7x
the forward pass; the jiant / structural-probes tradition fits probes by minibatch SGD too). The
Adam fit of one label set (`fit_probe`) holds ONE float32 copy of the training features, shuffled
and standardised in place (`training_copy`); `fit_probe_tasks` (several label sets and seeds on the
same features) holds the features and one standardised shuffled copy. Both run on
`ProbeConfig.device` ("auto": cuda when present) with every random draw on the CPU, so cpu and cuda
fits differ only in float rounding.

Concerns:
- the probe config: `ProbeConfig`, `resolved_config`, `sklearn_C`, `merge_config`, `config_dict`
- the batched heads and their training loop (also MDL's and the scalar mix's): `Heads`,
  `evaluate_heads`, `lbfgs_block`, `train_heads`, `polish_heads`, `prior_bias`
- features in memory (standardised, layer by layer, pages released): `standardisation`,
  `release_file_pages`, `training_copy`, `LazyFeatures`, `layer_tensor`, `label_tensor`
- fitting every layer at once, one task or several: `ProbeResult`, `fit_probe`, `fit_probe_tasks`,
  `fit_layer_group`
"""

from __future__ import annotations

import math
import mmap
import warnings
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from workbench.errors import ConfigError
from workbench.precision import resolve_device
from workbench.progress import progress as progress_bar


# --------------------------------------------------------------------------- configuration


@dataclass
class ProbeConfig:
    """How a probe is fitted. The defaults are the workbench's standard linear probe."""

    kind: str = "linear"  # "linear" | "mlp"
    l2: float = 1e-4  # lambda: mean CE + lambda/2 ||W||^2 (sklearn C = 1/(lambda N))
    optimizer: str = "auto"  # "lbfgs" (full batch, to convergence) | "adam" (minibatch) | "auto" (resolved_config)
    hidden: int = 256  # MLP hidden units
    dropout: float = 0.0  # MLP dropout on the hidden layer
    epochs: int = 6  # adam: epochs (more when needed to reach `min_steps`)
    min_steps: int = 400  # adam: at least this many updates (small data sets need many epochs)
    batch_size: int | None = None  # adam: words per minibatch (None: 128 linear, 256 MLP)
    lr: float | None = None  # adam: peak learning rate, cosine-decayed to 0 (None: 5e-3 linear, 3e-3 MLP)
    checks_per_epoch: int = 1  # adam: dev checks per epoch (early stopping's resolution)
    max_iter: int = 1000  # lbfgs: maximum iterations
    tol: float = 1e-6  # lbfgs: stop when the largest gradient entry is below this
    early_stopping: bool = True  # keep each layer's parameters with the best dev score
    stop_on: str = "auto"  # dev score for early stopping: "accuracy" | "loss" | "auto" (loss for linear Adam fits)
    patience: int = 5  # dev checks without improvement (all layers) before stopping
    eval_every: int = 25  # lbfgs: iterations between dev checks
    polish: int | None = None  # linear adam: then up to this many full-batch L-BFGS iterations from its weights (None: 300; 0: none)
    standardize: bool = True  # z-score each layer with train statistics (folded into the weights)
    layer_batch: int | None = None  # fit this many layers per batched program (None = all)
    seed: int = 0
    device: str = "auto"  # "auto" (cuda when available, else cpu) | "cpu" | "cuda" | "cuda:N" | a torch.device
    progress: bool = False

    def __post_init__(self):
        if self.kind not in ("linear", "mlp"):
            raise ConfigError(f"probe kind must be 'linear' or 'mlp', got {self.kind!r}")
        if self.optimizer not in ("auto", "adam", "lbfgs"):
            raise ConfigError(f"probe optimizer must be 'auto', 'adam' or 'lbfgs', got {self.optimizer!r}")
        if self.stop_on not in ("auto", "accuracy", "loss"):
            raise ConfigError(f"stop_on must be 'auto', 'accuracy' or 'loss', got {self.stop_on!r}")
        if (self.l2 < 0 or self.epochs < 1 or (self.batch_size is not None and self.batch_size < 1)
                or self.max_iter < 1 or self.patience < 1 or self.checks_per_epoch < 1
                or (self.polish is not None and self.polish < 0)):
            raise ConfigError(f"invalid probe config {self}")
        if str(self.device) != "auto":  # a device torch cannot run here is refused now, not after extraction
            try:
                resolve_device(self.device)
            except ConfigError as err:
                raise ConfigError(f"probe {err}") from None


# "auto": full-batch L-BFGS while one layer's training features (words x features) have at most this
# many entries, minibatch Adam above (see resolved_config). 2**21 = e.g. 20,000 words x 104 dims, 2,730 x 768.
AUTO_LBFGS_MAX_ENTRIES = 2**21
# The linear Adam fit's full-batch L-BFGS polish (`ProbeConfig.polish`, `polish_heads`): iterations at most,
# and the words per chunk of its objective's evaluation (bounds the memory beyond the training copy).
DEFAULT_POLISH = 300
POLISH_CHUNK = 8192


def resolved_config(cfg: ProbeConfig, n_train: int, width: int) -> ProbeConfig:
    """The config as fitted: the optimiser of "auto", the device, and the defaults that depend on them.

    "auto" picks by the size of one layer's training features, `n_train` words x `width` features:
    full-batch L-BFGS up to AUTO_LBFGS_MAX_ENTRIES (a few hundred passes over a small array cost
    little, and it reaches the exact minimiser: small problems, the unit tests' tiny models among
    them, keep the fit they always had), minibatch Adam above. Both optimisers' cost grows with the
    number of layers alike, so the rule looks at one layer. MLP probes always take Adam.

    The linear Adam fit's defaults (6 epochs, batch 128, peak lr 5e-3 cosine-decayed, early stopping
    on the dev LOSS) were chosen against L-BFGS run to convergence, layer by layer, on real features
    (SmolLM2 31 x 576 and MPNet 13 x 768, 14k UPOS training words; docs/evidence/real-probe-fit.md)
    and planted ones (tests/test_fast_fit.py): no layer's ACCURACY more than 0.3 points below the
    converged fit, where lr 1e-2 / batch 256 or stopping on dev accuracy (a 0/1 score on ~1.6k stop
    words, its standard error ~0.7 points) left single layers 0.4-0.7 points below. The dev loss is
    the smooth criterion; L-BFGS fits and MLPs keep dev accuracy, as before. Re-measured against
    L-BFGS that stops on its tolerances (issue 49, `lbfgs_block`): UPOS and XPOS held it, the UPOS
    CONTROL task did not (SmolLM2 layers 0, 1, 3, 6, 7: up to 3.3 points below; six epochs memorise
    fewer random per-type labels than the converged fit). Longer or faster Adam schedules trade one
    for the other (20 epochs at lr 2e-2 reach the control fit but leave MPNet's UPOS 1.1 points below
    converged). So the linear Adam fit now ends with `polish` (default 300, DEFAULT_POLISH) full-batch
    L-BFGS iterations from its weights, each layer keeping the Adam fit or a polish checkpoint by dev
    accuracy (`polish_heads`): the control task reaches the converged fit (MPNet layer 0 needed 300:
    -6.59 -> +0.02 points; 150 left it at -0.47), UPOS keeps its early-stopped fit on almost every layer.
    It costs ~10x the Adam fit's time where the polish stops early (no layer's dev accuracy improves)
    and up to ~50x where it runs (SmolLM2's 31 UPOS layers: 200 iterations, 404 s against 8 s; the
    L-BFGS fit from zero cost ~37x).
    `polish: 0` is the fit before.
    """
    linear = cfg.kind == "linear"
    if cfg.optimizer == "auto":
        small = linear and n_train * width <= AUTO_LBFGS_MAX_ENTRIES
        cfg = replace(cfg, optimizer="lbfgs" if small else "adam")
    minibatch_linear = linear and cfg.optimizer == "adam"
    return replace(
        cfg, device=str(resolve_device(cfg.device)),
        lr=cfg.lr if cfg.lr is not None else (5e-3 if linear else 3e-3),
        batch_size=cfg.batch_size if cfg.batch_size is not None else (128 if linear else 256),
        stop_on=cfg.stop_on if cfg.stop_on != "auto" else ("loss" if minibatch_linear else "accuracy"),
        polish=(cfg.polish if cfg.polish is not None else DEFAULT_POLISH) if minibatch_linear else 0,
    )  # fmt: skip


def sklearn_C(l2: float, n_train: int) -> float:
    """scikit-learn's C for the same minimiser as our lambda on n_train examples."""
    return 1.0 / (l2 * n_train)


def merge_config(config, overrides: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> ProbeConfig:
    """ProbeConfig from (in rising priority) a function's own `defaults`, `config` and keyword overrides,
    its device resolved ("auto" -> cuda or cpu, `resolve_device`) so that callers can use it as is.

    A ProbeConfig object is taken whole (its fields are all explicit); a dict only sets its keys."""
    if isinstance(config, ProbeConfig):
        base = config
    else:
        config = dict(config or {})
        unknown = (set(config) | set(overrides)) - set(ProbeConfig.__dataclass_fields__)
        if unknown:
            raise ConfigError(f"unknown probe config keys {sorted(unknown)}")
        base = ProbeConfig(**{**(defaults or {}), **config})
    cfg = replace(base, **overrides) if overrides else base
    return replace(cfg, device=str(resolve_device(cfg.device)))


def config_dict(config: ProbeConfig) -> dict[str, Any]:
    """The probe config as a plain dict (for run manifests)."""
    return asdict(config)


# --------------------------------------------------------------------------- batched heads
# A "head" is one classifier. Every parameter has the number of heads as its leading dimension,
# so one optimiser step updates all of them and per-head early stopping is a masked copy.


class Heads(nn.Module):
    """M classifiers in one module (every parameter has M as its leading dimension); a subclass says
    which weights the L2 term penalises. `train_heads` fits any such module: the linear and MLP heads
    here, the scalar mixes of `probes.core.scalar_mix`."""

    def penalised(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def penalty(self) -> torch.Tensor:
        """[M]: 1/2 ||W||^2 per head over the penalised weights."""
        return 0.5 * sum(w.pow(2).flatten(1).sum(1) for w in self.penalised())


def _fold(w: torch.Tensor, b: torch.Tensor, mu: torch.Tensor, sd: torch.Tensor):
    """Weights acting on standardised inputs -> weights acting on raw inputs (no [M,N,H] copy)."""
    w_raw = w / sd.unsqueeze(-1)
    b_raw = b - torch.einsum("mh,mhc->mc", mu, w_raw)
    return w_raw, b_raw


class _LinearHeads(Heads):
    """Head m = softmax regression on input layer m."""

    def __init__(self, m: int, h: int, c: int, mu: torch.Tensor, sd: torch.Tensor):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(m, h, c))  # zero start, like sklearn's lbfgs (convex anyway)
        self.b = nn.Parameter(torch.zeros(m, c))
        self.register_buffer("mu", mu)
        self.register_buffer("sd", sd)

    def penalised(self):
        return [self.w]

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [M, B, H] raw -> [M, B, C]
        w, b = _fold(self.w, self.b, self.mu, self.sd)
        return torch.baddbmm(b.unsqueeze(1), x, w)

    def forward_standardised(self, xs: torch.Tensor) -> torch.Tensor:  # [M, B, H] standardised -> [M, B, C]
        return torch.baddbmm(self.b.unsqueeze(1), xs, self.w)

    def export(self) -> dict[str, np.ndarray]:
        w, b = _fold(self.w, self.b, self.mu, self.sd)
        return {"w": w.detach().cpu().numpy(), "b": b.detach().cpu().numpy()}


class _MLPHeads(Heads):
    """Head m = one hidden ReLU layer on input layer m (Hewitt & Liang 2019's MLP probe)."""

    def __init__(self, m, h, c, mu, sd, hidden: int, dropout: float, gen: torch.Generator):
        super().__init__()
        bound1, bound2 = 1 / math.sqrt(h), 1 / math.sqrt(hidden)
        self.w1 = nn.Parameter((torch.rand(m, h, hidden, generator=gen) * 2 - 1) * bound1)
        self.b1 = nn.Parameter((torch.rand(m, hidden, generator=gen) * 2 - 1) * bound1)
        self.w2 = nn.Parameter((torch.rand(m, hidden, c, generator=gen) * 2 - 1) * bound2)
        self.b2 = nn.Parameter(torch.zeros(m, c))
        self.dropout = dropout
        self.gen = gen
        self.register_buffer("mu", mu)
        self.register_buffer("sd", sd)

    def penalised(self):
        return [self.w1, self.w2]

    def forward(self, x):  # raw inputs
        w1, b1 = _fold(self.w1, self.b1, self.mu, self.sd)
        return self._top(torch.relu(torch.baddbmm(b1.unsqueeze(1), x, w1)))

    def forward_standardised(self, xs):
        return self._top(torch.relu(torch.baddbmm(self.b1.unsqueeze(1), xs, self.w1)))

    def _top(self, z):
        if self.training and self.dropout > 0:
            # drawn on the CPU generator whatever the device: the same mask on cpu and cuda
            keep = (torch.rand(z.shape, generator=self.gen) >= self.dropout).to(z.device)
            z = z * keep / (1 - self.dropout)
        return torch.baddbmm(self.b2.unsqueeze(1), z, self.w2)

    def export(self):
        w1, b1 = _fold(self.w1, self.b1, self.mu, self.sd)
        return {k: v.detach().cpu().numpy() for k, v in {"w1": w1, "b1": b1, "w2": self.w2, "b2": self.b2}.items()}


def standardisation(x: torch.Tensor, enabled: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-layer, per-dimension mean and std of `x` [L, N, H] (identity when disabled)."""
    if not enabled:
        return torch.zeros(x.shape[0], x.shape[2]), torch.ones(x.shape[0], x.shape[2])
    return _finish_standardisation(*_moments(x), x.shape[1])


# A dimension whose spread is below this share of its mean (sd < 0.1 |mean|) has its variance recomputed
# from float64 sums (`_moments`).
CANCELLATION_RATIO = 0.1


def _moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum, sum of squares) over the words of `x` [L, N, H] -> [L, H] each, float64.

    Float32 sums in chunks of 2,048 words (cascade summation; var_mean along a strided axis is ~10x
    slower), accumulated in float64. The variance E[x^2] - E[x]^2 then loses digits to cancellation
    where a dimension's mean is large against its spread (a Llama-style model's massive
    activations: mean 10^3 with sd 0.3 gave sd 0.14 at 200k words): a layer holding a dimension with
    sd below `CANCELLATION_RATIO` of its |mean| has both sums recomputed from float64 values (float64
    leaves ~10^-9 of the variance at mean^2/var = 10^7). Other layers keep the float32 sums (the
    fits on them unchanged to the bit; the float64 pass costs ~5x)."""
    total = x.sum(1).double()
    sq = torch.zeros_like(total)
    for chunk in x.split(2048, dim=1):
        sq += chunk.square().sum(1)
    n = max(x.shape[1], 1)
    mean = total / n
    var = sq / n - mean.square()
    risky = (var < (CANCELLATION_RATIO * mean).square()) & (mean != 0)
    for layer in risky.any(1).nonzero().flatten().tolist():
        total[layer] = 0
        sq[layer] = 0
        for chunk in x[layer].split(2048, dim=0):
            c = chunk.double()
            total[layer] += c.sum(0)
            sq[layer] += c.square().sum(0)
    return total, sq


def _finish_standardisation(total: torch.Tensor, sq: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and std [L, H] (float32, on the CPU) from `_moments` of n words; constant dimensions get std 1."""
    n = max(n, 1)
    mu = total.cpu() / n
    sd = (sq.cpu() / n - mu.square()).clamp_min(0).sqrt().float()
    mu = mu.float()
    sd = torch.where(sd > 1e-6 * sd.max().clamp_min(1e-12), sd, torch.ones_like(sd))  # constant dims
    return mu, sd


def _layer_plane(x, layer: int) -> torch.Tensor:
    """Layer `layer` of the features `x` ([L, N, H] numpy, memmap, LazyFeatures or tensor) as a float32
    CPU-or-device tensor [N, H]: a view where the source allows it (a float32 tensor, array or
    memmap), else that one layer converted (half-precision storage, lazy views)."""
    if isinstance(x, torch.Tensor):
        return x[layer].to(torch.float32)
    arr = np.asarray(x[layer], dtype=np.float32)
    with warnings.catch_warnings():  # a read-only memmap view: we never write to it
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr)


def release_file_pages(x) -> bool:
    """Unmap from this process the pages of the read-only memmap behind `x` (a memmap, a slice of one,
    or a view that holds one as `.base` or `.raw`: `probes.syntax.FeatureView`, the bfloat16 cache's
    `Bfloat16Array`), so that reading the features through it does not leave the file resident in this
    process's RSS (RssFile) beside the copy: madvise(MADV_DONTNEED) on a read-only shared file mapping
    only drops page-table entries; the data stay in the OS page cache and a later read maps them again.
    Returns True when a mapping was released (False: no read-only memmap found, nothing done)."""
    a, read_only = x, False
    for _ in range(8):
        if isinstance(a, mmap.mmap):
            if read_only and hasattr(mmap, "MADV_DONTNEED"):
                a.madvise(mmap.MADV_DONTNEED)
                return True
            return False
        if isinstance(a, np.memmap):
            read_only = read_only or a.mode == "r"
        a = getattr(a, "raw", None) if hasattr(a, "raw") else getattr(a, "base", None)
        if a is None:
            return False
    return False


def training_copy(x, layers: Sequence[int], perm: torch.Tensor, device, enabled: bool, stats=None):
    """ONE float32 copy of the training features of `layers`, its words in the order `perm`, standardised
    in place -> (xs [len(layers), N, H] on `device`, mu [L, H], sd [L, H]).

    Minibatch training reads contiguous slices of `xs` (no per-step gather, no per-step fold of mean
    and scale into the weights). The copy is filled one layer at a time straight from the source
    (a view of a float32 array, memmap or tensor; one converted layer otherwise), so the fit holds
    one copy of the features plus at most one layer, not the two full copies (a float32 copy, then a
    shuffled one) it held before; the pages of a memmapped source are released as each layer is
    copied (`release_file_pages`). `stats` (mu, sd) given: used as they are (MDL standardises with all
    of x); else computed per layer from the source in its own order, as `standardisation` does.
    """
    device = torch.device(device)
    n, h = int(x.shape[1]), int(x.shape[2])
    xs = torch.empty(len(layers), n, h, device=device)
    total = sq = None
    if stats is None and enabled:
        total, sq = torch.zeros(len(layers), h, dtype=torch.float64), torch.zeros(len(layers), h, dtype=torch.float64)
    perm = perm.to(device)
    for li, layer in enumerate(layers):
        plane = _layer_plane(x, int(layer))
        if total is not None:
            t, q = _moments(plane.unsqueeze(0))
            total[li], sq[li] = t[0].cpu(), q[0].cpu()
        torch.index_select(plane.to(device), 0, perm, out=xs[li])
        del plane
        release_file_pages(x)  # the source's pages of this layer are in the copy now
    if stats is not None:
        mu, sd = stats
    elif enabled:
        mu, sd = _finish_standardisation(total, sq, n)
    else:
        mu, sd = torch.zeros(len(layers), h), torch.ones(len(layers), h)
    if enabled or stats is not None:
        mu_d, sd_d = mu.to(device), sd.to(device)
        for li in range(len(layers)):  # in place, one layer at a time
            xs[li].sub_(mu_d[li]).div_(sd_d[li])
    return xs, mu, sd


# --------------------------------------------------------------------------- training


def _per_head_ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """[M, B, C] logits, [B] or [M, B] labels -> [M] mean cross-entropy."""
    m, b, c = logits.shape
    y = y.expand(m, b) if y.dim() == 1 else y
    return F.cross_entropy(logits.reshape(m * b, c), y.reshape(-1), reduction="none").view(m, b).mean(1)


@torch.no_grad()
def evaluate_heads(module: nn.Module, x: torch.Tensor, y: torch.Tensor | None, want_logp: bool = False,
                   chunk: int = 8192, standardised: bool = False):
    """(log-probs [M, N, C] or None, predictions [M, N], accuracy [M] or None, mean NLL [M] or None).
    `standardised`: `x` is a `training_copy` (the module's `forward_standardised` reads it)."""
    was = module.training
    module.eval()
    forward = module.forward_standardised if standardised else module
    logps, preds, hits, nll = [], [], 0, 0
    for s in range(0, x.shape[1], chunk):
        logp = torch.log_softmax(forward(x[:, s : s + chunk]), -1)
        pred = logp.argmax(-1)
        preds.append(pred)
        if want_logp:
            logps.append(logp)
        if y is not None:
            yy = y[s : s + chunk] if y.dim() == 1 else y[:, s : s + chunk]
            yy = yy.expand(pred.shape) if yy.dim() == 1 else yy
            hits = hits + (pred == yy).sum(1)
            nll = nll - logp.gather(-1, yy.unsqueeze(-1)).squeeze(-1).sum(1)
    module.train(was)
    pred = torch.cat(preds, dim=1)
    n = max(x.shape[1], 1)
    acc, nll = (hits / n, nll / n) if y is not None else (None, None)
    return (torch.cat(logps, dim=1) if want_logp else None), pred, acc, nll


class _BestTracker:
    """Per-head early stopping on a dev score (higher = better): keep each head's best parameters."""

    def __init__(self, module: nn.Module, m: int, patience: int):
        self.module = module
        self.best = {k: v.detach().clone() for k, v in self._state().items()}
        self.best_score = torch.full((m,), -float("inf"))
        self.best_step = torch.zeros(m, dtype=torch.long)
        self.since = torch.zeros(m, dtype=torch.long)
        self.patience = patience

    def update(self, score: torch.Tensor, step: int) -> bool:
        """Record a dev check; True when every head has waited `patience` checks without improving."""
        score = score.float().cpu()
        better = score > self.best_score + 1e-9
        self.best_score = torch.where(better, score, self.best_score)
        self.best_step = torch.where(better, torch.full_like(self.best_step, step), self.best_step)
        self.since = torch.where(better, torch.zeros_like(self.since), self.since + 1)
        for k, v in self._state().items():
            if v.dim() > 0 and v.shape[0] == len(better) and k not in ("allowed",):
                mask = better.to(v.device).view(-1, *([1] * (v.dim() - 1)))
                self.best[k] = torch.where(mask, v.detach(), self.best[k])
        return bool((self.since >= self.patience).all())

    def _state(self) -> dict[str, torch.Tensor]:
        """The module's tensors with one row per head (a module whose parameters are laid out
        otherwise, `_TaskSeedHeads`, gives that view through `per_head_state`)."""
        if hasattr(self.module, "per_head_state"):
            return self.module.per_head_state()
        return self.module.state_dict()

    def restore(self):
        if hasattr(self.module, "load_per_head_state"):
            self.module.load_per_head_state(self.best)
        else:
            self.module.load_state_dict(self.best)


def _adam_plan(module: nn.Module, cfg: ProbeConfig, n: int, decayed: Sequence[nn.Parameter] = ()):
    """(Adam, its cosine schedule, epochs) for minibatch training on `n` words: at least
    `cfg.epochs` epochs and `cfg.min_steps` steps, the cosine counted in full batches.

    `decayed` parameters get Adam's (coupled) weight decay `cfg.l2`, i.e. the gradient of
    l2/2 ||W||^2 added inside the optimiser's fused kernel instead of a penalty term in the graph."""
    ids = {id(p) for p in decayed}
    groups = [{"params": [p for p in module.parameters() if id(p) not in ids]}]
    if decayed:
        groups.append({"params": list(decayed), "weight_decay": cfg.l2})
    opt = torch.optim.Adam(groups, lr=cfg.lr, fused=True)
    per_epoch = max(1, math.ceil(n / cfg.batch_size))
    epochs = max(cfg.epochs, math.ceil(cfg.min_steps / per_epoch))
    total_steps = epochs * per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s, total_steps) / total_steps)))
    return opt, sched, epochs


def _adam_step(opt: torch.optim.Optimizer, sched, total: torch.Tensor) -> None:
    """One minibatch update on the summed objective `total`, then one step of the schedule."""
    opt.zero_grad()
    total.backward()
    opt.step()
    sched.step()


def _epoch_bounds(n: int, batch_size: int, gen: torch.Generator) -> list[int]:
    """One epoch's batch boundaries over `n` shuffled words: contiguous batches from a random offset,
    so the boundaries move between epochs (the first and last batch may be short)."""
    offset = int(torch.randint(batch_size, (1,), generator=gen)) if n > batch_size else 0
    return [0, *range(offset or batch_size, n, batch_size), n]


# torch's L-BFGS gives one `step` at most `max_eval` function evaluations (default 1.25 x `max_iter`). A
# strong-Wolfe line search on a badly conditioned problem (raw features whose scales differ by 10^3, the
# first iterations of any fit) spends 2-5 per iteration, so a step of 25 iterations ran out of
# evaluations after a dozen (issue 49). 25 per iteration is the line search's own cap (torch's `max_ls`):
# the evaluation budget never binds before the iteration budget, which the dev checks are counted in.
LBFGS_EVALS_PER_ITER = 25
# torch's tolerance on the change of the loss and of the parameters between iterations (float32 losses
# change by at least ~1e-7 relative, so in practice: stop when an iteration no longer changes the loss).
LBFGS_TOL_CHANGE = 1e-12


def lbfgs_block(opt: torch.optim.LBFGS, closure) -> tuple[int, bool]:
    """One `opt.step(closure)` of torch's L-BFGS -> (iterations it made, whether it converged).

    torch returns from a step for one of three reasons: it made `max_iter` iterations, it spent
    `max_eval` function evaluations, or one of its tolerances holds (largest gradient entry <=
    `tolerance_grad`, or an iteration's step or loss change <= `tolerance_change`, or no descent
    direction left; torch/optim/lbfgs.py). Only the last is convergence. torch counts iterations and
    evaluations in its state (`n_iter`, `func_evals`), so the reason is read off the budgets: a step
    that spent neither stopped on a tolerance. Before issue 49 the caller read any step of fewer than
    `max_iter` iterations as converged, which mistook a spent evaluation budget for convergence (a
    raw-feature fit stopped at 24 iterations with its objective 4x the optimum, tests/test_lbfgs.py).
    A step that spent a budget on the very iteration a tolerance was met is read as not converged: the
    next step then returns at once (gradient) or after one iteration (change), converged."""
    group = opt.param_groups[0]
    state = opt.state[group["params"][0]]
    iters, evals = state.get("n_iter", 0), state.get("func_evals", 0)
    opt.step(closure)
    iters, evals = state["n_iter"] - iters, state["func_evals"] - evals
    return iters, iters < group["max_iter"] and evals < group["max_eval"]


def train_heads(module: Heads, x, y, x_dev, y_dev, cfg: ProbeConfig, gen: torch.Generator,
                standardised: bool = False) -> dict[str, Any]:
    """Fit all heads of `module` at once; returns training info (per-head arrays).

    `standardised` (Adam only): `x` is a `training_copy`, already standardised and in training order
    (the caller drew the permutation from `gen`), and the steps call `module.forward_standardised`;
    otherwise the Adam path makes its own shuffled copy of `x` (the scalar mix's raw layers)."""
    cfg = resolved_config(cfg, x.shape[1], x.shape[2])  # a caller's ProbeConfig may leave defaults open
    m = module.penalty().shape[0]
    use_dev = cfg.early_stopping and x_dev is not None and y_dev is not None
    tracker = _BestTracker(module, m, cfg.patience) if use_dev else None
    n = x.shape[1]

    def dev_check(step: int) -> bool:
        _, _, acc, nll = evaluate_heads(module, x_dev, y_dev)
        return tracker.update(acc if cfg.stop_on == "accuracy" else -nll, step)

    if tracker is not None:
        dev_check(0)  # the starting point (uniform prediction for linear probes) is a candidate

    forward = module.forward_standardised if standardised else module

    def objective(xb, yb):
        per_head = _per_head_ce(forward(xb), yb) + cfg.l2 * module.penalty()
        return per_head.sum(), per_head

    steps = 0
    if cfg.optimizer == "lbfgs":
        opt = torch.optim.LBFGS(
            module.parameters(), lr=1.0, max_iter=cfg.eval_every, max_eval=LBFGS_EVALS_PER_ITER * cfg.eval_every,
            history_size=20, tolerance_grad=cfg.tol, tolerance_change=LBFGS_TOL_CHANGE, line_search_fn="strong_wolfe",
        )  # fmt: skip

        def closure():
            opt.zero_grad()
            if not standardised:
                total, _ = objective(x, y)
                total.backward()
                return total
            # The polish (`polish_heads`) on a training copy of the whole data set: the mean CE in
            # chunks of words, each chunk's backward at once, so that the weight gradient's
            # x^T @ dlogits never makes a transposed copy of all the features (+0.8x their size).
            total = (cfg.l2 * module.penalty()).sum()
            total.backward()
            total = total.detach()
            for s in range(0, n, POLISH_CHUNK):
                e = min(s + POLISH_CHUNK, n)
                part = (_per_head_ce(forward(x[:, s:e]), y[..., s:e]) * ((e - s) / n)).sum()
                part.backward()
                total = total + part.detach()
            return total

        bar = progress_bar(total=cfg.max_iter, desc="probe (lbfgs)", disable=not cfg.progress, leave=False)
        while steps < cfg.max_iter:
            made, converged = lbfgs_block(opt, closure)
            bar.update(made)
            steps += made
            if tracker is not None and dev_check(steps):
                break
            if converged:
                break
        bar.close()
    else:
        opt, sched, epochs = _adam_plan(module, cfg, n)
        bar = progress_bar(total=epochs, desc="probe (adam)", disable=not cfg.progress, leave=False)
        module.train()
        # The words are shuffled once (one copy of the training features), then each epoch cuts the
        # shuffled words into contiguous minibatches at a fresh random offset and visits them in
        # random order: the batch boundaries move between epochs, and no step pays for a gather
        # (which cost ~20% of a step). An epoch may have one short extra batch; the cosine
        # schedule is counted in full batches, so those few last steps run at learning rate ~0.
        if not standardised:
            perm = torch.randperm(n, generator=gen).to(x.device)
            x, y = x.index_select(1, perm), y.index_select(y.dim() - 1, perm)
        k = cfg.checks_per_epoch
        stop = False
        for epoch in range(epochs):
            bounds = _epoch_bounds(n, cfg.batch_size, gen)
            order = torch.randperm(len(bounds) - 1, generator=gen).tolist()
            # dev checks after every len(order) / k batches; steps count checks (epochs when k = 1)
            ends = {math.ceil(len(order) * (j + 1) / k) for j in range(k)}
            for done, b in enumerate(order, start=1):
                s, e = bounds[b], bounds[b + 1]
                if e > s:
                    _adam_step(opt, sched, objective(x[:, s:e], y[..., s:e])[0])
                if done in ends:
                    steps += 1
                    if tracker is not None and dev_check(steps):
                        stop = True
                        break
            bar.update(1)
            if stop:
                break
        bar.close()  # `steps`: the checks made (epochs x k, fewer when k exceeds an epoch's batches)
    if tracker is not None:
        tracker.restore()
    return {
        "steps": steps,
        "best_step": (tracker.best_step.numpy() if tracker is not None else np.full(m, steps)),
    }


def polish_heads(module: Heads, x, y, x_dev, y_dev, cfg: ProbeConfig, gen: torch.Generator,
                 info: dict[str, Any]) -> dict[str, Any]:
    """Up to `cfg.polish` full-batch L-BFGS iterations from the weights of a finished Adam fit, on its
    standardised training copy (`x`, the order does not matter to a full batch), each layer keeping
    the best DEV ACCURACY among the Adam fit (the first check) and the polish's checks (every
    `eval_every` iterations). Without dev data the polish's last iterate is kept.

    Why (issue 49): minibatch Adam moves a rare word type's weights a little per epoch, so in 6
    epochs it memorises far fewer per-type labels than the regularised optimum does; on a control
    task (a random label per word type, Hewitt & Liang 2019) that left the fit 2.4-3.3 points below
    the converged fit on SmolLM2's first layers. L-BFGS from the Adam weights recovers most of that
    in 100-300 iterations. The dev LOSS cannot choose here (confident per-type predictions cost loss on
    the dev words of unseen types, so it prefers the under-fitted weights); dev accuracy can, and on
    a task where the Adam fit is already the better one (UPOS, whose regularised optimum overfits)
    it keeps the Adam fit."""
    pcfg = replace(cfg, optimizer="lbfgs", max_iter=cfg.polish, stop_on="accuracy", patience=max(cfg.patience, 1))
    pinfo = train_heads(module, x, y, x_dev, y_dev, pcfg, gen, standardised=True)
    polished = pinfo["best_step"] > 0
    return {"steps": info["steps"] + pinfo["steps"], "polish_steps": pinfo["steps"],
            "best_step": np.where(polished, info["steps"] + pinfo["best_step"], info["best_step"])}


# --------------------------------------------------------------------------- lazy feature views
class LazyFeatures:
    """An `[L, rows, D]` float32 feature array built one layer at a time, which `fit_probe` takes
    in place of a numpy array: word pairs (`probes.syntax.FeatureView`) or mention spans
    (`probes.coref.SpanView`) of a whole corpus are never all in memory unless asked for.

    A subclass sets `shape` and writes one layer's rows into a buffer (`_layer`); indexing follows
    numpy on the first two axes (`view[layers]`, `view[layer]`, `view[:, rows]`).
    """

    ndim = 3
    dtype = np.dtype(np.float32)
    shape: tuple[int, int, int]

    def _layer(self, layer: int, rows, out: np.ndarray) -> None:
        """Write the features of `rows` (any numpy index into axis 1) at `layer` into `out` [n, D]."""
        raise NotImplementedError

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        out = self[list(range(self.shape[0]))]
        return out if dtype is None else out.astype(dtype)

    def __getitem__(self, key):
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) > 2:
            raise IndexError(f"{type(self).__name__} supports indexing on layers and rows only")
        layer_key, rows = key[0], (key[1] if len(key) > 1 else slice(None))
        squeeze = isinstance(layer_key, (int, np.integer))
        layers = np.atleast_1d(np.arange(self.shape[0])[layer_key])
        n = len(np.arange(self.shape[1])[rows])
        out = np.empty((len(layers), n, self.shape[2]), dtype=np.float32)  # the one copy
        for i, layer in enumerate(layers):
            self._layer(int(layer), rows, out[i])
        return out[0] if squeeze else out


# --------------------------------------------------------------------------- public: probes


@dataclass
class ProbeResult:
    """One probe per layer, fitted together. Arrays have the layer as leading dimension."""

    kind: str
    layers: np.ndarray  # [L] indices into the feature array's layer axis
    num_classes: int
    weights: dict[str, np.ndarray]  # raw-feature space (standardisation folded in)
    dev_accuracy: np.ndarray | None  # [L]
    dev_predictions: np.ndarray | None  # [L, N_dev]
    train_accuracy: np.ndarray  # [L]
    train_loss: np.ndarray  # [L] mean CE without the penalty
    best_step: np.ndarray  # [L] of the kept parameters: lbfgs iteration, adam dev check (the epoch at 1 check per epoch)
    steps: int
    config: ProbeConfig

    def logits(self, x) -> np.ndarray:
        """[L, N, C] scores of `x` ([L_all, N, H]; the fitted layers are selected from it)."""
        return _predict_logits(self.kind, self.weights, self.layers, x, self.config.device)

    def log_proba(self, x) -> np.ndarray:
        z = torch.as_tensor(self.logits(x))
        return torch.log_softmax(z, -1).numpy()

    def predict(self, x) -> np.ndarray:
        return self.logits(x).argmax(-1)

    def accuracy(self, x, y) -> np.ndarray:
        return (self.predict(x) == np.asarray(y)[None, :]).mean(1)

    def correct(self, x, y) -> np.ndarray:
        """bool [L, N]: per-word correctness (the input of the sentence bootstrap, `statistics.ratio_bootstrap`)."""
        return self.predict(x) == np.asarray(y)[None, :]


@torch.no_grad()
def _predict_logits(kind, weights, layers, x, device="cpu") -> np.ndarray:
    outs = []
    for li, layer in enumerate(layers):
        xl = torch.as_tensor(np.asarray(x[layer], dtype=np.float32), device=device)
        w = {k: torch.as_tensor(v[li], device=device) for k, v in weights.items()}
        if kind == "linear":
            z = xl @ w["w"] + w["b"]
        else:
            z = torch.relu(xl @ w["w1"] + w["b1"]) @ w["w2"] + w["b2"]
        outs.append(z.cpu().numpy())
    return np.stack(outs)


def layer_tensor(x, layers, device) -> torch.Tensor:
    """Selected layers of `x` ([L, N, H] numpy/memmap/tensor) as a float32 tensor [len(layers), N, H]."""
    layers = list(layers)
    if x.ndim != 3:
        raise ConfigError(f"features must have shape [layers, words, hidden], got {tuple(x.shape)}")
    # a run of consecutive layers is a slice (a view, no copy, when x is already float32)
    sel = slice(layers[0], layers[-1] + 1) if layers == list(range(layers[0], layers[-1] + 1)) else layers
    device = resolve_device(device)
    if isinstance(x, torch.Tensor):
        return x[sel].to(device=device, dtype=torch.float32)
    arr = np.ascontiguousarray(x[sel], dtype=np.float32)
    with warnings.catch_warnings():  # a read-only memmap view: we never write to it
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(arr).to(device)


def label_tensor(y, n: int, num_classes: int | None, what: str) -> tuple[torch.Tensor, int]:
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n:
        raise ConfigError(f"{what}: expected {n} integer labels, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise ConfigError(f"{what}: labels must be integers (class indices), got {y.dtype}")
    if len(y) and y.min() < 0:
        raise ConfigError(f"{what}: negative label {y.min()}")
    c = int(num_classes) if num_classes is not None else int(y.max()) + 1 if len(y) else 1
    if len(y) and y.max() >= c:
        raise ConfigError(f"{what}: label {y.max()} >= num_classes {c}")
    return torch.as_tensor(y, dtype=torch.long), c


def fit_probe(
    x_train,
    y_train,
    x_dev=None,
    y_dev=None,
    num_classes: int | None = None,
    layers: Sequence[int] | None = None,
    config: ProbeConfig | Mapping[str, Any] | None = None,
    **overrides,
) -> ProbeResult:
    """Fit one linear (or MLP) probe per layer, all layers in one batched program.

    x_train: [L, N, H] (numpy, memmap or tensor; e.g. `acts.layers[:, train_words]`), y_train: [N]
    class indices. With dev data, each layer keeps the parameters of its best dev score (`stop_on`:
    the dev loss for linear Adam fits by default, else the dev accuracy) and training stops when no
    layer has improved for `patience` checks (`early_stopping`).
    `layers` selects layer indices (default all); `config.layer_batch` bounds memory by fitting
    layers in groups (still batched within a group).
    """
    cfg = merge_config(config, overrides)
    n_layers = x_train.shape[0]
    layers = list(range(n_layers)) if layers is None else [int(l) for l in layers]
    y_tr, c = label_tensor(y_train, x_train.shape[1], num_classes, "y_train")
    if num_classes is None and y_dev is not None and len(y_dev):
        c = max(c, int(np.max(y_dev)) + 1)
    y_dv = label_tensor(y_dev, x_dev.shape[1], c, "y_dev")[0] if y_dev is not None else None
    group = cfg.layer_batch or len(layers)
    parts = []
    for g in range(0, len(layers), group):
        parts.append(fit_layer_group(x_train, y_tr, x_dev, y_dv, c, layers[g : g + group], cfg))
    weights = {k: np.concatenate([p["weights"][k] for p in parts]) for k in parts[0]["weights"]}
    cat = lambda key: None if parts[0][key] is None else np.concatenate([p[key] for p in parts])  # noqa: E731
    return ProbeResult(
        kind=cfg.kind, layers=np.asarray(layers), num_classes=c, weights=weights,
        dev_accuracy=cat("dev_accuracy"), dev_predictions=cat("dev_predictions"),
        train_accuracy=cat("train_accuracy"), train_loss=cat("train_loss"), best_step=cat("best_step"),
        steps=max(p["steps"] for p in parts), config=parts[0]["config"],
    )  # fmt: skip


# --------------------------------------------------------------------------- public: many probes at once


class _TaskSeedHeads(Heads):
    """Linear heads for every (seed, task, layer): head m = (s, t, l) in that order, M = S*T*L.

    The parameters act on standardised features and are stored grouped per (seed, layer): `w`
    [S*L, H, T*C] and `b` [S*L, 1, T*C], every task's head on a layer side by side, so a training
    step is one batched matmul with no regrouping copy (`forward_seeded`: standardised batches that
    differ per seed, [S*L, B, H]). Evaluation features are raw and shared by all seeds (`forward`,
    [L, N, H]; the standardisation is folded into the weights). `per_head_state` gives the
    per-head view [M, ...] that early stopping and `export` use."""

    def __init__(self, s: int, t: int, l: int, h: int, c: int, mu: torch.Tensor, sd: torch.Tensor):
        super().__init__()
        self.shape = (s, t, l, h, c)
        self.w = nn.Parameter(torch.zeros(s * l, h, t * c))
        self.b = nn.Parameter(torch.zeros(s * l, 1, t * c))
        self.register_buffer("mu", mu.repeat(s, 1))  # [S*L, H], group (s, l) -> layer l's statistics
        self.register_buffer("sd", sd.repeat(s, 1))

    def penalised(self):
        return [self.w]

    def per_head_state(self) -> dict[str, torch.Tensor]:
        """{"w": [M, H, C], "b": [M, C]} (copies), head m = (s, t, l)."""
        s, t, l, h, c = self.shape
        w = self.w.detach().view(s, l, h, t, c).permute(0, 3, 1, 2, 4).reshape(s * t * l, h, c)
        b = self.b.detach().view(s, l, t, c).permute(0, 2, 1, 3).reshape(s * t * l, c)
        return {"w": w, "b": b}

    @torch.no_grad()
    def load_per_head_state(self, state: Mapping[str, torch.Tensor]) -> None:
        s, t, l, h, c = self.shape
        self.w.copy_(state["w"].view(s, t, l, h, c).permute(0, 2, 3, 1, 4).reshape(s * l, h, t * c))
        self.b.copy_(state["b"].view(s, t, l, c).permute(0, 2, 1, 3).reshape(s * l, 1, t * c))

    def _folded(self):  # raw-feature weights, grouped: [S*L, H, T*C], [S*L, 1, T*C]
        w = self.w / self.sd.unsqueeze(-1)
        b = self.b - torch.bmm(self.mu.unsqueeze(1), w)
        return w, b

    def _ungroup(self, z: torch.Tensor) -> torch.Tensor:  # [S*L, B, T*C] -> [M, B, C]
        s, t, l, h, c = self.shape
        n = z.shape[1]
        return z.view(s, l, n, t, c).permute(0, 3, 1, 2, 4).reshape(s * t * l, n, c)

    def forward_seeded(self, xs: torch.Tensor) -> torch.Tensor:
        """STANDARDISED features [S*L, B, H] -> logits [S*L, B, T*C] (grouped layout)."""
        return torch.baddbmm(self.b, xs, self.w)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [L, N, H] shared by all seeds -> [M, N, C]
        s, t, l, h, c = self.shape
        w, b = self._folded()
        z = torch.stack([torch.baddbmm(b.view(s, l, 1, t * c)[k], x, w.view(s, l, h, t * c)[k]) for k in range(s)])
        return self._ungroup(z.view(s * l, x.shape[1], t * c))

    def export(self) -> dict[str, np.ndarray]:
        s, t, l, h, c = self.shape
        w, b = self._folded()
        w = w.detach().view(s, l, h, t, c).permute(0, 3, 1, 2, 4)  # [S, T, L, H, C]
        b = b.detach().view(s, l, t, c).permute(0, 2, 1, 3)  # [S, T, L, C]
        return {"w": w.cpu().numpy().copy(), "b": b.cpu().numpy().copy()}


def fit_probe_tasks(
    x_train,
    tasks: Mapping[str, tuple[Any, Any]],
    x_dev=None,
    num_classes: int | None = None,
    seeds: Sequence[int] = (0,),
    layers: Sequence[int] | None = None,
    config: ProbeConfig | Mapping[str, Any] | None = None,
    **overrides,
) -> dict[tuple[str, int], ProbeResult]:
    """Linear probes for several label sets on the same features (e.g. a task and its control
    task) and several seeds, all layers, fitted as ONE batched program (minibatch Adam).

    `tasks`: name -> (y_train [N], y_dev [N_dev] or None). Every seed has its own data order (seed
    s draws its shuffle and batch order from `torch.Generator().manual_seed(s)`, as `fit_probe`
    does; the per-epoch batch offset comes from the first seed's generator and is shared), so each
    (task, seed) probe is an ordinary minibatch fit of `fit_probe`'s objective; only the per-step
    overhead is shared. All tasks use `num_classes` classes (default: 1 + the largest label).
    Returns {(task, seed): ProbeResult}. Linear probes only; the optimiser must resolve to Adam
    ("auto" does above AUTO_LBFGS_MAX_ENTRIES words x features): full-batch L-BFGS has no seed to batch over.
    """
    cfg = merge_config(config, overrides)
    if cfg.kind != "linear":
        raise ConfigError(f"fit_probe_tasks fits linear probes only, got kind {cfg.kind!r}")
    if not tasks:
        raise ConfigError("fit_probe_tasks: no tasks given")
    seeds = [int(s) for s in seeds]
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"fit_probe_tasks: seeds must be distinct and non-empty, got {seeds}")
    layers = list(range(x_train.shape[0])) if layers is None else [int(l) for l in layers]
    names = list(tasks)
    n = x_train.shape[1]
    c = int(num_classes) if num_classes is not None else 1 + max(
        int(np.max(y)) for yy in tasks.values() for y in yy if y is not None and len(y))
    y_tr = torch.stack([label_tensor(tasks[k][0], n, c, f"{k}: y_train")[0] for k in names])  # [T, N]
    with_dev = x_dev is not None and all(tasks[k][1] is not None for k in names)
    y_dv = torch.stack([label_tensor(tasks[k][1], x_dev.shape[1], c, f"{k}: y_dev")[0] for k in names]) if with_dev else None
    cfg = resolved_config(cfg, n, int(x_train.shape[2]))
    if cfg.checks_per_epoch != 1:
        raise ConfigError(f"fit_probe_tasks checks the dev set once per epoch; checks_per_epoch must be 1, "
                          f"got {cfg.checks_per_epoch}")
    if cfg.optimizer != "adam":
        raise ConfigError(f"fit_probe_tasks needs the Adam optimiser ({n} training words resolve to {cfg.optimizer}); "
                          f"use fit_probe for full-batch L-BFGS")
    dev = torch.device(cfg.device)
    x = layer_tensor(x_train, layers, dev)
    xd = layer_tensor(x_dev, layers, dev) if with_dev else None
    mu, sd = standardisation(x, cfg.standardize)
    S, T, L, H = len(seeds), len(names), len(layers), x.shape[2]
    gens, perms, where, xs = _shuffled_standardised(x, mu, sd, seeds, dev)
    module = _TaskSeedHeads(S, T, L, H, c, mu, sd).to(dev)

    def per_head(y):  # [T, N] -> [M, N], head order (s, t, l)
        return y.view(1, T, 1, -1).expand(S, T, L, y.shape[1]).reshape(S * T * L, -1)

    with torch.no_grad():  # each head starts at its task's log prior (as fit_probe's do)
        module.b.copy_(_log_prior(y_tr, c).reshape(1, 1, T * c).expand_as(module.b))
    y_tr, y_dv = y_tr.to(dev), (y_dv.to(dev) if y_dv is not None else None)
    y_dev_heads = per_head(y_dv) if y_dv is not None else None
    tracker = _BestTracker(module, S * T * L, cfg.patience) if (cfg.early_stopping and with_dev) else None

    def dev_check(step: int) -> bool:
        _, _, acc, nll = evaluate_heads(module, xd, y_dev_heads)
        return tracker.update(acc if cfg.stop_on == "accuracy" else -nll, step)

    if tracker is not None:
        dev_check(0)
    opt, sched, epochs = _adam_plan(module, cfg, n, decayed=[module.w])  # the L2 term of every head
    module.train()
    steps, xb = 0, None
    y_t = y_tr.t().contiguous()  # [N, T]: one gather per seed gives every task's labels
    bar = progress_bar(total=epochs, desc=f"probes ({S} seeds x {T} tasks x {L} layers)", disable=not cfg.progress, leave=False)
    for epoch in range(epochs):
        bounds = _epoch_bounds(n, cfg.batch_size, gens[0])
        orders = [torch.randperm(len(bounds) - 1, generator=g).tolist() for g in gens]
        for j in range(len(bounds) - 1):
            idx = [perms[si][bounds[orders[si][j]] : bounds[orders[si][j] + 1]] for si in range(S)]
            if any(len(i) == 0 for i in idx):
                continue
            # Seeds may be at a short batch (an epoch's first or last) while others are not: pad
            # to the longest by repeating indices, with weight 0, so each head's loss is the mean
            # over its own batch exactly.
            size = max(len(i) for i in idx)
            full = all(len(i) == size for i in idx)
            if not full:
                wts = torch.stack([(torch.arange(size, device=dev) < len(i)).float() / len(i) for i in idx])  # [S, B]
                idx = [i if len(i) == size else i[torch.arange(size, device=dev) % len(i)] for i in idx]
            if xb is None or xb.shape[1] != size:
                xb = torch.empty(S * L, size, H, device=dev)
            _gather_batch(xb, xs, where, idx, bounds[orders[0][j]], bounds[orders[0][j] + 1], L)
            yb = torch.stack([y_t.index_select(0, i) for i in idx]).unsqueeze(1).expand(S, L, size, T)  # [S, L, B, T]
            _closed_form_gradient(module, xb, yb, None if full else wts, c)
            opt.step()
            sched.step()
        steps = epoch + 1
        bar.update(1)
        if tracker is not None and dev_check(steps):
            break
    bar.close()
    del xs, xb
    if tracker is not None:
        tracker.restore()
    best_step = tracker.best_step.numpy() if tracker is not None else np.full(S * T * L, steps)

    return _task_seed_results(module, x, per_head(y_tr), xd, y_dev_heads, seeds, names, layers, c,
                              best_step, steps, cfg)


def _shuffled_standardised(x: torch.Tensor, mu: torch.Tensor, sd: torch.Tensor, seeds: list[int], dev):
    """Each seed's generator and shuffle, and ONE standardised copy of the training features `x`
    [L, N, H] in the first seed's shuffled order -> (gens, perms, where, xs).

    fit_probe keeps one shuffled copy too: the steps skip the per-step fold of mean and scale into
    the weights, the first seed reads contiguous slices of `xs`, the others gather through the
    inverse order `where` (original index -> row of `xs`). Each generator draws its permutation
    here first, before any batch order, as fit_probe's does (the draw order fixes the results).
    """
    n = x.shape[1]
    gens = [torch.Generator().manual_seed(s) for s in seeds]
    perms = [torch.randperm(n, generator=g).to(dev) for g in gens]
    where = torch.empty_like(perms[0])
    where[perms[0]] = torch.arange(n, device=dev)  # original index -> row of xs
    xs = torch.empty_like(x)
    mu, sd = mu.to(x.device), sd.to(x.device)  # the statistics come back on the CPU (`standardisation`)
    for k in range(0, n, 4096):
        torch.div(x.index_select(1, perms[0][k : k + 4096]) - mu[:, None], sd[:, None], out=xs[:, k : k + 4096])
    return gens, perms, where, xs


def _gather_batch(xb: torch.Tensor, xs: torch.Tensor, where: torch.Tensor, idx: list, lo: int, hi: int,
                  L: int) -> None:
    """Each seed's batch (`idx`: original row indices, one tensor per seed) straight into its place
    of `xb` [S*L, B, H]: the first seed's unpadded batch is the contiguous slice `lo:hi` of `xs`
    (no gather), the others go through `where`. In place, so one buffer serves every step."""
    size = xb.shape[1]
    for si, i in enumerate(idx):
        if si == 0 and hi - lo == size:  # a full batch of the first seed (not padded)
            xb[:L].copy_(xs[:, lo:hi])
        else:
            torch.index_select(xs, 1, where[i], out=xb[si * L : (si + 1) * L])


@torch.no_grad()
def _closed_form_gradient(module: _TaskSeedHeads, xb: torch.Tensor, yb: torch.Tensor, wts, c: int) -> None:
    """Set `module.w.grad` and `module.b.grad` for one step on the batch `xb` [S*L, B, H] with labels
    `yb` [S, L, B, T]; `wts` [S, B]: per-row weights of padded batches (None: every row 1/B).

    The objective is the sum over heads of (mean CE + lambda/2 ||W||^2); each head's gradient
    depends on its own term only. Softmax regression has a closed-form gradient,
    d(mean CE)/d logits = (softmax - one-hot) / B, so the step skips autograd: one softmax and one
    batched matmul (x^T g) in the grouped layout [S*L, B, T*C]; the L2 term's gradient is Adam's
    weight decay on W (see _adam_plan).
    """
    S, L, size, T = yb.shape
    g = torch.softmax(module.forward_seeded(xb).view(S, L, size, T, c), -1)
    g.view(-1, c).scatter_add_(1, yb.reshape(-1, 1), torch.full((g.numel() // c, 1), -1.0, device=xb.device))
    if wts is None:
        g.div_(size)
    else:
        g.mul_(wts.view(S, 1, size, 1, 1))
    g = g.view(S * L, size, T * c)
    module.w.grad = torch.bmm(xb.transpose(1, 2), g)
    module.b.grad = g.sum(1, keepdim=True)


def _task_seed_results(module: _TaskSeedHeads, x, y_heads, xd, y_dev_heads, seeds: list[int], names: list[str],
                       layers: list[int], c: int, best_step: np.ndarray, steps: int,
                       cfg: ProbeConfig) -> dict[tuple[str, int], ProbeResult]:
    """{(task, seed): ProbeResult} of the fitted heads (order (s, t, l)): train accuracy and loss on
    `x`, dev accuracy and predictions on `xd` when there is a dev split (`y_dev_heads` not None).
    Each result is what fit_probe would return for that task and seed, so callers treat both alike."""
    S, T, L = len(seeds), len(names), len(layers)
    weights = module.export()
    _, _, tr_acc, tr_loss = evaluate_heads(module, x, y_heads)
    dv_pred = dv_acc = None
    if y_dev_heads is not None:
        _, dv_pred, dv_acc, _ = evaluate_heads(module, xd, y_dev_heads)
        dv_pred, dv_acc = dv_pred.cpu().numpy().reshape(S, T, L, -1), dv_acc.cpu().numpy().reshape(S, T, L)
    tr_acc, tr_loss = tr_acc.cpu().numpy().reshape(S, T, L), tr_loss.cpu().numpy().reshape(S, T, L)
    best_step = best_step.reshape(S, T, L)
    out = {}
    for si, seed in enumerate(seeds):
        for ti, name in enumerate(names):
            out[(name, seed)] = ProbeResult(
                kind="linear", layers=np.asarray(layers), num_classes=c,
                weights={"w": weights["w"][si, ti], "b": weights["b"][si, ti]},
                dev_accuracy=None if dv_acc is None else dv_acc[si, ti],
                dev_predictions=None if dv_pred is None else dv_pred[si, ti],
                train_accuracy=tr_acc[si, ti], train_loss=tr_loss[si, ti], best_step=best_step[si, ti],
                steps=steps, config=replace(cfg, seed=seed),
            )  # fmt: skip
    return out


def _log_prior(y: torch.Tensor, c: int) -> torch.Tensor:
    """Add-one smoothed log label prior of each row of `y` ([N] or [R, N] labels) -> [1 or R, C]."""
    y2 = y.view(1, -1) if y.dim() == 1 else y
    counts = torch.stack([torch.bincount(row.cpu(), minlength=c) for row in y2]).float() + 1
    return (counts / counts.sum(1, keepdim=True)).log()


@torch.no_grad()
def prior_bias(module: Heads, y: torch.Tensor, c: int) -> None:
    """Start the output bias at the (add-one smoothed) log label prior: the best input-free guess,
    so a probe on an uninformative layer starts where it should end (matters for MDL's early stops)."""
    bias = module.b2 if isinstance(module, _MLPHeads) else module.b
    bias.copy_(_log_prior(y, c).to(bias.device).expand_as(bias))


def fit_layer_group(x_train, y_tr, x_dev, y_dv, c, layers, cfg: ProbeConfig, stats=None) -> dict[str, Any]:
    """Fit the probes of `layers` as one batched program (see `fit_probe`); `stats`: given (mu, sd)."""
    cfg = resolved_config(cfg, int(x_train.shape[1]), int(x_train.shape[2]))
    dev = torch.device(cfg.device)
    gen = torch.Generator().manual_seed(cfg.seed)  # CPU: the same draws whatever the device
    xd = layer_tensor(x_dev, layers, dev) if x_dev is not None else None
    if xd is not None:
        release_file_pages(x_dev)
    m, h = len(layers), int(x_train.shape[2])
    minibatch = cfg.optimizer == "adam"
    if minibatch:  # statistics come with the one training copy, below
        mu, sd = torch.zeros(m, h), torch.ones(m, h)
    else:
        x = layer_tensor(x_train, layers, dev)
        mu, sd = stats if stats is not None else standardisation(x, cfg.standardize)
    if cfg.kind == "linear":
        module = _LinearHeads(m, h, c, mu, sd)
    else:
        module = _MLPHeads(m, h, c, mu, sd, cfg.hidden, cfg.dropout, gen)
    prior_bias(module, y_tr, c)
    if minibatch:  # the permutation is drawn after the MLP's initial weights, as train_heads always did
        perm = torch.randperm(int(x_train.shape[1]), generator=gen)
        x, mu, sd = training_copy(x_train, layers, perm, dev, cfg.standardize, stats)
        module.mu.copy_(mu)
        module.sd.copy_(sd)
        y_tr = y_tr.index_select(0, perm)
    module.to(dev)
    y_tr, y_dv = y_tr.to(dev), (y_dv.to(dev) if y_dv is not None else None)
    info = train_heads(module, x, y_tr, xd, y_dv, cfg, gen, standardised=minibatch)
    if minibatch and cfg.polish:
        info = polish_heads(module, x, y_tr, xd, y_dv, cfg, gen, info)
    _, _, train_acc, train_loss = evaluate_heads(module, x, y_tr, standardised=minibatch)
    del x
    out = {"weights": module.export(), "train_accuracy": train_acc.cpu().numpy(), "steps": info["steps"],
           "train_loss": train_loss.cpu().numpy(), "best_step": info["best_step"], "module": module,
           "dev_accuracy": None, "dev_predictions": None, "config": cfg}  # fmt: skip
    if xd is not None:
        _, pred, acc, _ = evaluate_heads(module, xd, y_dv)
        out["dev_predictions"] = pred.cpu().numpy()
        out["dev_accuracy"] = acc.cpu().numpy() if acc is not None else None
    return out
