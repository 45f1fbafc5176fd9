"""Attention heads and MLPs: gates, gradient importance, iterative pruning and physical removal.

Follows Michel, Levy & Neubig (2019), "Are Sixteen Heads Really Better than One?" and Prasanna,
Rogers & Rumshisky (2020), "When BERT Plays the Lottery, All Tickets Are Winning".

- **Gates** (`gates`): a scalar xi_h multiplies the context vector of head h (its slice of the
  input of the attention output projection, i.e. before W_O mixes the heads), and xi_m multiplies
  the output of layer m's MLP (its second projection, bias included, before the residual). They
  are a forward pre-hook on the output projection and a forward hook on the MLP's last projection,
  so they work whatever attention implementation (eager, sdpa) runs inside. transformers 5
  ignores `head_mask`; these hooks are the workbench's own masking, and the tests check that the
  outputs move.
- **Importance** (`head_importance`): I_h = E_x |dL(x)/dxi_h| at xi = 1 (the current mask), summed
  over examples and divided by the number of tokens; then, as in the reference implementations
  (Michel et al.'s code and transformers' `examples/research_projects/bertology/run_bertology.py`):
  each layer's vector is divided by its L2 norm, then the whole matrix is min-max scaled to [0, 1].
  The absolute value is taken of each *example's* gradient (`per_example=True`): the reference
  scripts run batches of one (`--batch_size 1`), and the absolute value of a batch-mean gradient
  lets opposite-signed examples cancel, so the ranking would depend on the batch size. The exact
  per-example gradients come from one batched pass: each example gets its own copy of the gates
  (a [B, layers, heads] tensor), and the gradient of the *sum* of the per-example losses in
  example b's copy is dL(x_b)/dxi (the examples do not interact), as fast as a batched pass.
  `per_example=False` takes |dL/dxi| of each batch's mean loss (the rule before issue 49, with
  the fine-tuning batch). The classifier wiring (`classifier_importance`) takes the examples from
  the dev split by default, as both reference scripts do (Prasanna et al.'s `--use_train_data`,
  the train split, is `importance_split: train`), and the examples per |gradient| from
  `importance_batch` (1, the default, per example; n: |gradient| of n examples' mean loss;
  "finetune": of the fine-tuning batch, the rule before issue 49). MLP importance (Prasanna et
  al.) is the same gradient on the MLP gates, L2-normalised over layers (one MLP per layer) and
  min-max scaled.
- **Masks as weights** (`apply_mask`): a head is removed by zeroing its columns of the output
  projection (exactly the same as gate 0 on its context vector), an MLP by zeroing its last
  projection's weight and bias (gate 0 on its output). So a masked model is an ordinary
  checkpoint that opens in plain transformers with the same outputs, and a masked *derived handle*
  (`masked_handle`) gets its own content hash. During (re-)fine-tuning `mask_keeper` re-zeroes
  those weights after every optimizer step (`TrainingHooks(after_step=...)`): the gradients of a
  removed head's Q/K/V are zero anyway (its output meets zeroed columns), only the zeroed columns
  themselves would move.
- **Iterative pruning** (`iterative_pruning`): Michel et al.'s procedure: each step removes
  `fraction` (10%) of the *total* number of heads (at least one, never more than are left), ordered
  by importance recomputed on the masked model at each step, until the task metric falls below 90%
  of the full model's. The step is a share of the total as in Michel et al.'s `run_bertology`
  (`int(masking_amount x heads)` per step) and in Prasanna et al.'s code: 14, 28, 42, ... of
  BERT-base's 144 heads, 7, 14, 21, ... of MiniLM's 72. `step_of="remaining"` keeps the
  workbench's earlier variant, 10% of the heads still present per step (14, 27, 38, 48, 57, ...:
  finer steps as the model shrinks). Orders: "good" (least important first: the subnetwork the
  method finds), "bad" (most important first) and "random" (a seeded permutation). `units` says
  what is pruned: "heads" (Michel et al.), "mlps" or "both" (Prasanna et al. 2020, Sec. 3: heads
  and MLPs pruned by their importance scores until the score falls below 90% of the full
  model's). With "both" each step removes the step's share of the heads *and* of the MLPs (at
  least one of each while any is left), each pool ranked by its own score: the two are normalised
  separately (per-layer L2 for heads, over layers for MLPs), so a head's score is not compared
  with an MLP's. Then, as Prasanna et al.'s `find_head_mlp_masks.py` does (`both_schedule:
  continue`, the default), the search goes on from the last mask above the line: heads alone in
  half steps (`num_to_mask // 2`: 5% of the heads, 3 of MiniLM's 72, 7 of BERT-base's 144) until
  the metric falls below the line, then from the last good mask MLPs alone, one per step, until
  it does; the subnetwork is the last mask above the line. Each step records its `phase`
  ("joint", "heads", "mlps"). `both_schedule: joint` stops after the joint phase (before issue 49).
- **Subnetworks of equal size** (`equal_size_subnetwork`): Prasanna et al. compare the "good"
  subnetwork (the good order's mask at the threshold) with "random" and "bad" subnetworks *of the
  same size*. Random: as many units as the good one keeps, drawn uniformly (seeded). Bad, as the
  authors' code builds it (franken_bert.py, mask mode "bad"): from the units the good procedure
  *pruned*: when there are at least as many of them as the good subnetwork keeps, that many are
  drawn from them; otherwise all of them, topped up with units drawn from the good subnetwork
  itself. Heads and MLPs are two pools, each sized by the good mask's own count. The
  `subnetworks="threshold"` setting keeps the earlier comparison: each order's own mask where
  its curve crosses the threshold (the random and bad orders stop sooner, so those are larger).
- **Physical removal** (`slice_heads`): Q/K/V rows and O columns of removed heads are cut out, and
  a removed MLP's input projections are sliced to zero output rows and its last projection to zero
  input columns with a zero bias (the MLP computes nothing and adds exactly zero; GPT-2's Conv1D
  keeps one unit with zero output weights), giving a
  smaller model with the same outputs as the masked one. transformers' configs hold one head count for all layers and no per-layer MLP
  width, so a sliced model cannot be saved as a plain checkpoint: slicing is the in-memory speed
  path, and the checkpoint of a pruned model is the masked (zeroed) one. A layer that loses every
  head keeps one head whose output columns are zero (a zero-width view cannot be reshaped by the
  attention code): same outputs, one head's cost.

Families: those whose layers are recognised by `attention_sites`: BERT (MiniLM), RoBERTa, ELECTRA,
SpanBERT (BERT modules), the DeBERTa-style reference encoder (DebertaV2), GPT-2 and Llama-style
decoders (SmolLM2; grouped K/V are expanded to one K/V per query head when slicing). ALBERT is
refused: its layers share one set of weights, so a per-layer head mask is not a weight mask.

Concerns:
- head and MLP masks (shapes, checks, records): `head_shape`, `check_mask`, `mask_from_removed`,
  `kept_from_removed`, `mask_record`
- gates and gradient importance (Michel et al. 2019): `gates`, `Importance`, `normalise_importance`,
  `per_example_loss_sum`, `head_importance`, `leave_one_out`
- applying a mask, as weights or physically: `apply_mask`, `mask_keeper`, `masked_handle`,
  `slice_heads`, `parameter_count`
- the head-pruning settings: `HeadPruningSettings`, `load_settings`
- iterative pruning curves and the subnetworks they stand for (Prasanna et al. 2020): `PruningStep`,
  `PruningCurve`, `heads_to_remove`, `iterative_pruning`, `equal_size_subnetwork`, `order_subnetwork`
- the fine-tuned classifier as what is pruned (issue 51: the rest are `workbench.compress`
  primitives): `masked_accuracy`, `classifier_importance`, `classifier_curve`, `curve_rows`
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from workbench.errors import ConfigError, WorkbenchError
from workbench.running import ModelRunner
from workbench.running.sites import LayerSites, attention_sites, is_conv1d  # noqa: F401 (LayerSites re-exported)
from workbench.drivers.prune_rows import PROBE

ORDERS = ("good", "random", "bad")
UNITS = ("heads", "mlps", "both")  # what the iterative procedure prunes (module docstring)
STEP_OF = ("total", "remaining")   # what `fraction` is a share of each step (module docstring)
SUBNETWORKS = ("equal_size", "threshold")  # how the random and bad subnetworks are sized (module docstring)
IMPORTANCE_SPLITS = ("dev", "train")   # where the importance examples come from (module docstring)
BOTH_SCHEDULES = ("continue", "joint")  # units "both": Prasanna et al.'s continuation, or the joint phase only
FINETUNE_BATCH = "finetune"  # importance_batch: |gradient| of each fine-tuning batch (the rule before issue 49)


# --------------------------------------------------------------------------------------- the sites


def head_shape(model: nn.Module) -> tuple[int, int]:
    """(layers, heads per layer) of a model (the largest head count where layers differ)."""
    sites = attention_sites(model)
    return len(sites), max(s.num_heads for s in sites)


def check_mask(model: nn.Module, heads_kept, mlps_kept=None, where: str = "mask") -> tuple[np.ndarray, np.ndarray]:
    """A head mask [layers, heads] and an MLP mask [layers] as bool arrays, checked against the
    model: one clear `ConfigError` for a wrong shape, and for a head index out of range."""
    sites = attention_sites(model)
    L, H = len(sites), max(s.num_heads for s in sites)
    heads = np.asarray(heads_kept, dtype=bool)
    if heads.shape != (L, H):
        raise ConfigError(f"{where}: heads_kept has shape {heads.shape}, the model has {L} layers x {H} heads")
    mlps = np.ones(L, dtype=bool) if mlps_kept is None else np.asarray(mlps_kept, dtype=bool)
    if mlps.shape != (L,):
        raise ConfigError(f"{where}: mlps_kept has shape {mlps.shape}, the model has {L} layers")
    return heads, mlps


def mask_from_removed(model: nn.Module, removed: Iterable[tuple[int, int]], where: str = "heads") -> np.ndarray:
    """A heads-kept matrix with the (layer, head) pairs in `removed` off; an index out of range is
    one clear `ConfigError` naming it and the model's shape."""
    return kept_from_removed(head_shape(model), removed, where)


