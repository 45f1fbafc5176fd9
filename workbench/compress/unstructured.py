"""Unstructured pruning of the transformer blocks: global magnitude, random, and the lottery ticket.

Lottery tickets for BERT follow Chen et al. (2020), "The Lottery Ticket Hypothesis for Pre-trained
BERT Networks" (after Frankle & Carbin 2019):

- the prunable set is every dense weight matrix of every transformer block (attention Q, K, V and
  output projections, the intermediate and output dense layers of the MLP); it is found by module
  structure (`prunable_weights`: the `nn.Linear` / GPT-2 `Conv1D` weights inside each repeated
  block list, `nn.ModuleList`), not by one family's parameter names, so BERT, MPNet, RoBERTa,
  GPT-2 or Llama blocks are all covered. Chen et al. prune the pooler too (BERT's dense layer over
  [CLS], pretrained with NSP): their `pruning_model` ranks `bert.pooler.dense.weight` in the same
  global set as the 72 block matrices, and `prunable_weights` follows them (`include_pooler`, on by
  default; the base model's `pooler`, where the family has one: BERT, MPNet, ALBERT). Embeddings
  and the task head stay unpruned unless asked;
- pruning is global: the weights of smallest magnitude over the whole set go first
  (`magnitude_masks`), so layers lose different fractions;
- iterative magnitude pruning (IMP) removes `step` (10%) of the *original* prunable weights per
  round, a linear schedule (10%, 20%, ... 90%), each round from the weights trained under the
  previous mask; the survivors are then rewound to the pretrained weights (or to an early
  fine-tuning step, Frankle et al. 2020, "Linear Mode Connectivity and the Lottery Ticket
  Hypothesis") and trained again with a fresh optimizer (the loop itself is in
  `workbench.drivers.prune_sweep`, on `workbench.drivers.finetune`'s training with a `keep_masked` hook);
- the comparisons (Chen et al. Sec. 3): one-shot magnitude pruning to the target sparsity,
  random pruning (`random_masks`, same sparsity), and the ticket's mask on re-initialised weights.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from workbench.compress.masks import Masks
from workbench.errors import ConfigError


def is_dense(module: torch.nn.Module) -> bool:
    """A dense layer: `nn.Linear`, or transformers' `Conv1D` (GPT-2: weight stored [in, out])."""
    return isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"


def output_axis(module: torch.nn.Module) -> int:
    """The axis of a dense layer's weight that indexes output channels (Linear: 0, Conv1D: 1)."""
    return 0 if isinstance(module, torch.nn.Linear) else 1


def block_lists(model: torch.nn.Module) -> list[tuple[str, torch.nn.ModuleList]]:
    """The repeated transformer blocks of `model`: every `nn.ModuleList` whose items are modules of
    one class that hold dense layers (BERT's `encoder.layer`, GPT-2's `h`, Llama's `layers`, the
    encoder and decoder lists of T5/BART). Lists inside a block (ALBERT's groups) are part of it."""
    found: list[tuple[str, torch.nn.ModuleList]] = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.ModuleList) or len(module) == 0:
            continue
        if any(name.startswith(outer + ".") for outer, _ in found):
            continue
        if len({type(m) for m in module}) == 1 and any(is_dense(m) for m in module[0].modules()):
            found.append((name, module))
    return found


def base_model(model: torch.nn.Module) -> torch.nn.Module | None:
    """The transformers base model inside `model` (a classifier's body, or the body of the model a
    pretraining module wraps): the first `PreTrainedModel` among its modules, its `base_model`."""
    from transformers import PreTrainedModel

    for module in model.modules():
        if isinstance(module, PreTrainedModel):
            return module.base_model
    return None


def pooler(model: torch.nn.Module) -> tuple[str, torch.nn.Module] | None:
    """(its name in `model.named_modules()`, the module) of the base model's pooler, the dense layer
    over the first token that BERT pretrains with NSP (MPNet, ALBERT have one too); None where the
    family has none (GPT-2, Llama, DeBERTa, RoBERTa's classifier, ...)."""
    base = base_model(model)
    found = getattr(base, "pooler", None) if base is not None else None
    if not isinstance(found, torch.nn.Module):
        return None
    return next(((name, m) for name, m in model.named_modules() if m is found), None)


def pooler_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """{weight name: module} of the dense layers of the pooler (`pooler`); {} without one."""
    found = pooler(model)
    if found is None:
        return {}
    name_of = {id(p): n for n, p in model.named_parameters()}
    return {name_of[id(m.weight)]: m for m in found[1].modules() if is_dense(m) and id(m.weight) in name_of}


