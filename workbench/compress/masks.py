"""Pruning masks: which weights of a model are kept, as {parameter name: bool tensor} (True = kept).

One representation for every pruning method of the workbench (unstructured tickets here, head and
MLP masks in `workbench.drivers.head_pruning`), so that a mask is saved, hashed, counted and re-applied
the same way whatever made it:

- `save_masks(folder, masks)` writes `masks.safetensors` beside a checkpoint (`MASKS_FILE`);
  `load_masks(folder)` reads it back (a missing or unreadable file is a CheckpointError naming it);
- `mask_hash(masks)` is a sha256 over names, shapes and the kept/pruned pattern: the identity a
  manifest records;
- `apply_masks(model, masks)` zeroes the pruned weights in place (under no_grad) and
  `keep_masked(masks)` is the `TrainingHooks.after_step` hook that does so after every optimizer
  step, so that pruned weights stay exactly zero through training (Frankle & Carbin 2019);
- `zero_pruned_gradients(masks)` is the `TrainingHooks.before_step` hook that zeroes the pruned
  weights' gradients before clipping, so that the clipping norm is that of the live weights;
  `masked_training(masks)` is the pair of hooks every masked training uses;
- `sparsity(model, names)` counts the zeros of the named weights in the model itself, so it checks
  what is stored, not what a mask says.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch

from workbench.errors import CheckpointError
from workbench.io import atomic_path

MASKS_FILE = "masks.safetensors"

Masks = dict[str, torch.Tensor]


def save_masks(folder: str | Path, masks: Mapping[str, torch.Tensor]) -> Path:
    """Write `masks` (bool tensors by parameter name) to `folder/masks.safetensors`, atomically."""
    from safetensors.torch import save_file

    path = Path(folder) / MASKS_FILE
    tensors = {name: m.detach().to("cpu", torch.bool).contiguous() for name, m in masks.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"what": "pruning masks, True = kept", "sha256": mask_hash(masks)})
    return path


def load_masks(folder: str | Path) -> Masks:
    """The masks saved in `folder` (or the file itself) by `save_masks`."""
    from safetensors.torch import load_file

    path = Path(folder)
    path = path / MASKS_FILE if path.is_dir() else path
    if not path.is_file():
        raise CheckpointError(f"{path}: no masks file")
    try:
        masks = load_file(str(path))
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"{path}: unreadable masks file ({type(e).__name__}: {e})") from e
    bad = [n for n, m in masks.items() if m.dtype != torch.bool]
    if bad:
        raise CheckpointError(f"{path}: masks must be bool tensors; {bad[0]} is {masks[bad[0]].dtype}")
    return masks


def mask_hash(masks: Mapping[str, torch.Tensor]) -> str:
    """sha256 over every mask's name, shape and kept/pruned bits, by name."""
    h = hashlib.sha256()
    for name in sorted(masks):
        m = masks[name].detach().to("cpu", torch.bool).contiguous()
        h.update(f"{name}|{tuple(m.shape)}|".encode())
        h.update(m.reshape(-1).numpy().tobytes())
    return h.hexdigest()


def _parameters(model: torch.nn.Module, names: Iterable[str]) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    missing = [n for n in names if n not in params]
    if missing:
        raise CheckpointError(f"{type(model).__name__}: the masks name parameters it does not have, e.g. {missing[:3]}")
    return {n: params[n] for n in names}


def apply_masks(model: torch.nn.Module, masks: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """Zero the pruned weights of `model` in place (the kept ones are untouched); returns `model`."""
    params = _parameters(model, masks)
    with torch.no_grad():
        for name, m in masks.items():
            p = params[name]
            if tuple(m.shape) != tuple(p.shape):
                raise CheckpointError(f"mask {name}: shape {tuple(m.shape)} differs from the weight's {tuple(p.shape)}")
            p.mul_(m.to(p.device, p.dtype))
    return model


def keep_masked(masks: Mapping[str, torch.Tensor]):
    """A `TrainingHooks.after_step` hook: re-apply `masks` after every optimizer step. AdamW's update
    (and weight decay) moves a zero weight whose gradient is not zero; zeroing it again after each
    step keeps the pruned weights exactly zero, the forward pass never sees them."""
    cache: dict[str, torch.Tensor] = {}

    def keep_masked_weights(model: torch.nn.Module, step: int) -> None:
        params = _parameters(model, masks)
        with torch.no_grad():
            for name, m in masks.items():
                p = params[name]
                key = f"{name}|{p.device}|{p.dtype}"
                if key not in cache:
                    cache[key] = m.to(p.device, p.dtype)
                p.mul_(cache[key])

    return keep_masked_weights


def zero_pruned_gradients(masks: Mapping[str, torch.Tensor]):
    """A `TrainingHooks.before_step` hook: zero the gradients of the pruned weights after the
    backward pass, before the gradient norm is clipped and the optimizer steps.

    A pruned weight is a constant zero, not a parameter of the subnetwork, yet the backward pass
    gives it a gradient (x times the upstream gradient, like any weight). Counted in
    `clip_grad_norm_`, those gradients make the norm larger than the live weights' and so scale
    the live weights' update down whenever clipping is active. Chen et al. (2020, "The Lottery
    Ticket Hypothesis for Pre-trained BERT Networks") prune with torch's reparametrisation
    (weight = weight_orig * mask), whose gradient to weight_orig is zero where pruned: their
    `clip_grad_norm_(model.parameters())` is the norm of the live weights' gradients. Zeroing the
    pruned gradients here gives the same norm and keeps AdamW's moments of pruned weights at zero."""
    cache: dict[str, torch.Tensor] = {}

    def zero_pruned_gradients(model: torch.nn.Module, step: int) -> None:
        params = _parameters(model, masks)
        with torch.no_grad():
            for name, m in masks.items():
                g = params[name].grad
                if g is None:  # frozen (e.g. a pooler the objective does not train) or unused this step
                    continue
                key = f"{name}|{g.device}"
                if key not in cache:
                    cache[key] = ~m.to(g.device, torch.bool)
                g.masked_fill_(cache[key], 0.0)  # not a product: 0 x inf would be nan

    return zero_pruned_gradients


def masked_training(masks: Mapping[str, torch.Tensor], **other):
    """The `TrainingHooks` of a training under fixed masks: the pruned gradients zeroed before
    clipping (`zero_pruned_gradients`) and the pruned weights zeroed again after every step
    (`keep_masked`); `other` are further hooks (e.g. `initial`)."""
    from workbench.loop import TrainingHooks

    return TrainingHooks(before_step=zero_pruned_gradients(masks), after_step=keep_masked(masks), **other)


def sparsity(model: torch.nn.Module, names: Iterable[str]) -> float:
    """The fraction of exact zeros among the named parameters of `model` (counted in the weights)."""
    params = _parameters(model, list(names))
    zeros = sum(int((p == 0).sum()) for p in params.values())
    total = sum(p.numel() for p in params.values())
    return zeros / total if total else 0.0


def mask_sparsity(masks: Mapping[str, torch.Tensor]) -> float:
    """The fraction of pruned entries the masks themselves describe."""
    total = sum(m.numel() for m in masks.values())
    return (total - sum(int(m.sum()) for m in masks.values())) / total if total else 0.0
