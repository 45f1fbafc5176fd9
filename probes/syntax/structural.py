"""Structural probes (Hewitt & Manning 2019), fitted for every layer at once.

Where the vectors come from is someone else's business: a probe here takes word representations
of shape [L+1, N_words, H] (layer-major, as `workbench.activations` stores them), the sentence
offsets into N, and gold trees. What is fitted:

- the *distance probe*: a matrix B (rank k) per layer so that ||B(h_i - h_j)||^2 approximates the
  path distance between words i and j in the dependency tree;
- the *depth probe*: ||B h_i||^2 approximates the depth of word i (root = 0).

Both are trained with the paper's L1 loss, normalised by sentence length (squared for distances),
with Adam and early stopping on the dev loss, one B per layer batched into a single tensor of shape
[L+1, H, k]. How they are scored follows the paper: UUAS from a minimum spanning tree over the
predicted distances against the gold tree, punctuation excluded; DSpr / NSpr as Spearman correlations
averaged first within each sentence length and then over lengths 5-50; root accuracy as the share
of sentences whose shallowest predicted (non-punctuation) word is the gold root.
"""

from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from scipy.sparse.csgraph import minimum_spanning_tree
from scipy.stats import rankdata, spearmanr

from workbench.precision import resolve_device
from workbench.progress import progress as progress_bar

PUNCT_UPOS = frozenset({"PUNCT"})
SPEARMAN_LENGTHS = (5, 50)
# Hewitt & Manning's learning-rate schedule (structural-probes/regimen.py): torch's ReduceLROnPlateau
# with mode "min", factor 0.1, patience 0 and the default relative threshold 1e-4.
PLATEAU_FACTOR = 0.1
PLATEAU_THRESHOLD = 1e-4
# `feature_scaling` reads the training words in chunks of about this many bytes of float32 (all layers).
SCALING_CHUNK_BYTES = 32 << 20


# --------------------------------------------------------------------------- gold trees
def tree_distances(heads: list[int] | np.ndarray) -> np.ndarray:
    """All-pairs path lengths in a dependency tree (`heads` 1-based, 0 = root), by breadth-first
    search over the undirected tree (scipy's unweighted shortest paths)."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import shortest_path

    heads = np.asarray(heads, dtype=np.int64)
    n = len(heads)
    dep = np.flatnonzero(heads > 0)
    graph = coo_matrix((np.ones(len(dep)), (dep, heads[dep] - 1)), shape=(n, n))
    dist = shortest_path(graph, method="D", directed=False, unweighted=True)
    if np.isinf(dist).any():
        raise ValueError("heads do not form a connected tree")
    return dist.astype(np.int64)


def tree_depths(heads: list[int] | np.ndarray) -> np.ndarray:
    """Depth of each word: number of arcs to the root word (the root word has depth 0)."""
    heads = np.asarray(heads, dtype=np.int64)
    depths = np.zeros(len(heads), dtype=np.int64)
    for i in range(len(heads)):
        node, d = i, 0
        while heads[node] > 0:
            node, d = heads[node] - 1, d + 1
            if d > len(heads):
                raise ValueError("heads contain a cycle")
        depths[i] = d
    return depths


# --------------------------------------------------------------------------- metrics
def mst_edges(distances: np.ndarray) -> set[tuple[int, int]]:
    """Undirected edges (i < j) of a minimum spanning tree over a full distance matrix.

    Ties are broken deterministically by scipy's algorithm; a tiny index-based epsilon keeps zero
    distances (which scipy would read as "no edge") usable.
    """
    n = len(distances)
    if n < 2:
        return set()
    d = np.asarray(distances, dtype=np.float64)
    d = (d + d.T) / 2
    offset = np.abs(d).max() * 1e-9 + 1e-12
    graph = np.triu(d - d.min() + offset, k=1)
    tree = minimum_spanning_tree(graph).tocoo()
    return {(min(i, j), max(i, j)) for i, j in zip(tree.row.tolist(), tree.col.tolist())}


def gold_edges(heads: list[int] | np.ndarray, keep: np.ndarray | None = None) -> set[tuple[int, int]]:
    """Undirected gold edges among the kept words (the MST of the gold distances, as in the paper's
    evaluation: if a dropped punctuation word sat inside the tree, its neighbours are joined)."""
    dist = tree_distances(heads)
    idx = np.arange(len(dist)) if keep is None else np.flatnonzero(keep)
    sub = mst_edges(dist[np.ix_(idx, idx)])
    return {(int(idx[i]), int(idx[j])) for i, j in sub}


def uuas_counts(pred_distances: np.ndarray, heads, keep: np.ndarray,
                gold: set[tuple[int, int]] | None = None) -> tuple[int, int]:
    """(correct, total) undirected edges for one sentence, punctuation (keep=False) excluded.
    `gold` = `gold_edges(heads, keep)` when the caller has it already (scoring many layers)."""
    idx = np.flatnonzero(keep)
    if len(idx) < 2:
        return 0, 0
    gold = gold_edges(heads, keep) if gold is None else gold
    pred = {(int(idx[i]), int(idx[j])) for i, j in mst_edges(pred_distances[np.ix_(idx, idx)])}
    return len(gold & pred), len(gold)


def right_branching_uuas_counts(heads, keep: np.ndarray) -> tuple[int, int]:
    """The linear-chain baseline: each kept word attached to the next kept word."""
    idx = np.flatnonzero(keep)
    if len(idx) < 2:
        return 0, 0
    gold = gold_edges(heads, keep)
    chain = {(int(a), int(b)) for a, b in zip(idx[:-1], idx[1:])}
    return len(gold & chain), len(gold)


def rowwise_spearman(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row of `a` with the same row of `b` ([n, m] -> [n]), vectorised.

    Same numbers as `scipy.stats.spearmanr(a[i], b[i])` per row (Pearson correlation of average
    ranks); NaN where a row is constant, as scipy gives.
    """
    ra = rankdata(np.asarray(a, dtype=np.float64), axis=1)
    rb = rankdata(np.asarray(b, dtype=np.float64), axis=1)
    ra -= ra.mean(1, keepdims=True)
    rb -= rb.mean(1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ra * rb).sum(1) / np.sqrt((ra * ra).sum(1) * (rb * rb).sum(1))