def dense_layers(model: torch.nn.Module, include_embeddings: bool = False,
                 include_head: bool = False, include_pooler: bool = False) -> dict[str, torch.nn.Module]:
    """{weight name: its module} for the block matrices (module docstring), names as in
    `model.named_parameters()`. `include_embeddings` adds the input embedding matrix (the module
    is the embedding), `include_head` the 2-d weights outside the base model (a classifier),
    `include_pooler` the pooler's dense layer (`pooler_layers`; Chen et al.'s prunable set is the
    blocks and the pooler: `prunable_weights`' default)."""
    name_of = {id(p): n for n, p in model.named_parameters()}  # shared tensors: their first name
    out: dict[str, torch.nn.Module] = {}
    for list_name, blocks in block_lists(model):
        for module in blocks.modules():
            if is_dense(module) and id(module.weight) in name_of:
                out.setdefault(name_of[id(module.weight)], module)
    if not out:
        raise ConfigError(f"{type(model).__name__}: no dense layers inside repeated transformer blocks to prune")
    if include_pooler:
        for name, module in pooler_layers(model).items():
            out.setdefault(name, module)
    if include_embeddings:
        emb = model.get_input_embeddings()
        out.setdefault(name_of[id(emb.weight)], emb)
    if include_head:
        base = {id(p) for p in model.base_model.parameters()} if model.base_model is not model else set()
        for mod_name, module in model.named_modules():
            w = getattr(module, "weight", None)
            if (isinstance(w, torch.nn.Parameter) and w.ndim == 2 and id(w) not in base and id(w) in name_of
                    and not isinstance(module, torch.nn.Embedding)):
                out.setdefault(name_of[id(w)], module)
    return out


def prunable_weights(model: torch.nn.Module, include_embeddings: bool = False, include_head: bool = False,
                     include_pooler: bool = True) -> list[str]:
    """The names of the prunable weights (`dense_layers`), in model order: by default Chen et al.'s
    set, the block matrices and the pooler."""
    return list(dense_layers(model, include_embeddings, include_head, include_pooler))


def full_masks(model: torch.nn.Module, names: list[str]) -> Masks:
    """Masks that keep everything."""
    params = dict(model.named_parameters())
    return {n: torch.ones_like(params[n], dtype=torch.bool, device="cpu") for n in names}


def _prune_count(total: int, amount: float) -> int:
    if not 0.0 <= amount < 1.0:
        raise ConfigError(f"sparsity must be in [0, 1), got {amount}")
    return int(round(amount * total))


def magnitude_masks(model: torch.nn.Module, names: list[str], amount: float,
                    current: Mapping[str, torch.Tensor] | None = None) -> Masks:
    """Global magnitude pruning: masks that prune exactly round(amount * N) of the N weights named,
    the smallest |w| first. Weights `current` already prunes stay pruned (they are ranked first),
    so an IMP round's masks are nested in the previous round's. Ties are broken by position, so
    the count is exact."""
    params = dict(model.named_parameters())
    flat, sizes = [], []
    for n in names:
        score = params[n].detach().abs().float().reshape(-1).cpu()
        if current is not None:
            score = torch.where(current[n].reshape(-1), score, torch.full_like(score, -1.0))
        flat.append(score)
        sizes.append(score.numel())
    scores = torch.cat(flat)
    k = _prune_count(scores.numel(), amount)
    if current is not None:
        already = int((scores < 0).sum())
        if already > k:
            raise ConfigError(f"magnitude pruning to {amount}: the current masks already prune more ({already} > {k})")
    keep = _smallest_pruned(scores, k)
    return {n: m.reshape(params[n].shape) for n, m in zip(names, torch.split(keep, sizes))}


def _smallest_pruned(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep-mask pruning exactly the `k` smallest scores; ties at the threshold go by position.
    A selection (`kthvalue`, linear time) rather than a full sort: on MiniLM's 10.6M block weights
    it is the bulk of an IMP round's fixed cost (benchmarks/bench_imp_round.py)."""
    keep = torch.ones(scores.numel(), dtype=torch.bool)
    if k == 0:
        return keep
    threshold = scores.kthvalue(k).values
    below = scores < threshold
    keep[below] = False
    ties = torch.nonzero(scores == threshold).flatten()[: k - int(below.sum())]
    keep[ties] = False
    return keep


def layerwise_magnitude_masks(model: torch.nn.Module, amounts: Mapping[str, float]) -> Masks:
    """Magnitude pruning within each named matrix to its own sparsity (`amounts`: name -> fraction):
    the comparison for low rank at equal parameter counts, matrix by matrix."""
    params = dict(model.named_parameters())
    out: Masks = {}
    for n, a in amounts.items():
        w = params[n].detach()
        scores = w.abs().float().reshape(-1).cpu()
        out[n] = _smallest_pruned(scores, _prune_count(scores.numel(), a)).reshape(w.shape)
    return out


def random_masks(model: torch.nn.Module, names: list[str], amount: float, seed: int) -> Masks:
    """Random pruning: exactly round(amount * N) of the N weights named, drawn uniformly over the
    whole set with a generator seeded by `seed` (the global RNG is untouched)."""
    params = dict(model.named_parameters())
    sizes = [params[n].numel() for n in names]
    total = sum(sizes)
    k = _prune_count(total, amount)
    g = torch.Generator().manual_seed(int(seed))
    keep = torch.ones(total, dtype=torch.bool)
    keep[torch.randperm(total, generator=g)[:k]] = False
    return {n: m.reshape(params[n].shape) for n, m in zip(names, torch.split(keep, sizes))}


def imp_schedule(target: float, step: float = 0.1) -> list[float]:
    """The sparsities IMP passes through to reach `target`: step, 2*step, ... (fractions of the
    original prunable weights, Chen et al.'s linear schedule). `target` must be a multiple of step."""
    rounds = round(target / step)
    if rounds < 1 or abs(rounds * step - target) > 1e-9:
        raise ConfigError(f"IMP sparsity {target} is not a multiple of the per-round step {step}")
    return [round(step * r, 10) for r in range(1, rounds + 1)]
