"""Pretraining tickets: iterative magnitude pruning for the masked-LM loss, then task fine-tuning.

Chen et al. (2020), "The Lottery Ticket Hypothesis for Pre-trained BERT Networks", Sec. 5: besides
tickets found on each downstream task, they run IMP on the *pretraining* objective (masked-LM on
the pretraining corpus) and show that the resulting subnetwork transfers: fine-tuned on a task
with its mask kept, it matches the full model at sparsities where task-specific tickets do.

The procedure here (`mlm_tickets`), for a checkpoint pretrained by `bertology train` (its manifest
holds the pretraining config, so the same corpus, tokenizer and recipe are reused):

1. round 1: masked-LM training of the full pretrained weights theta_0 for `steps` steps, then
   global magnitude pruning (`magnitude_masks`) of `imp_step` (10%) of the prunable weights (the
   block matrices and, as in Chen et al.'s LT_pretrain.py, the pooler: `include_pooler`; a pooler
   the objective does not train, BERT's without NSP, is ranked by its pretrained values);
2. round r > 1: rewind to theta_0 * m_{r-1} (Chen et al. rewind to the pretrained weights), train
   `steps` MLM steps with the mask kept (`keep_masked` after every optimizer step), prune to
   r * imp_step of the *original* weights, nested in m_{r-1};
3. the ticket at sparsity s is theta_0 * m_s; the sweep (`workbench.drivers.prune_sweep`, method
   `imp_mlm`) fine-tunes it on the task with the mask kept, exactly like the task tickets.

Each round is one `workbench.drivers.train.train_from_config` run with the hooks `initial` (`MaskedStart`:
the built pretraining module gets theta_0 times the mask before its first forward and before the
optimizer is made) and those of every masked training (`masked_training`: the pruned weights'
gradients zeroed before clipping, the weights re-zeroed after each step). Runs are resumable like every
training run (a finished round is found, not retrained) and a folder made with another mask is
refused (the hooks' description, with the mask hash, is in run.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.compress.masks import Masks, apply_masks, mask_hash, mask_sparsity, masked_training, sparsity
from workbench.compress.unstructured import block_lists, dense_layers, imp_schedule, magnitude_masks, pooler
from workbench.errors import CheckpointError, ConfigError


@dataclass
class MlmTicketSettings:
    """The `mlm:` section of a prune config (method `imp_mlm`): the masked-LM training of each IMP
    round. `steps`: optimizer steps per round; `lr` / `warmup` / `batch_size`: default the
    checkpoint's own pretraining values (warm-up capped at a quarter of the steps); `seed`: the
    pretraining seed of the rounds (the ticket is found once and fine-tuned under every task seed);
    `sparsities`: the tickets fine-tuned on the task (default: the sweep's `sparsities`; each a
    multiple of `imp_step`, the rounds go up to the largest); `output_dir`: where the rounds' MLM runs go (default `<sweep folder>/mlm`); sweeps of one
    checkpoint run as one process per seed can share it (a finished round is found, not retrained)."""

    steps: int = 100
    lr: float | None = None
    warmup: int | None = None
    batch_size: int | None = None
    seed: int = 0
    sparsities: list[float] | None = None
    output_dir: str | None = None

    def __post_init__(self):
        if self.steps < 1:
            raise ConfigError(f"mlm: steps: must be >= 1, got {self.steps}")
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"mlm: lr: must be > 0, got {self.lr}")
        if self.warmup is not None and self.warmup < 0:
            raise ConfigError(f"mlm: warmup: must be >= 0, got {self.warmup}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"mlm: batch_size: must be >= 1, got {self.batch_size}")
        for i, x in enumerate(self.sparsities or []):
            if not 0 < x < 1:
                raise ConfigError(f"mlm: sparsities[{i}]: a sparsity is a fraction in (0, 1), got {x}")


def load_mlm_settings(values: dict | None, where: str) -> MlmTicketSettings:
    from workbench.coerce import build_dataclass

    try:
        return build_dataclass(MlmTicketSettings, values or {}, f"{where}: mlm")
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def pretraining_manifest(checkpoint: Path, where: str = "imp_mlm") -> dict:
    """The manifest of a checkpoint `bertology train` wrote (its `config` is the pretraining recipe);
    one clear error otherwise (a Hub model has no corpus the workbench can resume MLM training on)."""
    import json

    path = Path(checkpoint) / "manifest.json"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("config"), dict) or "family" not in manifest:
        raise ConfigError(f"{where}: {checkpoint} is not a checkpoint pretrained by `bertology train` (no manifest "
                          f"with its pretraining config): the pretraining ticket reruns that recipe's masked-LM "
                          f"training")
    return manifest


class MaskedStart:
    """The `initial` hook of an IMP round: the built pretraining module gets the pretrained weights
    `start` (its state dict), times `masks` when given, before its first forward."""

    def __init__(self, start: dict, masks: Masks | None, record: dict):
        self.start, self.masks, self.record = start, masks, record

    def __call__(self, module: torch.nn.Module) -> None:
        module.load_state_dict(self.start, strict=True)
        if self.masks is not None:
            apply_masks(module, self.masks)

    def describe(self) -> dict:
        return {"name": "masked_start", **self.record,
                "mask_sha256": None if self.masks is None else mask_hash(self.masks)}


def round_config(manifest: dict, settings: MlmTicketSettings, checkpoint: Path, out: Path, device: str,
                 progress: bool):
    """The checkpoint's pretraining config for one round: same corpus, family, model, objective,
    tokenizer (read from the checkpoint folder), `settings.steps` steps into `out`."""
    from workbench.config import load_train_config

    base = dict(manifest["config"])
    vocab_size = (base.pop("tokenizer", None) or {}).get("vocab_size")
    for k in ("output_dir", "tokens", "steps", "name", "seeds", "checkpoints", "device", "progress"):
        base.pop(k, None)
    steps = settings.steps
    warmup = settings.warmup if settings.warmup is not None else min(int(base.get("warmup") or 0), steps // 4)
    return load_train_config({**base, "name": out.name, "steps": steps, "seeds": [settings.seed], "warmup": warmup,
                        "lr": settings.lr or base["lr"], "batch_size": settings.batch_size or base["batch_size"],
                        "tokenizer": {"path": str(checkpoint), "vocab_size": vocab_size}, "output_dir": str(out),
                        "checkpoints": {"log_spaced": False, "every": steps}, "device": device,
                        "progress": progress})


def mlm_tickets(checkpoint: str | Path, max_sparsity: float, imp_step: float, settings: MlmTicketSettings,
                folder: Path, device: str = "cpu", progress: bool = False, log=print,
                include_pooler: bool = True) -> tuple[dict[float, Masks], torch.nn.Module, dict[float, list[Path]]]:
    """IMP on the masked-LM loss (module docstring): {sparsity: masks} for every round up to
    `max_sparsity` (names of the pretraining module's parameters), that module holding the
    pretrained weights, and {sparsity: the trained checkpoints of rounds 1..r}, the training that
    found that mask (its cost belongs to the ticket's: `workbench.cost.add_retraining`'s `search`).
    `include_pooler`: the pooler's dense layer is in the prunable set (Chen et al.). Round r's MLM
    run is `folder/round-r`; the masked weights of every round's trained checkpoint are checked to
    be exactly zero."""
    from workbench.families import get_family
    from workbench.running.model_loading import load_pretrainer
    from workbench.store.identity import tokenizer_hash
    from workbench.drivers.train import prepare_data, train_from_config

    checkpoint = Path(checkpoint).expanduser().resolve()
    manifest = pretraining_manifest(checkpoint)
    family_name = manifest["family"]
    pretrained = load_pretrainer(checkpoint, family_name)
    start = {k: v.detach().clone() for k, v in pretrained.state_dict().items()}
    names = list(dense_layers(pretrained, include_pooler=include_pooler))
    record = {"checkpoint": str(checkpoint)}
    schedule = imp_schedule(max_sparsity, imp_step)
    out: dict[float, Masks] = {}
    rounds: list[Path] = []
    found_by: dict[float, list[Path]] = {}
    current: Masks | None = None
    for r, amount in enumerate(schedule, start=1):
        cfg = round_config(manifest, settings, checkpoint, folder / f"round-{r}", device, progress)
        if r == 1:  # the tokenizer read back from the checkpoint must be the one it was trained with
            data = prepare_data(cfg, get_family(family_name))
            want = (manifest.get("tokenizer") or {}).get("sha256")
            if want and tokenizer_hash(data.tokenizer) != want:
                raise CheckpointError(f"{checkpoint}: its tokenizer files give another tokenizer (sha256) than its "
                                      f"manifest records")
        from workbench.loop import TrainingHooks

        initial = MaskedStart(start, current, {**record, "round": r})
        hooks = TrainingHooks(initial=initial) if current is None else masked_training(current, initial=initial)
        (final,) = train_from_config(cfg, hooks=hooks)
        trained = load_pretrainer(final, family_name)
        if current is not None and sparsity(trained, current) < mask_sparsity(current) - 1e-12:
            raise CheckpointError(f"{final}: masked weights are not zero after the masked-LM round (the mask was "
                                  f"not kept through training)")
        current = magnitude_masks(trained, names, amount, current)
        out[amount] = current
        rounds.append(Path(final))
        found_by[amount] = list(rounds)
        log(f"  imp_mlm round {r}: {cfg.steps} MLM steps -> sparsity {mask_sparsity(current):.3f}")
    return out, pretrained, found_by


def transfer_masks(masks: Masks, source: torch.nn.Module, target: torch.nn.Module) -> Masks:
    """Masks named for `source`'s parameters renamed for `target`'s, matched by their place in the
    repeated blocks (`block_lists`) or in the base model's pooler (`pooler`):
    `model.deberta.encoder.layer.3.attention.self.query_proj.weight` of a pretraining module is
    `<target's block list>.3.attention.self.query_proj.weight` of a classifier over the same body,
    `model.bert.pooler.dense.weight` is `bert.pooler.dense.weight`. Every name must land on a
    parameter of the same shape."""
    src_lists = [name for name, _ in block_lists(source)]
    dst_lists = [name for name, _ in block_lists(target)]
    if len(src_lists) != len(dst_lists):
        raise CheckpointError(f"masks: {type(source).__name__} has block lists {src_lists}, "
                              f"{type(target).__name__} {dst_lists}")
    src_pooler, dst_pooler = pooler(source), pooler(target)
    if src_pooler is not None and dst_pooler is not None:
        src_lists, dst_lists = [*src_lists, src_pooler[0]], [*dst_lists, dst_pooler[0]]
    params = dict(target.named_parameters())
    out: Masks = {}
    for name, m in masks.items():
        prefix = next((p for p in src_lists if name.startswith(p + ".")), None)
        if prefix is None:
            raise CheckpointError(f"masks: {name} is not inside a repeated block of {type(source).__name__}, nor "
                                  f"in a pooler that both it and {type(target).__name__} have")
        new = dst_lists[src_lists.index(prefix)] + name[len(prefix):]
        if new not in params or tuple(params[new].shape) != tuple(m.shape):
            raise CheckpointError(f"masks: {name} has no parameter {new} of shape {tuple(m.shape)} in "
                                  f"{type(target).__name__}")
        out[new] = m
    return out