def kept_from_removed(shape: tuple[int, int], removed: Iterable[tuple[int, int]], where: str = "heads") -> np.ndarray:
    """`mask_from_removed` for a (layers, heads) shape known without the model (a checkpoint's
    config.json: the sweep checks its config before any work)."""
    L, H = shape
    kept = np.ones((L, H), dtype=bool)
    for pair in removed:
        try:
            layer, head = (int(v) for v in pair)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {pair!r} is not a (layer, head) pair") from None
        if not (0 <= layer < L and 0 <= head < H):
            raise ConfigError(f"{where}: head ({layer}, {head}) is out of range: the model has layers 0-{L - 1} "
                              f"and heads 0-{H - 1}")
        kept[layer, head] = False
    return kept


# ------------------------------------------------------------------------------------------ gates


def _head_gate(gate: torch.Tensor):
    """An edit of `blocks.{i}.attn.z` (the heads' context vectors [B, ..., heads x d_head]): head
    h's slice times gate[h], or with per-example gates [B, heads] example b's slice times gate[b, h]."""
    def edit(x: torch.Tensor) -> torch.Tensor:
        n = gate.shape[-1]
        g = gate.to(x.dtype)
        g = g.view(n, 1) if g.dim() == 1 else g.view(g.shape[0], *([1] * (x.dim() - 2)), n, 1)
        return (x.view(*x.shape[:-1], n, x.shape[-1] // n) * g).view(x.shape)
    return edit


def _mlp_gate(gate: torch.Tensor):
    """An edit of `blocks.{i}.mlp_out`: the MLP's output times its gate (a scalar, or one per
    example [B])."""
    def edit(output: torch.Tensor) -> torch.Tensor:
        g = gate.to(output.dtype)
        return output * (g if g.dim() == 0 else g.view(g.shape[0], *([1] * (output.dim() - 1))))
    return edit


@contextlib.contextmanager
def gates(model: nn.Module, head_gates: torch.Tensor, mlp_gates: torch.Tensor | None = None):
    """Run `model` with head gates [layers, heads] on the context vectors and MLP gates [layers] on
    the MLP outputs (module docstring): edits of the runner's `blocks.{i}.attn.z` and
    `blocks.{i}.mlp_out` (`workbench.running.ModelRunner.hooks`). The gates may require grad
    (importance) or hold a 0/1 mask (evaluation of a mask without copying the model); with a
    leading batch dimension ([B, layers, heads] and [B, layers]) each example has its own gates
    (per-example importance). The hooks are removed on exit."""
    runner = ModelRunner(model)
    edits = {}
    for i, s in enumerate(runner.sites()):
        edits[f"blocks.{i}.attn.z"] = _head_gate(head_gates[..., i, : s.num_heads])
        if mlp_gates is not None:
            edits[f"blocks.{i}.mlp_out"] = _mlp_gate(mlp_gates[..., i])
    with runner.hooks(edits):
        yield


# ------------------------------------------------------------------------------------- importance


@dataclass
class Importance:
    """Head importance [layers, heads] and MLP importance [layers]: `raw_*` = sum over batches of
    |dL/dxi| divided by the number of tokens; `heads` / `mlps` normalised (module docstring)."""

    raw_heads: np.ndarray
    raw_mlps: np.ndarray
    heads: np.ndarray
    mlps: np.ndarray
    tokens: int


def normalise_importance(raw: np.ndarray) -> np.ndarray:
    """Michel et al.'s reference normalisation: each row (a layer's heads; for a 1-D vector the
    whole vector) divided by its L2 norm, then the whole array min-max scaled to [0, 1]."""
    x = np.asarray(raw, dtype=np.float64)
    rows = x if x.ndim == 2 else x[None, :]
    norms = np.linalg.norm(rows, axis=-1, keepdims=True)
    rows = rows / np.where(norms > 0, norms, 1.0)
    lo, hi = rows.min(), rows.max()
    rows = (rows - lo) / (hi - lo) if hi > lo else np.zeros_like(rows)
    return rows if x.ndim == 2 else rows[0]


def _loss_of(out) -> torch.Tensor:
    loss = getattr(out, "loss", None)
    if loss is None:
        raise WorkbenchError("head importance: the model returned no loss (give batches with labels)")
    return loss


def per_example_loss_sum(out, batch: dict) -> torch.Tensor:
    """The sum over the batch's examples of each example's own loss L(x_b), the loss the model
    gives x_b alone: cross-entropy for a sentence label, the mean cross-entropy over the labelled
    tokens (labels != -100) for a token task. Its gradient in example b's gates is dL(x_b)/dxi."""
    logits, labels = out.logits, batch["labels"]
    if logits.dtype in (torch.float16, torch.bfloat16):  # the loss in float32 at least, as the model's own
        logits = logits.float()
    if labels.dim() == 1:
        return torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
    token = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none",
                                              ignore_index=-100)
    counts = (labels != -100).sum(1).clamp(min=1)
    return (token.sum(1) / counts).sum()


def head_importance(model: nn.Module, batches: Iterable[dict], heads_kept=None, mlps_kept=None,
                    loss_fn: Callable[[object, dict], torch.Tensor] | None = None,
                    per_example: bool = False) -> Importance:
    """Sum of |dL/dxi| for every head gate and MLP gate, over `batches` (dicts of tensors the model
    takes, labels included), divided by the tokens. `per_example=True`: |dL(x)/dxi| of each
    example, exactly, from one batched pass with per-example gates (module docstring; the loss is
    `loss_fn(outputs, batch)`, default `per_example_loss_sum`: the sum of the examples' own
    losses). `per_example=False`: |dL/dxi| of each batch's loss (`loss_fn`, default
    `outputs.loss`, the batch mean). The gates sit at the current mask (1 for kept, 0 for removed),
    as in the reference implementation that recomputes importance on the pruned model. The model
    runs in eval mode (no dropout) and is not changed; its parameters get no gradients
    (`torch.autograd.grad` on the gates only)."""
    sites = attention_sites(model)
    L, H = len(sites), max(s.num_heads for s in sites)
    heads = np.ones((L, H), bool) if heads_kept is None else np.asarray(heads_kept, bool)
    mlps = np.ones(L, bool) if mlps_kept is None else np.asarray(mlps_kept, bool)
    device = next(model.parameters()).device
    head_mask = torch.tensor(heads, dtype=torch.float32, device=device)
    mlp_mask = torch.tensor(mlps, dtype=torch.float32, device=device)
    if loss_fn is None:
        loss_fn = per_example_loss_sum if per_example else (lambda out, batch: _loss_of(out))
    raw_h = torch.zeros(L, H, dtype=torch.float64)
    raw_m = torch.zeros(L, dtype=torch.float64)
    tokens = 0
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            for batch in batches:
                batch = {k: v.to(device) for k, v in batch.items()}
                B = int(batch["input_ids"].shape[0])
                # per example: one copy of the gates per example, so the gradient of the summed
                # losses in copy b is example b's own gradient (its absolute value taken alone)
                head_gates = (head_mask.expand(B, L, H) if per_example else head_mask).clone().requires_grad_(True)
                mlp_gates = (mlp_mask.expand(B, L) if per_example else mlp_mask).clone().requires_grad_(True)
                with gates(model, head_gates, mlp_gates):
                    out = model(**batch)
                loss = loss_fn(out, batch)
                g_h, g_m = torch.autograd.grad(loss, [head_gates, mlp_gates], allow_unused=True)
                if g_h is not None:
                    g = g_h.detach().abs().double().cpu()
                    raw_h += g.sum(0) if per_example else g
                if g_m is not None:
                    g = g_m.detach().abs().double().cpu()
                    raw_m += g.sum(0) if per_example else g
                mask = batch.get("attention_mask")
                tokens += int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
    finally:
        model.train(was_training)
    raw_h, raw_m = (raw_h / max(tokens, 1)).numpy(), (raw_m / max(tokens, 1)).numpy()
    return Importance(raw_h, raw_m, normalise_importance(raw_h), normalise_importance(raw_m), tokens)


# ------------------------------------------------------------------------------ masks as weights


def _head_columns(site: LayerSites, heads: Sequence[int]) -> torch.Tensor:
    d = site.head_dim
    return torch.cat([torch.arange(h * d, (h + 1) * d) for h in heads]) if len(heads) else torch.zeros(0, dtype=torch.long)


@torch.no_grad()
def apply_mask(model: nn.Module, heads_kept, mlps_kept=None) -> nn.Module:
    """Zero, in place, the output-projection columns of every removed head and the last MLP
    projection (weight and bias) of every removed MLP; returns the model (module docstring)."""
    heads, mlps = check_mask(model, heads_kept, mlps_kept)
    for i, s in enumerate(attention_sites(model)):
        removed = [h for h in range(s.num_heads) if not heads[i, h]]
        if removed:
            cols = _head_columns(s, removed).to(s.out_proj.weight.device)
            if is_conv1d(s.out_proj):
                s.out_proj.weight[cols, :] = 0
            else:
                s.out_proj.weight[:, cols] = 0
        if not mlps[i]:
            s.mlp_out.weight.zero_()
            if getattr(s.mlp_out, "bias", None) is not None:
                s.mlp_out.bias.zero_()
    return model


def mask_keeper(heads_kept, mlps_kept=None) -> Callable[[nn.Module, int], None]:
    """An after-step hook (`workbench.loop.TrainingHooks(after_step=...)`) that keeps a mask
    applied through training: it re-zeroes the removed heads' and MLPs' weights after every step."""
    heads = np.asarray(heads_kept, bool)
    mlps = None if mlps_kept is None else np.asarray(mlps_kept, bool)

    def keep_head_mask(model: nn.Module, step: int) -> None:
        apply_mask(model, heads, mlps)

    return keep_head_mask


def mask_record(heads_kept, mlps_kept=None) -> dict:
    """The JSON parameters of a head-mask derivation: the kept matrix, MLPs kept and counts."""
    heads = np.asarray(heads_kept, bool)
    rec = {"heads_kept": heads.tolist(), "n_heads_kept": int(heads.sum()), "n_heads": int(heads.size)}
    if mlps_kept is not None:
        mlps = np.asarray(mlps_kept, bool)
        rec.update(mlps_kept=mlps.tolist(), n_mlps_kept=int(mlps.sum()), n_mlps=int(mlps.size))
    return rec


def _derive_mask(model, heads_kept, n_heads_kept=None, n_heads=None, mlps_kept=None, **_):
    return apply_mask(model, heads_kept, mlps_kept)


def masked_handle(handle, heads_kept, mlps_kept=None, **extra):
    """A derived `ModelHandle` with the mask applied as weights (transform "head_mask"); its
    lineage records the heads kept (layer x head bools), the MLPs kept and any `extra` JSON values
    (method, step, seed), its `checkpoint_hash` is its own content hash, and `.save(folder)` writes
    a plain checkpoint whose manifest carries all of it."""
    heads, mlps = check_mask(handle.model, heads_kept, mlps_kept, where="masked_handle")
    params = {**mask_record(heads, mlps if mlps_kept is not None else None), **extra}
    return handle.derive("head_mask", params, apply=_derive_mask)


# --------------------------------------------------------------------------------- physical removal


def _rows(linear: nn.Linear, idx: torch.Tensor) -> nn.Linear:
    with warnings.catch_warnings():  # a zero-width slice (a removed MLP): its init is a no-op, and says so
        warnings.simplefilter("ignore", UserWarning)
        new = nn.Linear(linear.in_features, len(idx), bias=linear.bias is not None,
                        device=linear.weight.device, dtype=linear.weight.dtype)
    new.weight.data = linear.weight.data[idx].clone()
    if linear.bias is not None:
        new.bias.data = linear.bias.data[idx].clone()
    return new


def _cols(linear: nn.Linear, idx: torch.Tensor, zero_bias: bool = False) -> nn.Linear:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        new = nn.Linear(len(idx), linear.out_features, bias=linear.bias is not None,
                        device=linear.weight.device, dtype=linear.weight.dtype)
    new.weight.data = linear.weight.data[:, idx].clone()
    if linear.bias is not None:
        new.bias.data = torch.zeros_like(linear.bias.data) if zero_bias else linear.bias.data.clone()
    return new


def _conv1d(weight: torch.Tensor, bias: torch.Tensor):
    from transformers.pytorch_utils import Conv1D

    new = Conv1D(weight.shape[1], weight.shape[0])
    new.weight.data = weight.clone()
    new.bias.data = bias.clone()
    return new.to(weight.device)


def _slice_attention(s: LayerSites, kept: list[int]) -> None:
    d, n = s.head_dim, s.num_heads
    zero_out = not kept
    kept = kept or [0]  # a layer with no head left keeps one whose output columns are zeroed
    idx = _head_columns(s, kept).to(s.out_proj.weight.device)
    a = s.attention
    if s.kind == "bert":
        for name in s.qkv + tuple(p for p in ("pos_key_proj", "pos_query_proj") if isinstance(getattr(a, p, None), nn.Linear)):
            setattr(a, name, _rows(getattr(a, name), idx))
        a.num_attention_heads, a.all_head_size = len(kept), len(kept) * d
        out = _cols(s.out_proj, idx)
    elif s.kind == "gpt2":
        E = n * d
        c = a.c_attn
        qkv_idx = torch.cat([idx, idx + E, idx + 2 * E])
        a.c_attn = _conv1d(c.weight.data[:, qkv_idx], c.bias.data[qkv_idx])
        a.num_heads, a.split_size = len(kept), len(kept) * d
        out = _conv1d(s.out_proj.weight.data[idx, :], s.out_proj.bias.data)
    else:  # llama: one K/V per kept query head (grouped K/V expanded), then no grouping
        groups = int(getattr(a, "num_key_value_groups", 1))
        kv_idx = torch.cat([torch.arange((h // groups) * d, (h // groups + 1) * d) for h in kept]).to(idx.device)
        a.q_proj = _rows(a.q_proj, idx)
        a.k_proj, a.v_proj = _rows(a.k_proj, kv_idx), _rows(a.v_proj, kv_idx)
        a.num_key_value_groups = 1
        a.workbench_num_heads = len(kept)
        out = _cols(s.out_proj, idx)
    if zero_out:
        out.weight.data.zero_()
    setattr(s.out_parent, s.out_name, out)


def _slice_mlp(s: LayerSites) -> None:
    """A removed MLP is sliced to zero width: its input projections keep no output rows, its last
    projection no input columns and a zero bias, so it costs no multiply-adds and adds exactly
    zero (the masked model's zeroed last projection, weight and bias). GPT-2's `Conv1D` cannot
    reshape a zero-width input, so there one unit is kept, with zero output weights and bias."""
    width = 1 if is_conv1d(s.mlp_out) else 0
    keep = torch.arange(width)
    for parent, name in s.mlp_parents:
        lin = getattr(parent, name)
        if is_conv1d(lin):
            setattr(parent, name, _conv1d(lin.weight.data[:, keep], lin.bias.data[keep]))
        else:
            setattr(parent, name, _rows(lin, keep))
    lin = s.mlp_out
    if is_conv1d(lin):
        new = _conv1d(torch.zeros_like(lin.weight.data[keep, :]), torch.zeros_like(lin.bias.data))
    else:
        new = _cols(lin, keep, zero_bias=True)
    setattr(s.mlp_out_parent, s.mlp_out_name, new)


@torch.no_grad()
def slice_heads(model: nn.Module, heads_kept, mlps_kept=None) -> nn.Module:
    """Physically remove, in place, the heads and MLPs the masks turn off (module docstring): the
    result computes what `apply_mask` computes, with smaller matrices. In memory only (its
    per-layer head counts are not a transformers config); returns the model."""
    heads, mlps = check_mask(model, heads_kept, mlps_kept)
    for i, s in enumerate(attention_sites(model)):
        kept = [h for h in range(s.num_heads) if heads[i, h]]
        if len(kept) < s.num_heads:
            _slice_attention(s, kept)
        if not mlps[i]:
            _slice_mlp(s)
    return model


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------ settings


@dataclass
class HeadPruningSettings:
    """The head-pruning part of a pruning config (`load_settings`; unknown keys and bad values are
    one `ConfigError` naming the source and the key, before any work).

    `orders`: which of "good", "random", "bad" to run; `fraction`: share of the heads removed per
    step; `step_of`: "total" (of all heads, Michel et al.'s and Prasanna et al.'s schedule) or
    "remaining" (of those still present, the earlier variant); `threshold`: stop below this share
    of the full model's metric; `subnetworks`: "equal_size" (the random and bad subnetworks have
    the good one's size, Prasanna et al.) or "threshold" (each order's own threshold mask);
    `units`: "heads" (Michel et al.), "mlps" or "both" (Prasanna et al.); `both_schedule`
    (units "both"): "continue" (Prasanna et al.'s code: heads-only half steps, then MLP-only
    steps, from the last good mask) or "joint" (the joint steps only, before issue 49);
    `importance_split`: "dev" (the reference scripts) or "train", the examples the importance is
    summed over; `importance_examples`: at most that many of them (the first);
    `importance_batch`: examples per absolute gradient, 1 (Michel et al.'s E_x|dL(x)/dxi|,
    computed exactly in batched passes), n, or "finetune" (the fine-tuning batch, before issue
    49); `run_to_end`:
    prune to zero heads for full curves; `refinetune`: re-fine-tune each subnetwork (Prasanna et al.);
    `remove`: explicit (layer, head) pairs to mask instead of the iterative procedure (checked
    against the model by `check_removed`)."""

    orders: list[str] = field(default_factory=lambda: list(ORDERS))
    fraction: float = 0.1
    step_of: str = "total"
    threshold: float = 0.9
    units: str = "heads"
    both_schedule: str = "continue"
    subnetworks: str = "equal_size"
    importance_split: str = "dev"
    importance_examples: int = 512
    importance_batch: str | int = 1  # a positive integer or "finetune" (`validate` normalises it)
    run_to_end: bool = False
    refinetune: bool = False
    remove: list[list[int]] | None = None

    def __post_init__(self):
        self.validate("settings")

    def validate(self, source: str) -> None:
        bad = [o for o in self.orders if o not in ORDERS]
        if bad or not self.orders:
            raise ConfigError(f"{source}: orders: unknown order(s) {bad or '(none given)'}; expected some of "
                              f"{', '.join(ORDERS)}")
        if not 0 < self.fraction <= 1:
            raise ConfigError(f"{source}: fraction: {self.fraction} is not in (0, 1]")
        if not 0 < self.threshold <= 1:
            raise ConfigError(f"{source}: threshold: {self.threshold} is not in (0, 1]")
        if self.step_of not in STEP_OF:
            raise ConfigError(f"{source}: step_of: {self.step_of!r} is not one of {', '.join(STEP_OF)}")
        if self.subnetworks not in SUBNETWORKS:
            raise ConfigError(f"{source}: subnetworks: {self.subnetworks!r} is not one of {', '.join(SUBNETWORKS)}")
        if self.units not in UNITS:
            raise ConfigError(f"{source}: units: {self.units!r} is not one of {', '.join(UNITS)}")
        if self.importance_examples < 1:
            raise ConfigError(f"{source}: importance_examples: {self.importance_examples} must be at least 1")
        if self.importance_split not in IMPORTANCE_SPLITS:
            raise ConfigError(f"{source}: importance_split: {self.importance_split!r} is not one of "
                              f"{', '.join(IMPORTANCE_SPLITS)}")
        if self.both_schedule not in BOTH_SCHEDULES:
            raise ConfigError(f"{source}: both_schedule: {self.both_schedule!r} is not one of {', '.join(BOTH_SCHEDULES)}")
        batch = str(self.importance_batch).strip()
        if batch != FINETUNE_BATCH and not (batch.isdigit() and int(batch) >= 1):
            raise ConfigError(f"{source}: importance_batch: {self.importance_batch!r} is not a positive integer "
                              f"or {FINETUNE_BATCH!r}")
        self.importance_batch = batch if batch == FINETUNE_BATCH else int(batch)
        for pair in self.remove or []:
            if len(pair) != 2 or any(int(v) < 0 for v in pair):
                raise ConfigError(f"{source}: remove: {pair!r} is not a (layer, head) pair of indices >= 0")

    def check_removed(self, model: nn.Module, source: str = "settings") -> np.ndarray | None:
        """The heads-kept matrix of `remove` for this model (None when not given); an index out
        of range is one `ConfigError` naming `source`."""
        return None if self.remove is None else mask_from_removed(model, self.remove, where=f"{source}: remove")


def load_settings(values: dict | None, source: str = "settings") -> HeadPruningSettings:
    """`HeadPruningSettings` from a mapping (a YAML section, `--set` values), coerced and checked."""
    from workbench.coerce import build_dataclass

    try:
        return build_dataclass(HeadPruningSettings, values, source)
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(source) else f"{source}: {msg.removeprefix('settings: ')}") from None


# ---------------------------------------------------------------------------- iterative pruning


@dataclass
class PruningStep:
    """One point of a pruning curve: heads removed so far, the metric, and the mask it was measured
    on; `mlps_kept` [layers] when the procedure prunes MLPs too (None: units "heads")."""

    step: int
    n_removed: int
    metric: float
    heads_kept: np.ndarray
    mlps_kept: np.ndarray | None = None
    phase: str = "joint"  # units "both" with both_schedule "continue": "joint", then "heads", then "mlps"

    @property
    def n_mlps_removed(self) -> int:
        return 0 if self.mlps_kept is None else int(self.mlps_kept.size - self.mlps_kept.sum())

    def fraction_removed(self, units: str) -> float:
        """The share of the pruned units removed: of the heads, of the MLPs, or of heads and MLPs
        counted together ("both"); the amount the sweep files a step under."""
        if units == "heads" or self.mlps_kept is None:
            return self.n_removed / self.heads_kept.size
        if units == "mlps":
            return self.n_mlps_removed / self.mlps_kept.size
        return (self.n_removed + self.n_mlps_removed) / (self.heads_kept.size + self.mlps_kept.size)


@dataclass
class PruningCurve:
    """An order's curve. `threshold_step` is the last step whose metric is at least
    `threshold * full` (0 = the full model) before the first step under it: the subnetwork the
    procedure returns. With phases (units "both", `both_schedule` "continue") each phase starts
    from the last good mask and ends at its own first step under the line, so the subnetwork is
    the last good step of the last phase that had one."""

    order: str
    full: float
    threshold: float
    steps: list[PruningStep] = field(default_factory=list)
    units: str = "heads"

    @property
    def threshold_step(self) -> int:
        floor = self.threshold * self.full
        last, closed = 0, set()
        for s in self.steps:
            if s.phase in closed:  # past the phase's first step under the line (run_to_end, min_steps)
                continue
            if s.metric < floor:
                closed.add(s.phase)
                continue
            last = s.step
        return last

    @property
    def prunable(self) -> int:
        """Heads removed at the threshold step: the number prunable at `threshold` x full metric."""
        return self.steps[self.threshold_step].n_removed

    @property
    def mlps_prunable(self) -> int:
        """MLPs removed at the threshold step (0 when the procedure prunes heads only)."""
        return self.steps[self.threshold_step].n_mlps_removed

    def record(self) -> dict:
        return {"order": self.order, "full": self.full, "threshold": self.threshold, "units": self.units,
                "threshold_step": self.threshold_step, "prunable": self.prunable,
                "mlps_prunable": self.mlps_prunable,
                "steps": [{"step": s.step, "n_removed": s.n_removed, "metric": s.metric, "phase": s.phase,
                           "heads_kept": s.heads_kept.astype(bool).tolist(),
                           **({} if s.mlps_kept is None else {"mlps_kept": s.mlps_kept.astype(bool).tolist()})}
                          for s in self.steps]}


def heads_to_remove(remaining: int, fraction: float, total: int | None = None) -> int:
    """How many heads (or MLPs) one step removes: `fraction` of `total` (all of them: Michel et
    al.'s `int(masking_amount x heads)`, 14 of BERT-base's 144) or, with `total` None, of the
    `remaining` ones (step_of "remaining"); at least one, at most those left. The 1e-9 keeps a
    product that float arithmetic puts just under a whole number (0.29 x 100) on that number."""
    base = remaining if total is None else total
    return min(remaining, max(1, int(base * fraction + 1e-9)))


def _remove_step(kept: np.ndarray, fraction: float, order: str, scores, random_rank: np.ndarray,
                 step_of: str = "total", n: int | None = None) -> np.ndarray:
    """`kept` with `n` (default `heads_to_remove`) of its remaining units off: by `scores` (good:
    lowest first, bad: highest first) or by the fixed permutation `random_rank` (random)."""
    flat = kept.reshape(-1).copy()
    alive = np.flatnonzero(flat)
    if n is None:
        n = heads_to_remove(len(alive), fraction, flat.size if step_of == "total" else None)
    n = min(n, len(alive))
    if order == "random":
        ranked = alive[np.argsort(random_rank[alive], kind="stable")]
    else:
        values = np.asarray(scores, dtype=np.float64).reshape(-1)[alive]
        ranked = alive[np.argsort(values if order == "good" else -values, kind="stable")]
    flat[ranked[:n]] = False
    return flat.reshape(kept.shape)


def iterative_pruning(shape: tuple[int, int], evaluate: Callable[..., float],
                      importance: Callable[..., object] | None, order: str = "good",
                      fraction: float = 0.1, threshold: float = 0.9, seed: int = 0,
                      run_to_end: bool = False, units: str = "heads", min_steps: int = 0,
                      step_of: str = "total", both_schedule: str = "continue") -> PruningCurve:
    """Michel et al.'s iterative head pruning, and Prasanna et al.'s over heads and MLPs (module
    docstring).

    units "heads": `evaluate(heads_kept)` -> the task metric of the model with that mask (higher
    is better); `importance(heads_kept)` -> head importance [layers, heads] recomputed on the masked
    model ("good"/"bad"; not called for "random").
    units "mlps" / "both": `evaluate(heads_kept, mlps_kept)` and `importance(heads_kept, mlps_kept)`
    -> (head importance [layers, heads], MLP importance [layers]).
    Each step removes `heads_to_remove` of each pruned kind: `fraction` of all its units
    (`step_of` "total", the papers' schedule) or of those still present ("remaining"); with units
    "both" of the heads and of the MLPs, each ranked by its own scores. Stops after the first step below
    `threshold * full`, or when nothing is left with `run_to_end` (curves for a plot; the step
    sizes do not depend on the order, so the three orders' steps line up). `min_steps`: prune
    through at least that many steps even below the threshold (Prasanna et al.'s comparison needs
    the random and bad subnetworks of the size the good order reached, not of the size where they
    fell under the line; fewer steps than `run_to_end` costs). `run_to_end` and `min_steps` apply
    to the joint steps. Units "both" with `both_schedule` "continue" (Prasanna et al.'s code):
    from the last good mask, heads alone, half a step's heads at a time (at least one), until the
    metric falls under the line; from the last good mask again, MLPs alone, one at a time, until
    it does (module docstring)."""
    if order not in ORDERS:
        raise ConfigError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
    if units not in UNITS:
        raise ConfigError(f"units {units!r}: expected one of {', '.join(UNITS)}")
    if not 0 < fraction <= 1:
        raise ConfigError(f"fraction {fraction}: expected a value in (0, 1]")
    if not 0 < threshold <= 1:
        raise ConfigError(f"threshold {threshold}: expected a value in (0, 1]")
    if step_of not in STEP_OF:
        raise ConfigError(f"step_of {step_of!r}: expected one of {', '.join(STEP_OF)}")
    if both_schedule not in BOTH_SCHEDULES:
        raise ConfigError(f"both_schedule {both_schedule!r}: expected one of {', '.join(BOTH_SCHEDULES)}")
    if order != "random" and importance is None:
        raise ConfigError(f"order {order!r} needs an importance function")
    prune_heads, prune_mlps = units in ("heads", "both"), units in ("mlps", "both")
    kept = np.ones(shape, dtype=bool)
    mlps = np.ones(shape[0], dtype=bool) if prune_mlps else None

    def measure(heads_kept, mlps_kept) -> float:
        return float(evaluate(heads_kept.copy()) if mlps_kept is None else evaluate(heads_kept.copy(), mlps_kept.copy()))

    full = measure(kept, mlps)
    curve = PruningCurve(order, full, threshold, [PruningStep(0, 0, full, kept.copy(),
                                                              None if mlps is None else mlps.copy())], units)
    rng = np.random.default_rng(seed)
    random_rank = rng.permutation(kept.size)  # random order: a fixed permutation of all heads
    mlp_rank = rng.permutation(shape[0])      # ... and of the MLPs
    def scores(kept, mlps):
        if order == "random":
            return None, None
        return (importance(kept.copy()), None) if mlps is None else importance(kept.copy(), mlps.copy())

    def record(kept, mlps, phase) -> float:
        metric = measure(kept, mlps)
        curve.steps.append(PruningStep(len(curve.steps), int(kept.size - kept.sum()), metric, kept.copy(),
                                       None if mlps is None else mlps.copy(), phase))
        return metric

    while (prune_heads and kept.any()) or (prune_mlps and mlps.any()):
        head_scores, mlp_scores = scores(kept, mlps)
        if prune_heads and kept.any():
            kept = _remove_step(kept, fraction, order, head_scores, random_rank, step_of)
        if prune_mlps and mlps.any():
            mlps = _remove_step(mlps, fraction, order, mlp_scores, mlp_rank, step_of)
        metric = record(kept, mlps, "joint")
        if metric < threshold * full and not run_to_end and len(curve.steps) - 1 >= min_steps:
            break
    if units == "both" and both_schedule == "continue":
        for phase in ("heads", "mlps"):  # each from the last mask above the line
            good = curve.steps[curve.threshold_step]
            kept, mlps = good.heads_kept.copy(), good.mlps_kept.copy()
            while (kept if phase == "heads" else mlps).any():
                head_scores, mlp_scores = scores(kept, mlps)
                if phase == "heads":  # Prasanna et al.: num_to_mask // 2 heads per step
                    n = max(1, heads_to_remove(int(kept.sum()), fraction, kept.size if step_of == "total" else None) // 2)
                    kept = _remove_step(kept, fraction, order, head_scores, random_rank, step_of, n=n)
                else:  # one MLP per step
                    mlps = _remove_step(mlps, fraction, order, mlp_scores, mlp_rank, step_of, n=1)
                if record(kept, mlps, phase) < threshold * full:
                    break
    return curve


def equal_size_subnetwork(good_kept, order: str, seed: int) -> np.ndarray:
    """Prasanna et al. (2020)'s subnetwork of `order` with the size of the good one, for one pool
    of units (a head mask [layers, heads] or an MLP mask [layers]; module docstring).

    "good": `good_kept` itself. "random": n units drawn uniformly without replacement, n = the
    units `good_kept` keeps (the authors' code keeps each head with probability n / total, the same
    size in expectation; exactly n here, so the comparison is at equal size). "bad": built from the
    units the good procedure pruned: n of them drawn at random when there are at least n, else all
    of them plus n - (pruned) drawn from the good subnetwork's own units (the authors' mask mode
    "bad"). Seeded by `seed` and the order, so a rerun draws the same mask."""
    if order not in ORDERS:
        raise ConfigError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
    good = np.asarray(good_kept, dtype=bool)
    if order == "good":
        return good.copy()
    flat = good.reshape(-1)
    n = int(flat.sum())
    rng = np.random.default_rng([int(seed), ORDERS.index(order), flat.size])
    out = np.zeros(flat.size, dtype=bool)
    if order == "random":
        out[rng.choice(flat.size, size=n, replace=False)] = True
    else:
        pruned, kept = np.flatnonzero(~flat), np.flatnonzero(flat)
        if len(pruned) >= n:
            out[rng.choice(pruned, size=n, replace=False)] = True
        else:
            out[pruned] = True
            out[rng.choice(kept, size=n - len(pruned), replace=False)] = True
    return out.reshape(good.shape)


def order_subnetwork(curves: dict[str, PruningCurve], order: str, seed: int, how: str = "equal_size") -> PruningStep:
    """The subnetwork an order stands for, as a `PruningStep` (metric NaN: the caller measures it).

    how "equal_size" (Prasanna et al.): sized by the good curve's threshold subnetwork
    (`equal_size_subnetwork` on its heads and, when pruned, its MLPs); `step` is the good curve's
    threshold step. how "threshold": the order's own curve at its threshold step (`curves[order]`)."""
    if how not in SUBNETWORKS:
        raise ConfigError(f"subnetworks {how!r}: expected one of {', '.join(SUBNETWORKS)}")
    if how == "threshold" or order == "good":
        c = curves[order]
        return c.steps[c.threshold_step]
    best = curves["good"].steps[curves["good"].threshold_step]
    heads = equal_size_subnetwork(best.heads_kept, order, seed)
    mlps = None if best.mlps_kept is None else equal_size_subnetwork(best.mlps_kept, order, seed + 1)
    return PruningStep(best.step, int(heads.size - heads.sum()), float("nan"), heads, mlps)


def masked_accuracy(model: nn.Module, enc, kept: np.ndarray, pad_id: int, batch_size: int,
                    mlps_kept: np.ndarray | None = None) -> float:
    """Accuracy of a `workbench.drivers.finetune` classifier on the encoded split `enc` with the heads of
    `kept` (and the MLPs of `mlps_kept`) gated (no copy of the model)."""
    from workbench.drivers.finetune import evaluate

    device = next(model.parameters()).device
    gate = torch.tensor(np.asarray(kept, bool), dtype=torch.float32, device=device)
    mlp_gate = None if mlps_kept is None else torch.tensor(np.asarray(mlps_kept, bool), dtype=torch.float32, device=device)
    with gates(model, gate, mlp_gate):
        return evaluate(model, enc, list(range(len(enc.ids))), pad_id, batch_size)[0]


def classifier_importance(model: nn.Module, run, settings: HeadPruningSettings,
                          batch_size: int) -> Callable[..., object]:
    """The importance function `iterative_pruning` calls, for a fine-tuned classifier of a
    `workbench.drivers.finetune.Prepared` run: `importance(heads_kept[, mlps_kept])` -> normalised
    head importance (and MLP importance). Its examples: the first `settings.importance_examples`
    of `settings.importance_split` (dev by default, as Michel et al.'s and Prasanna et al.'s
    scripts; the test split is never looked at). `settings.importance_batch` 1: the exact
    per-example gradients, computed `batch_size` examples per pass; n: |gradient| of the mean
    loss of n examples; "finetune": of `batch_size` (the fine-tuning batch; before issue 49)."""
    from workbench.drivers.finetune import collate

    enc = run.dev if settings.importance_split == "dev" else run.train
    rows = list(range(min(settings.importance_examples, len(enc.ids))))
    per_example = settings.importance_batch == 1
    size = batch_size if per_example or settings.importance_batch == FINETUNE_BATCH else int(settings.importance_batch)
    batches = [collate(enc, rows[i: i + size], run.pad_id) for i in range(0, len(rows), size)]

    def importance(kept: np.ndarray, mlps_kept: np.ndarray | None = None):
        imp = head_importance(model, batches, heads_kept=kept, mlps_kept=mlps_kept, per_example=per_example)
        return imp.heads if mlps_kept is None else (imp.heads, imp.mlps)

    return importance


def classifier_curve(model: nn.Module, run, order: str, settings: HeadPruningSettings, seed: int,
                     batch_size: int, min_steps: int = 0) -> PruningCurve:
    """`iterative_pruning` of a fine-tuned classifier of a `workbench.drivers.finetune.Prepared` run: dev
    accuracy after each step, importance from `classifier_importance` (the test split is not
    looked at). The one home of this wiring: the `bertology prune` sweep's heads_* methods and
    experiments/prune_heads.py both call it."""
    def dev_accuracy(kept: np.ndarray, mlps_kept: np.ndarray | None = None) -> float:
        return masked_accuracy(model, run.dev, kept, run.pad_id, batch_size, mlps_kept)

    return iterative_pruning(head_shape(model), dev_accuracy, classifier_importance(model, run, settings, batch_size),
                             order=order, fraction=settings.fraction, threshold=settings.threshold, seed=seed,
                             run_to_end=settings.run_to_end, units=settings.units, min_steps=min_steps,
                             step_of=settings.step_of, both_schedule=settings.both_schedule)


def leave_one_out(shape: tuple[int, int], evaluate_loss: Callable[[np.ndarray], float]) -> np.ndarray:
    """Ablation importance: loss with head h alone removed minus the full model's loss, for every
    head (Michel et al.'s section 3 experiment): L x H + 1 evaluations; the baseline the gradient
    estimate replaces."""
    full = np.ones(shape, dtype=bool)
    base = float(evaluate_loss(full))
    out = np.zeros(shape)
    for layer in range(shape[0]):
        for head in range(shape[1]):
            kept = full.copy()
            kept[layer, head] = False
            out[layer, head] = float(evaluate_loss(kept)) - base
    return out


# ------------------------------------------------------------------------------------------ rows

METHOD = "heads"
# The `extra` of `curve_rows` (and of experiments/prune_heads.py's re-fine-tuned rows) is declared
# with the sweep's in `workbench.drivers.prune_rows.EXTRA_SCHEMAS` (one home for the producer "prune").


def curve_rows(curve: PruningCurve, *, model: str, family: str | None, seed: int, task: str,
               test_at_threshold: float | None = None, subnetwork: PruningStep | None = None,
               subnetwork_kind: str = "threshold") -> list[dict]:
    """An order's curve as results-store rows (`workbench.store.results` schema), probe "prune":

    - metric "accuracy", split "dev", one row per pruning step (`extra`: method, order,
      pruning_step, n_removed, n_heads);
    - metric "heads_prunable": heads removed at the threshold step (`extra`: threshold, full);
    - metric "accuracy", split "test": the order's subnetwork's test accuracy, when given;
    - metric "head_kept", one row per (layer, head) of the order's subnetwork: value 1 kept, 0
      removed, `layer` = block index + 1 (the hidden-states convention: 0 is the embeddings),
      `extra.head`, `extra.subnetwork`. The subnetwork is the curve's threshold mask, or
      `subnetwork` when given (`subnetwork_kind` "equal_size": Prasanna et al.'s random or bad
      subnetwork of the good one's size, `order_subnetwork`);
    - when the curve pruned MLPs (units "mlps" / "both"): metric "mlps_prunable" and one "mlp_kept"
      row per layer of the subnetwork's MLP mask; `extra.units` on every row."""
    base = {"model": model, "family": family, "seed": seed, "probe": PROBE, "task": task}
    n_heads = int(curve.steps[0].heads_kept.size)
    tag = {"method": METHOD, "order": curve.order, "n_heads": n_heads}
    with_mlps = curve.steps[0].mlps_kept is not None
    if with_mlps:
        tag["units"] = curve.units
    rows = [{**base, "split": "dev", "metric": "accuracy", "value": s.metric,
             "extra": {**tag, "pruning_step": s.step, "n_removed": s.n_removed,
                       **({"n_mlps_removed": s.n_mlps_removed} if with_mlps else {})}} for s in curve.steps]
    best = curve.steps[curve.threshold_step] if subnetwork is None else subnetwork
    sub = {"subnetwork": subnetwork_kind if subnetwork is not None else "threshold"}
    rows.append({**base, "split": "dev", "metric": "heads_prunable", "value": float(curve.prunable),
                 "extra": {**tag, "threshold": curve.threshold, "full": curve.full}})
    if test_at_threshold is not None:
        rows.append({**base, "split": "test", "metric": "accuracy", "value": float(test_at_threshold),
                     "extra": {**tag, **sub, "pruning_step": best.step, "n_removed": best.n_removed,
                               "at": sub["subnetwork"]}})
    for layer, row in enumerate(best.heads_kept):
        for head, kept in enumerate(row):
            rows.append({**base, "split": "dev", "layer": layer + 1, "metric": "head_kept", "value": float(kept),
                         "extra": {**tag, **sub, "head": head, "n_removed": best.n_removed}})
    if with_mlps:
        rows.append({**base, "split": "dev", "metric": "mlps_prunable", "value": float(curve.mlps_prunable),
                     "extra": {**tag, "threshold": curve.threshold, "full": curve.full}})
        for layer, kept in enumerate(best.mlps_kept):
            rows.append({**base, "split": "dev", "layer": layer + 1, "metric": "mlp_kept", "value": float(kept),
                         "extra": {**tag, **sub, "n_mlps_removed": best.n_mlps_removed}})
    return rows