def _in_spearman_range(n: int) -> bool:
    return SPEARMAN_LENGTHS[0] <= n <= SPEARMAN_LENGTHS[1]


def sentence_dspr(pred: np.ndarray, gold: np.ndarray) -> float:
    """One sentence's DSpr: the mean over its words of the Spearman correlation between predicted
    and gold distances to every other word (NaN outside lengths 5-50 or when every row is constant)."""
    rows = rowwise_spearman(pred, gold) if _in_spearman_range(len(gold)) else np.array([np.nan])
    rows = rows[np.isfinite(rows)]
    return float(rows.mean()) if len(rows) else float("nan")


def sentence_nspr(pred: np.ndarray, gold: np.ndarray) -> float:
    """One sentence's NSpr: Spearman of predicted and gold depths (NaN outside lengths 5-50)."""
    return float(spearmanr(pred, gold).statistic) if _in_spearman_range(len(gold)) else float("nan")


def sentence_root_hit(pred_depths: np.ndarray, heads, keep: np.ndarray) -> float:
    """1.0 when the shallowest predicted non-punctuation word is the gold root, NaN with no such word."""
    idx = np.flatnonzero(keep)
    return float(np.asarray(heads)[idx[np.argmin(pred_depths[idx])]] == 0) if len(idx) else float("nan")


def length_averaged(values, lengths) -> np.ndarray:
    """Hewitt & Manning's averaging of per-sentence scores ([S] or [L, S], NaN = not counted):
    mean over the sentences of each length, then over the lengths 5-50 -> scalar or [L]."""
    values = np.asarray(values, dtype=np.float64)
    flat = values.ndim == 1
    values = np.atleast_2d(values)
    lengths = np.asarray(lengths)
    groups = [lengths == n for n in np.unique(lengths) if _in_spearman_range(int(n))]
    with warnings.catch_warnings():  # a length with no counted sentence gives NaN, then is skipped
        warnings.simplefilter("ignore", RuntimeWarning)
        per_length = np.stack([np.nanmean(values[:, g], axis=1) for g in groups], axis=1) if groups else None
        out = np.nanmean(per_length, axis=1) if per_length is not None else np.full(len(values), np.nan)
    return float(out[0]) if flat else out


def distance_spearman(pred: list[np.ndarray], gold: list[np.ndarray]) -> float:
    """DSpr of a set of sentences: per-sentence DSpr averaged within lengths, then over lengths 5-50."""
    return length_averaged([sentence_dspr(p, g) for p, g in zip(pred, gold)], [len(g) for g in gold])


def depth_spearman(pred: list[np.ndarray], gold: list[np.ndarray]) -> float:
    """NSpr of a set of sentences, averaged as DSpr."""
    return length_averaged([sentence_nspr(p, g) for p, g in zip(pred, gold)], [len(g) for g in gold])


def root_accuracy(pred_depths: list[np.ndarray], heads: list, keep: list[np.ndarray]) -> float:
    """Share of sentences whose shallowest predicted non-punctuation word is the gold root."""
    hits = np.array([sentence_root_hit(p, h, k) for p, h, k in zip(pred_depths, heads, keep)])
    return float(np.nanmean(hits)) if np.isfinite(hits).any() else float("nan")


# --------------------------------------------------------------------------- data
@dataclass
class TreeSet:
    """Word vectors of every layer plus gold trees for a set of sentences."""

    features: np.ndarray  # [L+1, N, H], may be a memmap
    offsets: np.ndarray  # [S+1] sentence boundaries into N
    heads: list[np.ndarray]
    upos: list[list[str]]

    def __post_init__(self):
        if len(self.offsets) != len(self.heads) + 1:
            raise ValueError(f"{len(self.heads)} trees but {len(self.offsets) - 1} sentences of features")
        lengths = np.diff(self.offsets)
        bad = [i for i, (n, h) in enumerate(zip(lengths, self.heads)) if n != len(h)]
        if bad:
            raise ValueError(f"sentence {bad[0]} has {lengths[bad[0]]} vectors but {len(self.heads[bad[0]])} words")

    @functools.cached_property
    def gold_distances(self) -> list[np.ndarray]:
        return [tree_distances(h) for h in self.heads]

    @functools.cached_property
    def gold_depths(self) -> list[np.ndarray]:
        return [tree_depths(h) for h in self.heads]

    def keep(self, i: int) -> np.ndarray:
        return np.array([u not in PUNCT_UPOS for u in self.upos[i]], dtype=bool)

    def __len__(self) -> int:
        return len(self.heads)

    def batch(self, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Padded batch: features [L+1, B, T, H], mask [B, T], gold distances [B, T, T], depths [B, T].

        The batch's words are read in one gather over all layers (`features[:, rows]`), converted to
        float32 there: a half-precision cache (`workbench.activations.Bfloat16Array`) or a lazy view
        (`probes.syntax.FeatureView`) is never turned into float32 beyond this batch."""
        lengths = [int(self.offsets[i + 1] - self.offsets[i]) for i in idx]
        t = max(lengths)
        n_layers, _, h = self.features.shape
        rows = np.concatenate([np.arange(self.offsets[i], self.offsets[i + 1]) for i in idx])
        words = np.asarray(self.features[:, rows], dtype=np.float32)  # [L+1, words of the batch, H]
        x = np.zeros((n_layers, len(idx), t, h), dtype=np.float32)
        dist = np.zeros((len(idx), t, t), dtype=np.float32)
        depth = np.zeros((len(idx), t), dtype=np.float32)
        mask = np.zeros((len(idx), t), dtype=bool)
        start = 0
        for b, (i, n) in enumerate(zip(idx, lengths)):
            x[:, b, :n] = words[:, start:start + n]
            start += n
            dist[b, :n, :n] = self.gold_distances[i]
            depth[b, :n] = self.gold_depths[i]
            mask[b, :n] = True
        return torch.from_numpy(x), torch.from_numpy(mask), torch.from_numpy(dist), torch.from_numpy(depth)


# --------------------------------------------------------------------------- the probes
class LayerwiseStructuralProbe(torch.nn.Module):
    """One rank-k matrix per layer, each its own parameter (so that each layer can have its own
    learning rate); `proj` stacks them into shape [L+1, H, k]."""

    def __init__(self, n_layers: int, hidden: int, rank: int, generator: torch.Generator):
        super().__init__()
        init = torch.empty(n_layers, hidden, rank).uniform_(-0.05, 0.05, generator=generator)
        self.layers = torch.nn.ParameterList([torch.nn.Parameter(init[layer].clone()) for layer in range(n_layers)])

    @property
    def proj(self) -> torch.Tensor:
        return torch.stack(list(self.layers))

    def distances(self, x: torch.Tensor) -> torch.Tensor:
        """x [L+1, B, T, H] -> squared distances [L+1, B, T, T]."""
        z = torch.einsum("lbth,lhk->lbtk", x, self.proj)
        sq = (z * z).sum(-1)
        # ||z_i - z_j||^2 through the Gram matrix: memory [L+1, B, T, T], not [.., T, T, k].
        return (sq.unsqueeze(-1) + sq.unsqueeze(-2) - 2 * z @ z.transpose(-1, -2)).clamp(min=0)

    def depths(self, x: torch.Tensor) -> torch.Tensor:
        """x [L+1, B, T, H] -> squared norms [L+1, B, T]."""
        z = torch.einsum("lbth,lhk->lbtk", x, self.proj)
        return (z * z).sum(-1)


def _probe_loss(probe, kind, x, mask, dist, depth) -> torch.Tensor:
    """Per-layer L1 loss [L+1], averaged over sentences, normalised by length (squared for distances)."""
    lengths = mask.sum(1).clamp(min=1).float()
    if kind == "distance":
        pred = probe.distances(x)
        pair_mask = (mask.unsqueeze(2) & mask.unsqueeze(1)).float()
        per_sent = ((pred - dist).abs() * pair_mask).sum((-1, -2)) / lengths**2
    else:
        pred = probe.depths(x)
        per_sent = ((pred - depth).abs() * mask.float()).sum(-1) / lengths
    return per_sent.mean(-1)


def _length_buckets(data: TreeSet, batch_size: int, rng: np.random.Generator) -> list[list[int]]:
    """Batches of similar-length sentences (little padding), visited in random order."""
    lengths = np.diff(data.offsets)
    order = np.argsort(lengths + rng.random(len(lengths)), kind="stable")  # random among equal lengths
    batches = [order[i:i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    return [batches[i] for i in rng.permutation(len(batches))]


@dataclass
class StructuralFit:
    kind: str
    proj: torch.Tensor  # [L+1, H, k], best dev state per layer
    dev_loss: np.ndarray  # [L+1]
    epochs: int
    lr_decay: float
    dev_loss_history: np.ndarray | None = None  # [epochs, L+1]: each epoch's dev loss
    lr_history: np.ndarray | None = None  # [epochs, L+1]: the learning rate each epoch trained with
    scaling: tuple[torch.Tensor, torch.Tensor] | None = None  # (mean, sd) [L+1, 1, 1, H] when standardised


def feature_scaling(data: TreeSet, chunk_bytes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per layer and dimension, the mean and standard deviation of the training words' features
    (shaped [L+1, 1, 1, H] to broadcast over padded batches; sd floored at 1e-6).

    Why: a few dimensions of Llama-style models carry "massive activations" thousands of times the
    others on a few tokens (Sun et al. 2024, "Massive Activations in Large Language Models"); on raw
    features the squared distances of the structural probe are dominated by them and Adam at the
    paper's rate cannot undo that scale. z-scoring each dimension (the linear probes' default,
    `probes.core.fitting.ProbeConfig.standardize`) makes the fit independent of per-dimension scale.

    Memory: the words are read straight from `data.features` (no padding) in chunks of about
    `chunk_bytes` (default `SCALING_CHUNK_BYTES`) of float32 over all layers, each summed into
    float64 accumulators (sum and sum of squares, [L+1, H] each), so the only copies are one
    chunk's. The statistics are those of one float64 pass over every word, as before (when padded
    batches of 256 sentences were built for it); only the order of the float64 sums differs."""
    n_layers, _, hidden = data.features.shape
    first, last = int(data.offsets[0]), int(data.offsets[-1])
    step = max(1, (chunk_bytes or SCALING_CHUNK_BYTES) // (n_layers * hidden * 4))
    total = torch.zeros(n_layers, hidden, dtype=torch.float64)
    total_sq = torch.zeros(n_layers, hidden, dtype=torch.float64)
    for start in range(first, last, step):
        chunk = torch.from_numpy(np.array(data.features[:, start:min(start + step, last)], dtype=np.float64))
        total += chunk.sum(1)
        total_sq += (chunk * chunk).sum(1)
    count = max(last - first, 1)
    mean = total / count
    sd = (total_sq / count - mean ** 2).clamp_min(0).sqrt().clamp_min(1e-6)
    return mean.float()[:, None, None, :], sd.float()[:, None, None, :]


def _scaled(x: torch.Tensor, scaling) -> torch.Tensor:
    """z-score a freshly built batch in place (the same float32 operations as `(x - mean) / sd`, so
    the same numbers, without a second batch-sized tensor). The mean is subtracted even for the
    distance probe, where it cancels in h_i - h_j, because the distances are computed through the
    Gram matrix (||z_i||^2 + ||z_j||^2 - 2 z_i.z_j): with a massive-activation offset left in,
    float32 would lose the small differences to cancellation."""
    return x if scaling is None else x.sub_(scaling[0]).div_(scaling[1])


def _on(batch, scaling, device: torch.device):
    """A batch moved to `device` and standardised there (in place)."""
    x, mask, dist, depth = (t.to(device) for t in batch)
    return _scaled(x, scaling), mask, dist, depth


def _dev_batches(dev: TreeSet, batch_size: int):
    """The dev set's batches, built when used rather than all kept in memory for the whole fit
    (padded, all layers, they are several times the dev features' own size); same batches, same
    order, so the same dev losses."""
    for i in range(0, len(dev), batch_size):
        yield dev.batch(list(range(i, min(i + batch_size, len(dev)))))


class LayerwisePlateau:
    """One learning-rate schedule per layer, as Hewitt & Manning train one probe per layer: torch's
    `ReduceLROnPlateau` (mode "min", patience 0, relative `threshold`) on that layer's own dev loss,
    multiplying its rate by `factor` after each epoch that did not beat the layer's best by the
    threshold. `factor` 1.0 keeps the rates constant."""

    def __init__(self, optimizers: list[torch.optim.Optimizer], factor: float = PLATEAU_FACTOR,
                 threshold: float = PLATEAU_THRESHOLD):
        if not 0 < factor <= 1:
            raise ValueError(f"lr_decay must lie in (0, 1], got {factor}")
        self.optimizers = optimizers
        self.schedulers = [] if factor == 1 else [
            torch.optim.lr_scheduler.ReduceLROnPlateau(o, mode="min", factor=factor, patience=0, threshold=threshold)
            for o in optimizers]

    def lrs(self) -> np.ndarray:
        return np.array([o.param_groups[0]["lr"] for o in self.optimizers])

    def step(self, dev_loss) -> None:
        for scheduler, loss in zip(self.schedulers, np.asarray(dev_loss, dtype=np.float64)):
            scheduler.step(float(loss))


def probe_rank(rank: int | str, hidden: int) -> int:
    """The projection's rank: `rank` capped at the feature width, or the width itself for "full"
    (Hewitt & Manning's probes are full rank: B is H x H)."""
    if rank == "full":
        return hidden
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise ValueError(f"rank must be a positive integer or 'full', got {rank!r}")
    return min(int(rank), hidden)


def fit_structural_probe(train: TreeSet, dev: TreeSet, kind: str = "distance", rank: int | str = 64,
                         epochs: int = 30, batch_size: int = 32, lr: float = 1e-3, patience: int = 4,
                         lr_decay: float = PLATEAU_FACTOR, seed: int = 0, progress: bool = True,
                         standardize: bool = True, device: str | torch.device | None = "auto") -> StructuralFit:
    """Fit distance or depth probes for all layers at once (Hewitt & Manning 2019).

    The paper's regimen (structural-probes/regimen.py), per layer: Adam at 1e-3 and torch's
    ReduceLROnPlateau on the layer's dev loss with patience 0, factor `lr_decay` (theirs: 0.1) and
    relative threshold 1e-4: after every epoch whose dev loss is not below (1 - 1e-4) x the best so
    far, that layer's learning rate is multiplied by `lr_decay` (1.0 turns it off;
    `LayerwisePlateau`). Each layer keeps the projection of its best dev-loss epoch; training stops
    when no layer has improved for `patience` epochs. Without the decay a probe trained on a few
    thousand sentences stops within 3-4 epochs, still oscillating, and its UUAS moves by ~0.05 with
    the model's seed (docs/evidence/training-plateau.md, which also compares factor 0.1 with 0.5).
    `standardize` (the default since issue 49) z-scores every feature dimension with the training
    words' statistics first (`feature_scaling`); `standardize=False` is Hewitt & Manning's probe on
    raw features. The distance and depth probes are linear maps of the features, so z-scoring changes
    nothing they can express (B on z-scored features is diag(1/sd) B on raw ones), only the
    conditioning of the fit: on a Llama-style model, whose few massive-activation dimensions are
    thousands of times the others (Sun et al. 2024), the raw fit at the paper's rate does not find
    the map (SmolLM2-135M, 2,000 trees: UUAS 0.17-0.23 at layers 12-29, below the right-branching
    chain's 0.43; standardised 0.44-0.48 at layers 22-29; docs/evidence/structural-fit.md). `rank`: an
    integer (capped at the width) or "full" (`probe_rank`).

    `device` ("auto": CUDA when torch sees it, else the CPU; `resolve_device`) is where the probe,
    its optimizers and each batch live. Everything random stays on the CPU (the initial projection
    from a CPU generator, the batch order from numpy), and the schedule and best-epoch bookkeeping
    read the dev losses back on the CPU, so a device changes only the float rounding of the sums.
    Memory: the features are read one padded batch at a time (`TreeSet.batch`), standardised in
    place, and the dev batches are rebuilt each epoch rather than kept, so the fit holds no copy of
    the features beyond a batch (docs/evidence/structural-fit.md).
    """
    if kind not in ("distance", "depth"):
        raise ValueError(f"kind must be 'distance' or 'depth', not {kind!r}")
    if not 0 < lr_decay <= 1:
        raise ValueError(f"lr_decay must lie in (0, 1], got {lr_decay}")
    if not isinstance(standardize, (bool, np.bool_)):
        raise ValueError(f"standardize must be true or false, got {standardize!r}")
    probe_rank(rank, 1)  # a bad rank is refused before any work
    device = resolve_device(device)
    gen = torch.Generator().manual_seed(seed)
    n_layers, _, hidden = train.features.shape
    scaling = feature_scaling(train) if standardize else None
    scaling_on = None if scaling is None else tuple(t.to(device) for t in scaling)
    probe = LayerwiseStructuralProbe(n_layers, hidden, probe_rank(rank, hidden), gen).to(device)
    # one Adam per layer (Adam's state is per parameter: the same updates as one optimizer over all
    # layers), so that each layer's rate has its own plateau schedule
    opts = [torch.optim.Adam([p], lr=lr) for p in probe.layers]
    schedule = LayerwisePlateau(opts, lr_decay)
    loss_history, lr_history = [], []
    best = torch.full((n_layers,), float("inf"))
    best_proj = probe.proj.detach().cpu().clone()
    stale = 0
    order_rng = np.random.default_rng(seed)
    epoch = 0
    for epoch in progress_bar(range(1, epochs + 1), desc=f"{kind} probe", disable=not progress):
        for batch_idx in _length_buckets(train, batch_size, order_rng):
            x, mask, dist, depth = _on(train.batch(batch_idx), scaling_on, device)
            loss = _probe_loss(probe, kind, x, mask, dist, depth).sum()  # layers are independent
            for opt in opts:
                opt.zero_grad()
            loss.backward()
            for opt in opts:
                opt.step()
        with torch.no_grad():
            dev_loss = torch.zeros(n_layers, device=device)
            for batch in _dev_batches(dev, batch_size):
                x, mask, dist, depth = _on(batch, scaling_on, device)
                dev_loss += _probe_loss(probe, kind, x, mask, dist, depth) * x.shape[1]
            dev_loss = (dev_loss / len(dev)).cpu()
        improved = dev_loss < best - 1e-6
        best = torch.where(improved, dev_loss, best)
        best_proj[improved] = probe.proj.detach().cpu()[improved]
        loss_history.append(dev_loss.numpy().copy())
        lr_history.append(schedule.lrs())
        schedule.step(dev_loss)
        stale = 0 if improved.any() else stale + 1
        if stale >= patience:
            break
    return StructuralFit(kind=kind, proj=best_proj, dev_loss=best.numpy(), epochs=epoch, lr_decay=lr_decay,
                         dev_loss_history=np.array(loss_history), lr_history=np.array(lr_history), scaling=scaling)


@torch.no_grad()
def predict(fit: StructuralFit, data: TreeSet, batch_size: int = 64,
            device: str | torch.device | None = "auto") -> list[list[np.ndarray]]:
    """Predictions per layer, per sentence: distance matrices [n, n] or depth vectors [n] (numpy,
    each its own small array: a view would keep its whole padded batch alive)."""
    device = resolve_device(device)
    probe = LayerwiseStructuralProbe(*fit.proj.shape, torch.Generator())
    with torch.no_grad():
        for layer, param in enumerate(probe.layers):
            param.copy_(fit.proj[layer])
    probe = probe.to(device)
    scaling = None if fit.scaling is None else tuple(t.to(device) for t in fit.scaling)
    out: list[list[np.ndarray]] = [[] for _ in range(fit.proj.shape[0])]
    for start in range(0, len(data), batch_size):
        idx = list(range(start, min(start + batch_size, len(data))))
        x, mask, _, _ = _on(data.batch(idx), scaling, device)
        pred = (probe.distances(x) if fit.kind == "distance" else probe.depths(x)).cpu()
        for b in range(len(idx)):
            n = int(mask[b].sum())
            for layer in range(len(out)):
                p = pred[layer, b, :n, :n] if fit.kind == "distance" else pred[layer, b, :n]
                out[layer].append(p.numpy().copy())
    return out


def sentence_scores(kind: str, preds: list[list[np.ndarray]], data: TreeSet) -> dict[str, np.ndarray]:
    """Every structural metric per layer and sentence: the one place they are computed (totals
    below and sentence bootstraps in `probes.syntax` both start here).

    distance: "uuas_correct" [L, S] and "uuas_total" [S] (undirected edges, punctuation excluded),
    "dspr" [L, S]; depth: "root_hit" [L, S], "nspr" [L, S]. NaN = the sentence does not count.
    """
    keep = [data.keep(i) for i in range(len(data))]
    if kind == "distance":
        gold_edges_ = [gold_edges(data.heads[i], keep[i]) if keep[i].sum() >= 2 else set() for i in range(len(data))]
        counts = np.array([[uuas_counts(p, data.heads[i], keep[i], gold_edges_[i]) for i, p in enumerate(layer)]
                           for layer in preds], dtype=np.float64).reshape(len(preds), len(data), 2)
        gold = data.gold_distances
        return {"uuas_correct": counts[..., 0], "uuas_total": counts[0, :, 1] if len(preds) else np.zeros(len(data)),
                "dspr": np.array([[sentence_dspr(p, gold[i]) for i, p in enumerate(layer)] for layer in preds])}
    if kind == "depth":
        gold = data.gold_depths
        return {"root_hit": np.array([[sentence_root_hit(p, data.heads[i], keep[i]) for i, p in enumerate(layer)]
                                      for layer in preds]),
                "nspr": np.array([[sentence_nspr(p, gold[i]) for i, p in enumerate(layer)] for layer in preds])}
    raise ValueError(f"kind must be 'distance' or 'depth', got {kind!r}")


def score_distance(preds: list[list[np.ndarray]], data: TreeSet) -> list[dict[str, float]]:
    """UUAS and DSpr per layer."""
    s, lengths = sentence_scores("distance", preds, data), [len(h) for h in data.heads]
    total = float(s["uuas_total"].sum())
    dspr = length_averaged(s["dspr"], lengths)
    return [{"uuas": float(c.sum()) / total if total else float("nan"), "dspr": float(d), "n_edges": int(total)}
            for c, d in zip(s["uuas_correct"], dspr)]


def score_depth(preds: list[list[np.ndarray]], data: TreeSet) -> list[dict[str, float]]:
    """Root accuracy and NSpr per layer."""
    s, lengths = sentence_scores("depth", preds, data), [len(h) for h in data.heads]
    nspr = length_averaged(s["nspr"], lengths)
    return [{"root_acc": float(np.nanmean(h)) if np.isfinite(h).any() else float("nan"), "nspr": float(r),
             "n_sentences": len(data)} for h, r in zip(s["root_hit"], nspr)]


def right_branching_uuas(data: TreeSet) -> float:
    correct = total = 0
    for i in range(len(data)):
        c, t = right_branching_uuas_counts(data.heads[i], data.keep(i))
        correct, total = correct + c, total + t
    return correct / total if total else float("nan")
