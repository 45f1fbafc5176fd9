"""`bertology prune CONFIG.yaml`: compression sweeps whose every point is a checkpoint.

One sweep = one task fine-tuning (`finetune:`, a `workbench.drivers.finetune.FinetuneConfig` mapping: the
pretrained checkpoint, the task, the seeds, the training recipe) and a grid of method x amount x
seed. For each seed the full model is fine-tuned first (`workbench.drivers.finetune.train_seed`, the same
data, split and loop as `bertology finetune`); it is the parent of every point of that seed and
its accuracy over seeds is the band a compressed model is held against.

Methods (`METHODS`; amounts in brackets):
| method | what | trained after? |
|---|---|---|
| imp | lottery ticket, iterative magnitude pruning (Chen et al. 2020), rounds of `imp_step` of the original weights up to the largest sparsity [sparsities] | yes: rewound, fresh optimizer |
| oneshot | global magnitude pruning of the fine-tuned weights to the sparsity at once [sparsities] | yes: rewound |
| random | a random mask at the sparsity [sparsities] | yes: rewound |
| reinit | IMP's mask at the sparsity on re-initialised weights [sparsities] | yes |
| imp_mlm | pretraining ticket (Chen et al. 2020, Sec. 5): IMP for the masked-LM loss on the checkpoint's own pretraining corpus (`mlm:` settings, `workbench.drivers.pretraining_ticket`), then the task fine-tuning of the pretrained weights times that mask [sparsities] | yes: pretrained weights, fresh optimizer |
| quantize | k-bit fake quantization of the fine-tuned weights, `quantize_scheme`: per_channel (one scale per output channel, the prunable set) or q8bert (one scale per tensor, every embedding and dense layer, Zafrir et al. 2019) [bits] | no |
| lowrank | rank-r SVD of every block matrix, and magnitude pruning of each matrix to the same number of parameters (`lowrank_magnitude`) [ranks] | no |
| heads_good / heads_random / heads_bad | Michel et al. (2019)'s iterative head pruning of the fine-tuned model (`workbench.drivers.head_pruning.iterative_pruning`): `heads.fraction` of all heads per step (`heads.step_of: total`; `remaining`: of those still present), least important / random / most important first (importance E_x abs(dL(x)/dxi) over dev examples, one gradient per example: `heads.importance_split`, `heads.importance_batch`), until dev accuracy falls below `heads.threshold` x the full model's; with `heads.units: mlps` or `both` the MLPs too (Prasanna et al. 2020; `both` goes on with heads-only and MLP-only steps, `heads.both_schedule`); every step is a point [fraction of the pruned units removed]. With `heads.subnetworks: equal_size` (the default; needs heads_good) heads_random / heads_bad also write Prasanna et al.'s random / bad subnetwork of the good one's size as a point of `heads_random_equal_size` / `heads_bad_equal_size` | no |
| heads_remove | the heads listed in `heads.remove` ((layer, head) pairs, checked against the checkpoint's config before any work) masked at once [fraction of heads removed] | no |
The prunable set (`include_pooler`, on by default): the block matrices and the base model's pooler,
as Chen et al.'s code prunes `bert.pooler.dense` (`workbench.compress.unstructured`); `false` keeps
the pooler dense (the sweeps before issue 40).
Rewinding (`rewind_step`): 0 = the pretrained body, the weights fine-tuning started from; N > 0 =
the weights after N fine-tuning steps of the full model (Frankle et al. 2020). The task head
(`task_head_keys`: what lies outside the base model) is not rewound by default (`rewind_head:
keep`): as Chen et al. (2020)'s `rewind()` restores only the `bert.*` weights, a ticket starts
under the trained head of the model its mask came from (IMP round r: round r-1's retrained model;
one-shot and random: the full model); `rewind_head: reset` takes the rewind point's head too (the
seed's initial head at step 0; the rule before issue 49). With N > 0, `rewind_schedule: continue`
(the default) retrains from step N to the end, as Frankle et al. do (open_lth's `train(start_step=N)`): the learning-rate schedule at step N
(past the warm-up when N is), the data order at step N, a fresh optimizer, T - N steps
(`continue_state`); `restart` trains all T steps from the schedule's step 0, warm-up included (the
sweeps before issue 40). `reinit` starts where the ticket does (open_lth's randomly_reinitialize);
`imp_mlm` starts from the pretrained weights, step 0. Retraining reruns `train_seed` from a
classifier folder holding the rewound weights times the mask, with
`workbench.compress.masks.masked_training`'s hooks (pruned gradients zeroed before clipping, pruned
weights re-zeroed after every step); the measured sparsity of the trained weights (zeros counted)
must equal the mask's, or the point fails.
A heads point is the fine-tuned model with the removed heads' columns of the attention output
projection zeroed (`workbench.drivers.head_pruning.apply_mask`: the same outputs as gating their context
vectors), saved like every point; its manifest params hold `heads_kept` (layer x head bools), the
order and the pruning step. The `heads:` mapping is `workbench.drivers.head_pruning.HeadPruningSettings`
less `orders` (the methods say which). With `heads: {refinetune: true}` (methods heads_good,
heads_random and heads_bad, `subnetworks: equal_size`) a last stage of units re-fine-tunes each
seed's good, random and bad subnetwork from the *pretrained* weights with the mask kept through
training (Prasanna et al. 2020; `refinetune_unit`: the masked pretrained model as a derived
checkpoint under `refinetuned/`, the sweep's fine-tuning recipe, its result in `point.json`), rows
`accuracy_refinetuned` per seed, order and split (what experiments/prune_heads.py --refinetune wrote).

Layout (resumable: a point whose `point.json` exists is read back, not recomputed):
```
prune/<name>/config.json                          the sweep config (a different one is refused)
prune/<name>/full/seed-S/best/                     the full fine-tuned model (parent of the seed's points)
prune/<name>/full/seed-S/rewind/                   the rewind weights when rewind_step > 0
prune/<name>/points/<method>/<amount>/seed-S/<method>-<amount>-seedS/  the point: a derived checkpoint
          (ModelHandle.save: manifest derived_from = parent, transform prune_<method>, params with
          sparsity / bits / rank, mask_sha256, seed) + masks.safetensors; plain transformers opens it
prune/<name>/points/<method>/<amount>/seed-S/point.json   its accuracies and counts
```
With `keep_checkpoints: false` a point keeps its manifest, masks and point.json and drops its
weights once the seed is done (sweeps on a GPU whose output must stay small).

Rows (probe "prune", task = the fine-tuning task, model = the method, `full` for the full model;
`workbench.drivers.prune_rows`): per seed and split `accuracy` (extra: method, amount, sparsity
measured, bits, rank, parameters, nonzero parameters, mask hash, checkpoint; heads points:
n_removed, n_heads, order, pruning_step); for each heads order and seed `heads_prunable` and one
`head_kept` row per (layer, head) of the subnetwork at the threshold
(`workbench.drivers.head_pruning.curve_rows`, model "heads": the Compression page's surviving-heads
matrix). Per seed only: the mean over seeds per method, amount and split, its 95% t-interval and
sd, and `wins` (the mean within one standard deviation over seeds of the full model's mean, Chen et
al. 2020's criterion) are computed when rows are read (`prune_rows.over_seeds`: the printed table,
the Compression page), no longer stored as seed-less rows (issue 41).

Concerns:
- the sweep's config: `PruneConfig`, `load_prune_config`, `head_settings`, `mlm_sparsities`,
  `checkpoint_head_shape`, `load_driver_config`
- lottery-ticket rewinding on the fine-tuning loop: `rewound`, `task_head_keys`, `with_trained_head`,
  `continue_state`, `ticket_masks`
- the grid and its points (names, the seed's shared state, counts): `point_name`, `amount_label`,
  `Seeded`, `Sweep`, `weight_counts`, `DerivedPoints`
- the driver (stages of units, one results-store run) and its printout: `PruneResult`,
  `unit_stages`, `run_unit`, `run_prune`, `report`; its last stage, the heads' re-fine-tuning:
  `refinetune_stage`, `refinetune_unit`, `refinetune_rows`
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.drivers import head_pruning as H
from workbench.compress.lowrank import equal_parameter_sparsity, lowrank_product
from workbench.compress.masks import (
    MASKS_FILE,
    apply_masks,
    mask_hash,
    mask_sparsity,
    masked_training,
    save_masks,
    sparsity,
)
from workbench.compress.quantize import SCHEMES, fake_quantize, quantized_layers
from workbench.compress.unstructured import (
    dense_layers,
    imp_schedule,
    layerwise_magnitude_masks,
    magnitude_masks,
    pooler,
    pooler_layers,
    random_masks,
)
# the rows and their summary over seeds: a module without torch (the app's Compression page reads them too)
from workbench.drivers.prune_rows import build_rows, format_table
from workbench.drivers.spec import IDENTITY, NOT_IDENTITY, DriverSpec, identity, split_section
from workbench.coerce import load_config
from workbench.errors import CheckpointError, ConfigError
from workbench.io import atomic_dir, atomic_path, atomic_write_json
from workbench.progress import get_logger

# rewind_step N > 0: retraining continues from step N (Frankle et al. 2020) or restarts at step 0
REWIND_SCHEDULES = ("continue", "restart")
# what a rewound ticket's task head starts from: the trained head of the model the mask was taken
# from (Chen et al. 2020's `rewind()` restores the encoder only), or the rewind point's ("reset")
REWIND_HEADS = ("keep", "reset")
POST_HOC = ("quantize", "lowrank")
# method -> the config key its amounts come from ("heads": the fractions of heads removed that the
# `heads:` settings reach).
HEAD_METHODS = {"heads_good": "good", "heads_random": "random", "heads_bad": "bad", "heads_remove": None}
# heads.subnetworks: equal_size: the points of Prasanna et al.'s random and bad subnetworks of the good
# one's size, written by heads_random / heads_bad (not methods a config lists, like lowrank_magnitude)
EQUAL_SIZE_POINTS = {"heads_random": "heads_random_equal_size", "heads_bad": "heads_bad_equal_size"}
METHODS: dict[str, str] = {
    "imp": "sparsities",
    "oneshot": "sparsities",
    "random": "sparsities",
    "reinit": "sparsities",
    "imp_mlm": "sparsities",
    "quantize": "bits",
    "lowrank": "ranks",
    **{m: "heads" for m in HEAD_METHODS},
}


@dataclass
class PruneConfig:
    """One compression sweep (module docstring). Unknown keys and bad values are ConfigErrors."""

    finetune: dict                        # a FinetuneConfig mapping: checkpoint, task, seeds, epochs, ...
    methods: list[str] = field(default_factory=lambda: ["imp", "oneshot", "random", "reinit"])
    sparsities: list[float] = field(default_factory=lambda: [0.3, 0.5, 0.7, 0.9])
    imp_step: float = 0.1                 # fraction of the ORIGINAL prunable weights removed per IMP round
    rewind_step: int = 0                  # 0: pretrained weights; N: fine-tuning step N (Frankle et al. 2020)
    bits: list[int] = field(default_factory=lambda: [8, 4, 3, 2, 1])
    ranks: list[int] = field(default_factory=list)
    heads: dict = field(default_factory=dict)  # HeadPruningSettings less orders and refinetune (module docstring)
    # imp_mlm: MlmTicketSettings (MLM steps per round, lr, seed); not in the identity when empty (sweeps
    # written before `mlm:` existed resume unchanged)
    mlm: dict = field(default_factory=dict, metadata={IDENTITY: lambda c: bool(c.mlm)})
    include_embeddings: bool = False      # prune the input embedding matrix too
    include_head: bool = False            # prune the task head's matrices too
    include_pooler: bool = True           # prune the base model's pooler too (Chen et al. 2020's set)
    rewind_schedule: str = "continue"     # rewind_step N > 0: retrain from step N (Frankle et al.) | restart at 0
    # keep: the trained task head (Chen et al.'s rewind()) | reset: the rewind point's (before issue 49;
    # not in the identity, so the sweeps written before it resume under it)
    rewind_head: str = field(default="keep", metadata={IDENTITY: lambda c: c.rewind_head != "reset"})
    quantize_scheme: str = "per_channel"  # per_channel | q8bert (per tensor, embeddings too: Zafrir et al. 2019)
    keep_checkpoints: bool = field(default=True, metadata=NOT_IDENTITY)  # False: drop each point's weights when its seed is done
    name: str | None = None               # default prune-<task>-<checkpoint folder or Hub name>
    output_dir: str | None = field(default=None, metadata=NOT_IDENTITY)  # default <runs root>/prune/<name>
    progress: bool = field(default=True, metadata=NOT_IDENTITY)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def key(self, ft) -> dict:
        """The sweep's identity (`workbench.drivers.spec.identity`; its folder's config.json): the identity
        fields, `finetune` standing for the fine-tuning's own identity (training hash, checkpoint, seeds)."""
        return identity(self, finetune={"training_hash": ft.training_hash(), "checkpoint": ft.checkpoint,
                                        "seeds": ft.seeds})


def load_prune_config(source: str | Path | dict, overrides: dict | None = None,
                      finetune_overrides: dict | None = None) -> tuple[PruneConfig, Any]:
    """(sweep config, its FinetuneConfig), validated before any work; every error names the file
    and the key. `overrides` replace sweep keys, `finetune_overrides` keys of `finetune:`, both by
    `workbench.coerce.load_config`'s rule (None values are ignored)."""
    from workbench.drivers.finetune import load_finetune_config

    cfg, where = load_config(PruneConfig, source, overrides, label="prune config")
    ft_cfg = load_finetune_config({"progress": cfg.progress, **cfg.finetune}, finetune_overrides)
    _validate(cfg, ft_cfg, where)
    head_settings(cfg, where)
    if "imp_mlm" in cfg.methods:
        from workbench.drivers.pretraining_ticket import load_mlm_settings, pretraining_manifest
        from workbench.store.checkpoints import single_checkpoint

        mlm = load_mlm_settings(cfg.mlm, where)
        for i, x in enumerate(mlm.sparsities or []):
            try:
                imp_schedule(x, cfg.imp_step)
            except ConfigError:
                raise ConfigError(f"{where}: mlm: sparsities[{i}]: {x} is not a multiple of imp_step "
                                  f"{cfg.imp_step} (IMP reaches only those)") from None
        pretraining_manifest(single_checkpoint(ft_cfg.checkpoint), where=f"{where}: methods: imp_mlm")
    elif cfg.mlm:
        raise ConfigError(f"{where}: mlm: settings for method imp_mlm, which methods does not list")
    if "heads_remove" in cfg.methods:
        H.kept_from_removed(checkpoint_head_shape(ft_cfg.checkpoint), head_settings(cfg, where).remove,
                            where=f"{where}: heads: remove")
    return cfg, ft_cfg


def head_settings(cfg: PruneConfig, where: str = "prune config") -> H.HeadPruningSettings:
    """The `heads:` mapping as `HeadPruningSettings` (one ConfigError naming the file and key)."""
    if "orders" in cfg.heads:
        raise ConfigError(f"{where}: heads: orders: not a sweep setting (list the methods heads_good / "
                          f"heads_random / heads_bad instead)")
    settings = H.load_settings(cfg.heads, f"{where}: heads")
    orders = [m for m in ("heads_good", "heads_random", "heads_bad") if m in cfg.methods]
    if settings.refinetune and (len(orders) < 3 or settings.subnetworks != "equal_size"):
        raise ConfigError(f"{where}: heads: refinetune re-fine-tunes the good, random and bad subnetworks of equal "
                          f"size: list heads_good, heads_random and heads_bad with subnetworks: equal_size")
    if "heads_remove" in cfg.methods and not settings.remove:
        raise ConfigError(f"{where}: heads: remove: method heads_remove needs (layer, head) pairs here")
    sized = [m for m in EQUAL_SIZE_POINTS if m in cfg.methods]
    if settings.subnetworks == "equal_size" and sized and "heads_good" not in cfg.methods:
        raise ConfigError(f"{where}: methods: {' and '.join(sized)} with heads: subnetworks: equal_size are sized by "
                          f"the good subnetwork: list heads_good too (or set heads: subnetworks: threshold)")
    return settings


def mlm_sparsities(cfg: PruneConfig) -> list[float]:
    """The sparsities of the imp_mlm points: `mlm.sparsities`, else the sweep's `sparsities`."""
    return list((cfg.mlm or {}).get("sparsities") or cfg.sparsities)


def checkpoint_head_shape(checkpoint: str) -> tuple[int, int]:
    """(layers, heads per layer) from a checkpoint's config.json, without loading its weights."""
    from workbench.running.model_loading import read_config
    from workbench.store.checkpoints import single_checkpoint

    config = read_config(single_checkpoint(checkpoint))
    return int(config.num_hidden_layers), int(config.num_attention_heads)


def _validate(cfg: PruneConfig, ft, where: str) -> None:
    def fail(key, msg):
        raise ConfigError(f"{where}: {key}: {msg}")

    if not cfg.methods:
        fail("methods", f"list at least one method (known: {', '.join(METHODS)})")
    for i, m in enumerate(cfg.methods):
        if m not in METHODS:
            fail(f"methods[{i}]", f"unknown method {m!r} (known: {', '.join(METHODS)})")
    if len(set(cfg.methods)) != len(cfg.methods):
        fail("methods", f"methods repeat: {cfg.methods}")
    if not 0 < cfg.imp_step < 1:
        fail("imp_step", f"must be in (0, 1), got {cfg.imp_step}")
    for i, s in enumerate(cfg.sparsities):
        if not (math.isfinite(s) and 0 < s < 1):
            fail(f"sparsities[{i}]", f"a sparsity is a fraction in (0, 1), got {s}")
    for i, b in enumerate(cfg.bits):
        if not 1 <= b <= 8:
            fail(f"bits[{i}]", f"bits must be an integer from 1 to 8, got {b}")
    for i, r in enumerate(cfg.ranks):
        if r < 1:
            fail(f"ranks[{i}]", f"a rank is an integer >= 1, got {r}")
    for m in cfg.methods:
        key = METHODS[m]
        if key != "heads" and not getattr(cfg, key):
            fail(key, f"method {m} needs at least one value in {key}")
    if any(m in cfg.methods for m in ("imp", "reinit", "imp_mlm")):
        for i, s in enumerate(cfg.sparsities):
            try:
                imp_schedule(s, cfg.imp_step)
            except ConfigError:
                fail(f"sparsities[{i}]", f"{s} is not a multiple of imp_step {cfg.imp_step} (IMP reaches only those)")
    if "reinit" in cfg.methods and "imp" not in cfg.methods:
        fail("methods", "reinit uses IMP's masks: list imp too")
    if cfg.rewind_step < 0:
        fail("rewind_step", f"must be >= 0, got {cfg.rewind_step}")
    if cfg.rewind_schedule not in REWIND_SCHEDULES:
        fail("rewind_schedule", f"must be one of {', '.join(REWIND_SCHEDULES)}, got {cfg.rewind_schedule!r}")
    if cfg.rewind_head not in REWIND_HEADS:
        fail("rewind_head", f"must be one of {', '.join(REWIND_HEADS)}, got {cfg.rewind_head!r}")
    if cfg.quantize_scheme not in SCHEMES:
        fail("quantize_scheme", f"must be one of {', '.join(SCHEMES)}, got {cfg.quantize_scheme!r}")
    if cfg.name is not None and not all(c.isalnum() or c in "._+-" for c in cfg.name):
        fail("name", f"use letters, digits and . _ + - only, got {cfg.name!r}")


# ------------------------------------------------------------------------------------------ points

def rewound(template: torch.nn.Module, start: dict, masks: dict) -> torch.nn.Module:
    """A copy of `template` holding the `start` weights (the rewind point) times `masks`: every kept
    weight is the start weight bit for bit, every pruned one exactly zero."""
    model = copy.deepcopy(template)
    model.load_state_dict(start)
    return apply_masks(model, masks)


def task_head_keys(model: torch.nn.Module) -> list[str]:
    """The state-dict keys outside the base model (`model.base_model`): the task head (classifier,
    and a workbench head's own layers), the part Chen et al.'s `rewind()` leaves as trained."""
    base = model.base_model
    if base is model:
        return []
    inside = {id(t) for t in base.state_dict(keep_vars=True).values()}
    return [k for k, t in model.state_dict(keep_vars=True).items() if id(t) not in inside]


def with_trained_head(start: dict, trained: torch.nn.Module) -> dict:
    """The rewind point `start` with the task head of `trained` (`task_head_keys`): Chen et al.
    (2020)'s `rewind()` in LT_glue.py restores only the pretrained `bert.*` weights, so each round
    retrains from the pretrained body under the head the previous training left."""
    state = trained.state_dict()
    return {**start, **{k: state[k].detach().clone() for k in task_head_keys(trained)}}


def continue_state(ft, run, seed: int, hooks, step: int) -> Path:
    """Make `train_seed(ft, seed, run, hooks=hooks)` train from step `step` of its schedule to the
    end, as Frankle et al. (2020, "Linear Mode Connectivity and the Lottery Ticket Hypothesis")
    retrain a ticket rewound to step k: open_lth's `train(start_step=k)` makes a fresh optimizer,
    steps the learning-rate schedule k times and skips the data loader to step k, then trains to
    the last step. Here that is the resume state `train_seed` reads when a run was interrupted
    (`workbench.drivers.finetune.save_resume_state`, written where it looks: `<run folder>/seed-S/resume`): the
    weights of `run.checkpoint` (the rewound start), a fresh AdamW over the same parameters, the
    schedule of the full run (warm-up and linear decay over its T steps) advanced to `step`, the
    loop at epoch step // per_epoch, batch step % per_epoch (`train_seed`'s data order is a
    function of seed and epoch, so these are the batches the full run took after step k) and
    nothing of the full run's bookkeeping (curve, best epoch, tokens, time). Dropout draws from
    the seed. Returns the state folder."""
    import warnings

    from workbench.store.checkpoints import seed_dir
    from workbench.drivers.finetune import STATE_DIR, save_resume_state, trainable_filter
    from workbench.running.classifier_loading import build_classifier
    from workbench.loop import adamw, apply_param_filter, linear_warmup_decay

    per_epoch = math.ceil(len(run.train.ids) / ft.batch_size)
    total = per_epoch * ft.epochs
    if not 0 < step < total:
        raise ConfigError(f"rewind_step {step}: retraining continues from it, and the fine-tuning makes {total} steps")
    torch.manual_seed(seed)
    model = build_classifier(run.checkpoint, run.family, run.data.kind, run.pooling, run.data.label_names, run.pad_id)
    apply_param_filter(model, trainable_filter(ft, model, hooks))
    optimizer = adamw(model.named_parameters(), ft.lr, ft.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(round(ft.warmup * total), total))
    with warnings.catch_warnings():  # the schedule stepped without optimizer steps, as open_lth does
        warnings.simplefilter("ignore")
        for _ in range(step):
            scheduler.step()
    loop = {"epoch": step // per_epoch, "batch": step % per_epoch, "step": step, "loss_sum": 0.0, "loss_n": 0,
            "curve": [], "best": -1.0, "best_epoch": -1, "best_step": 0, "bad_epochs": 0, "stopped": False}
    if hooks.loss is not None:
        loop["term_sums"] = {}
    folder = seed_dir(run.folder, seed) / STATE_DIR
    folder.parent.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)  # the random numbers the retraining's dropout starts from
    save_resume_state(folder, model, optimizer, scheduler, loop)
    return folder


def ticket_masks(masks: dict, pretrainer: torch.nn.Module, classifier: torch.nn.Module, names: list[str]) -> dict:
    """The masked-LM ticket's masks (named for the pretraining module) for the classifier's
    prunable set `names` (`transfer_masks`). A pooler the pretraining module does not have
    (SpanBERT's BertForMaskedLM) is not pretrained: the classifier's is a fresh layer of the head,
    kept dense (a mask of ones)."""
    from workbench.drivers.pretraining_ticket import transfer_masks

    out = transfer_masks(masks, pretrainer, classifier)
    if pooler(pretrainer) is None:
        params = dict(classifier.named_parameters())
        out.update({n: torch.ones_like(params[n], dtype=torch.bool, device="cpu")
                    for n in pooler_layers(classifier) if n in names})
    if set(out) != set(names):
        raise CheckpointError(f"imp_mlm: the masked-LM masks cover {len(out)} matrices, the classifier's "
                              f"prunable set {len(names)}")
    return out


def _started(folder: Path, seed: int) -> bool:
    """Whether `train_seed` has a state or a result for this seed in `folder` already."""
    from workbench.store.checkpoints import seed_dir
    from workbench.drivers.finetune import STATE_DIR

    out = seed_dir(folder, seed)
    return (out / STATE_DIR).is_dir() or (out / "result.json").is_file()


def point_name(method: str, amount, seed: int) -> str:
    """A point's checkpoint folder name, unique in a sweep: what the probes' rows call the model
    (`workbench.store.checkpoints.checkpoint_name` is the folder name), e.g. imp-0.7-seed0."""
    return f"{method}-{amount_label(method, amount)}-seed{seed}"


def amount_label(method: str, amount: float | int) -> str:
    """The folder name of an amount: sparsities as 0.7, bits as 4bit, ranks as r16."""
    if AMOUNT_OF[method] == "bits":
        return f"{int(amount)}bit"
    if AMOUNT_OF[method] == "ranks":
        return f"r{int(amount)}"
    if AMOUNT_OF[method] == "heads":
        return f"{float(amount):.6g}"
    return f"{float(amount):.4g}"


@dataclass
class Seeded:
    """What every point of one seed shares: the full model and its handle, the rewind weights."""

    seed: int
    full_dir: Path
    full: Any                     # the fine-tuned full classifier (CPU)
    handle: Any                   # ModelHandle over `full`: the parent of every derived point
    start: dict                   # state dict the retrained points rewind to
    names: list[str]              # the prunable weights
    full_result: dict


class Sweep:
    """Runs the grid of one config (see the module docstring)."""

    def __init__(self, cfg: PruneConfig, ft, run, folder: Path):
        self.cfg, self.ft, self.run, self.folder = cfg, ft, run, folder
        self.points: list[dict] = []
        self.head_rows: list[dict] = []  # surviving-heads rows of the heads orders (module docstring)
        self.subnetworks: dict[tuple[int, str], Any] = {}  # (seed, order) -> its subnetwork (a PruningStep)
        self.mlm = None  # imp_mlm: ({sparsity: masks of the pretraining module}, that module, settings)
        self.derived = DerivedPoints(self)  # the points that need no retraining

    # -- helpers -----------------------------------------------------------------------------------

    def log(self, text: str) -> None:
        if self.cfg.progress:
            get_logger(__name__).info(text)

    def point_dir(self, method: str, amount, seed: int) -> Path:
        return self.folder / "points" / method / amount_label(method, amount) / f"seed-{seed}"

    def evaluate(self, model) -> dict:
        from workbench.drivers.finetune import evaluate

        model = model.to(self.run.device)
        out = {}
        for split in ("dev", "test"):
            enc = getattr(self.run, split)
            acc, n, _ = evaluate(model, enc, list(range(len(enc.ids))), self.run.pad_id, self.ft.batch_size)
            out[split] = {"accuracy": acc, "n": n}
        model.to("cpu")
        return out

    def save_point(self, s: Seeded, method: str, amount, model, masks: dict | None, params: dict,
                   result: dict, seconds: float, retrained: tuple | None = None) -> dict:
        """Write the point: the derived checkpoint (+ masks) and point.json, atomically each.
        `retrained` = (the retraining's own cost, the checkpoint the mask was found in or None, the
        training runs of the mask search after it): the point's cost adds them
        (`workbench.cost.add_retraining`)."""
        target = self.point_dir(method, amount, s.seed)
        full_params = {"method": method, "seed": s.seed, **params}
        if masks is not None:
            full_params["mask_sha256"] = mask_hash(masks)
        # model None: the parent itself (the full model's point), a copy of it
        derived = s.handle.derive(f"prune_{method}", full_params, apply=lambda _copy, **_params: model)
        model = derived.model
        model_dir = target / point_name(method, amount, s.seed)
        if model_dir.exists():
            shutil.rmtree(model_dir)
        derived.save(model_dir)
        if retrained is not None:
            from workbench.cost import add_retraining

            add_retraining(model_dir, *retrained)
        if masks is not None:
            save_masks(model_dir, masks)
        record = {**full_params, "amount": amount, **result,
                  **weight_counts(model, s.names), "checkpoint": str(model_dir), "seconds": round(seconds, 2),
                  "content_sha256": derived.checkpoint_hash}
        atomic_write_json(target / "point.json", record)
        self.log(f"  {method} {amount_label(method, amount)} seed {s.seed}: dev {result['dev']['accuracy']:.4f} "
                 f"test {result['test']['accuracy']:.4f} (sparsity {record['sparsity_measured']:.3f})")
        return record

    def done(self, method: str, amount, seed: int) -> dict | None:
        path = self.point_dir(method, amount, seed) / "point.json"
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None

    def trained_weights(self, record: dict):
        from workbench.running.classifier_loading import load_classifier

        folder = Path(record["checkpoint"])
        if not (folder / "config.json").is_file():
            raise CheckpointError(f"{folder}: the point's weights were dropped (keep_checkpoints: false) but a "
                                  f"later IMP round needs them; delete {folder.parent} to recompute it")
        return load_classifier(folder)

    # -- the full model --------------------------------------------------------------------------

    def full_model(self, seed: int) -> Seeded:
        from workbench.drivers.finetune import train_seed
        from workbench.loop import TrainingHooks, write_model_folder
        from workbench.running.classifier_loading import load_classifier
        from workbench.running.models import ModelHandle

        full_run = dataclasses.replace(self.run, folder=self.folder / "full")
        seed_out = self.folder / "full" / f"seed-{seed}"
        rewind_dir = seed_out / "rewind"
        hooks = None
        if self.cfg.rewind_step > 0:
            def snapshot_rewind_weights(model, step):
                if step == self.cfg.rewind_step and not rewind_dir.is_dir():
                    with atomic_dir(rewind_dir) as tmp:
                        write_model_folder(tmp, model, self.run.tokenizer, {"rewind_step": step, "seed": seed})
            hooks = TrainingHooks(after_step=snapshot_rewind_weights)
        res = train_seed(self.ft, seed, full_run, hooks=hooks)
        best = Path(res.checkpoint)
        handle = ModelHandle.load_classifier(best, tokenizer=self.run.tokenizer)
        full = handle.model
        if self.cfg.rewind_step > 0:
            if not rewind_dir.is_dir():
                raise ConfigError(f"rewind_step {self.cfg.rewind_step}: the full model's training of seed {seed} "
                                  f"made fewer steps (see {seed_out / 'result.json'})")
            start = load_classifier(rewind_dir).state_dict()
        else:
            start = self.pretrained_start(seed)
        names = list(dense_layers(full, self.cfg.include_embeddings, self.cfg.include_head, self.cfg.include_pooler))
        result = {"dev": res.dev, "test": res.test}
        return Seeded(seed, seed_out, full, handle, {k: v.clone() for k, v in start.items()}, names, result)

    def pretrained_start(self, seed: int) -> dict:
        """The weights train_seed started from: the pretrained body under the seed's fresh head."""
        from workbench.running.classifier_loading import build_classifier

        torch.manual_seed(seed)
        return build_classifier(self.run.checkpoint, self.run.family, self.run.data.kind, self.run.pooling,
                                self.run.data.label_names, self.run.pad_id).state_dict()

    # -- retrained points -------------------------------------------------------------------------

    def from_step(self) -> int:
        """The schedule step the rewound points retrain from: `rewind_step` with
        `rewind_schedule: continue` (Frankle et al. 2020), else 0."""
        return self.cfg.rewind_step if self.cfg.rewind_schedule == "continue" else 0

    def rewind_params(self) -> dict:
        """What a rewound point's manifest records about where it started."""
        head = {"rewind_head": self.cfg.rewind_head}
        if self.cfg.rewind_step == 0:
            return {"rewind_step": 0, **head}
        return {"rewind_step": self.cfg.rewind_step, "from_step": self.from_step(), **head}

    def rewind_start(self, s: Seeded, trained: torch.nn.Module) -> dict:
        """The weights a ticket whose mask came from `trained` is rewound to: the rewind point
        `s.start`, under `trained`'s task head with `rewind_head: keep` (Chen et al. 2020's
        `rewind()`: the encoder only; IMP's round r keeps round r-1's head, one-shot and random
        the full model's), or entirely the rewind point's with `reset` (before issue 49)."""
        return with_trained_head(s.start, trained) if self.cfg.rewind_head == "keep" else s.start

    def retrain(self, s: Seeded, method: str, amount: float, masks: dict, start: dict, params: dict,
                prior: str | None = None, search: tuple = (), from_step: int = 0) -> dict:
        """Train the masked `start` weights with the full model's recipe, masks kept by the hooks
        (`masked_training`), from step `from_step` of the schedule to its end (`continue_state`).
        `prior`: the point whose trained weights gave the mask (IMP's previous round), for the cost;
        `search`: training runs after `prior` that found the mask (imp_mlm's masked-LM rounds)."""
        from workbench.store.checkpoints import read_manifest
        from workbench.drivers.finetune import train_seed
        from workbench.loop import write_model_folder
        from workbench.running.classifier_loading import load_classifier

        found = self.done(method, amount, s.seed)
        if found is not None:
            return found
        t0 = time.time()
        target = self.point_dir(method, amount, s.seed)
        model = rewound(s.full, start, masks)
        with atomic_dir(target / "start") as tmp:
            write_model_folder(tmp, model, self.run.tokenizer, {"kind": "prune_start", "method": method})
        sub = dataclasses.replace(self.run, checkpoint=target / "start", folder=target / "train")
        hooks = masked_training(masks)
        if from_step > 0 and not _started(sub.folder, s.seed):  # an interrupted retraining resumes its own state
            continue_state(self.ft, sub, s.seed, hooks, from_step)
        res = train_seed(self.ft, s.seed, sub, hooks=hooks)
        trained = load_classifier(res.checkpoint)
        measured, wanted = sparsity(trained, masks), mask_sparsity(masks)
        if measured < wanted - 1e-12:
            raise CheckpointError(f"{res.checkpoint}: {measured:.6f} of the masked weights are zero, the mask "
                                  f"prunes {wanted:.6f} (the masks were not kept through training)")
        own = ((read_manifest(res.checkpoint) or {}).get("cost") or {}).get("own")
        record = self.save_point(s, method, amount, trained, masks, params,
                                 {"dev": res.dev, "test": res.test}, time.time() - t0, retrained=(own, prior, search))
        shutil.rmtree(target / "start", ignore_errors=True)
        shutil.rmtree(target / "train", ignore_errors=True)
        return record

    def imp(self, s: Seeded) -> dict[float, dict]:
        """Iterative magnitude pruning: each round prunes from the previous round's trained weights,
        rewinds and retrains; returns {sparsity: masks} for reinit."""
        schedule = imp_schedule(max(self.cfg.sparsities), self.cfg.imp_step)
        trained, current, out, record = s.full, None, {}, None
        for r, amount in enumerate(schedule, start=1):
            masks = magnitude_masks(trained, s.names, amount, current)
            record = self.retrain(s, "imp", amount, masks, self.rewind_start(s, trained),
                                  {"sparsity": amount, "round": r, **self.rewind_params()},
                                  prior=record["checkpoint"] if record else None, from_step=self.from_step())
            if record.get("mask_sha256") != mask_hash(masks):
                raise CheckpointError(f"{record['checkpoint']}: a resumed IMP round has another mask than this "
                                      f"run computes; delete the sweep folder's points/imp to recompute")
            out[amount] = masks
            if r < len(schedule):
                trained = self.trained_weights(record)
            current = masks
        return out

    def retrained_point(self, s: Seeded, method: str, amount: float, imp_masks: dict) -> dict:
        """One retrained point (oneshot, random or reinit at a sparsity; imp_mlm: `pretraining_ticket`),
        computed or read back: what `run_seed` and an executor unit (`run_unit`) both call. reinit
        takes IMP's masks (`imp_masks`, {sparsity: masks})."""
        from workbench.running.model_loading import DERIVATIONS

        rewind, k, seed = self.rewind_params(), self.from_step(), s.seed
        if method == "oneshot":
            masks = magnitude_masks(s.full, s.names, amount)
            return self.retrain(s, "oneshot", amount, masks, self.rewind_start(s, s.full), {"sparsity": amount, **rewind},
                                from_step=k)
        if method == "random":
            masks = random_masks(s.full, s.names, amount, seed=seed * 1000 + round(amount * 1000))
            return self.retrain(s, "random", amount, masks, self.rewind_start(s, s.full), {"sparsity": amount, **rewind},
                                from_step=k)
        if method == "reinit":  # from the ticket's step too (open_lth's randomly_reinitialize)
            fresh = DERIVATIONS["random_init"].apply(s.full, seed=seed).state_dict()
            return self.retrain(s, "reinit", amount, imp_masks[amount], fresh,
                                {"sparsity": amount, "init_seed": seed, **({"from_step": k} if k else {})},
                                prior=self.done("imp", amount, seed)["checkpoint"], from_step=k)
        if method == "imp_mlm":
            return self.pretraining_ticket(s, amount)
        raise ValueError(f"{method}: not a retrained point")

    def run_seed(self, seed: int) -> None:
        s = self.full_model(seed)
        self.log(f"seed {seed}: full model dev {s.full_result['dev']['accuracy']:.4f} "
                 f"test {s.full_result['test']['accuracy']:.4f}; {len(s.names)} prunable matrices")
        # the full model as a point too: a folder named for the seed (probes name models by folder)
        self.points.append(self.done("full", 0.0, seed) or self.save_point(
            s, "full", 0.0, None, None, {"sparsity": 0.0}, s.full_result, 0.0))
        methods = self.cfg.methods
        imp_masks = self.imp(s) if "imp" in methods else {}
        for amount in imp_masks:
            self.points.append(self.done("imp", amount, seed))
        for amount in self.cfg.sparsities:
            for method in ("oneshot", "random", "reinit"):
                if method in methods:
                    self.points.append(self.retrained_point(s, method, amount, imp_masks))
        if "imp_mlm" in methods:
            for amount in mlm_sparsities(self.cfg):
                self.points.append(self.retrained_point(s, "imp_mlm", amount, imp_masks))
        if "quantize" in methods:
            flags = (self.cfg.include_embeddings, self.cfg.include_head, self.cfg.include_pooler)
            scheme = self.cfg.quantize_scheme
            quantized = sum(m.weight.numel() for m in quantized_layers(s.full, scheme, *flags).values())
            for bits in self.cfg.bits:
                self.points.append(self.derived.post_hoc(s, "quantize", bits, lambda m, b=bits: fake_quantize(
                    m, b, *flags, scheme=scheme), {"bits": bits, "scheme": scheme, "quantized_parameters": quantized}))
        for method in (m for m in methods if m in HEAD_METHODS):
            self.points.extend(self.derived.heads(s, method))
        if "lowrank" in methods:
            for rank in self.cfg.ranks:
                self.points.append(self.derived.post_hoc(s, "lowrank", rank, lambda m, r=rank: lowrank_product(m, r),
                                                         {"rank": rank}))
                self.points.append(self.derived.lowrank_magnitude(s, rank))
        if not self.cfg.keep_checkpoints:
            self.drop_weights(seed)

    def pretraining_ticket(self, s: Seeded, amount: float) -> dict:
        """Chen et al.'s pretraining ticket at `amount`: the MLM-IMP mask (found once per sweep,
        `self.mlm`) on the pretrained weights under the seed's fresh head, fine-tuned with it kept."""
        found = self.done("imp_mlm", amount, s.seed)
        if found is not None:
            return found
        masks_by_amount, pretrainer, settings, found_by = self.mlm_tickets()
        masks = ticket_masks(masks_by_amount[amount], pretrainer, s.full, s.names)
        start = s.start if self.cfg.rewind_step == 0 else self.pretrained_start(s.seed)
        return self.retrain(s, "imp_mlm", amount, masks, start,
                            {"sparsity": amount, "round": round(amount / self.cfg.imp_step),
                             "mlm_steps": settings.steps, "mlm_seed": settings.seed, "rewind_step": 0},
                            prior=str(self.run.checkpoint), search=tuple(found_by[amount]))

    def mlm_tickets(self):
        """The masked-LM IMP rounds (`workbench.drivers.pretraining_ticket.mlm_tickets`), run once
        per sweep, when the first imp_mlm point needs them (after the first seed's other methods;
        a finished round is found, so sweeps sharing `mlm.output_dir` train each round once)."""
        if self.mlm is None:
            from workbench.drivers.pretraining_ticket import load_mlm_settings, mlm_tickets

            settings = load_mlm_settings(self.cfg.mlm, "prune config")
            folder = Path(settings.output_dir) if settings.output_dir else self.folder / "mlm"
            masks, pretrainer, found_by = mlm_tickets(self.run.checkpoint, max(mlm_sparsities(self.cfg)), self.cfg.imp_step, settings,
                                            folder, device=self.ft.device, progress=self.cfg.progress, log=self.log,
                                            include_pooler=self.cfg.include_pooler)
            self.mlm = (masks, pretrainer, settings, found_by)
        return self.mlm

    def drop_weights(self, seed: int) -> None:
        for point in (self.folder / "points").glob(f"*/*/seed-{seed}/*-seed{seed}"):
            for f in point.iterdir():
                if f.name not in ("manifest.json", MASKS_FILE):
                    f.unlink()


def weight_counts(model, names: list[str]) -> dict:
    """The parameter counts a point records: all parameters, the prunable ones (`names`) and how
    many of each are nonzero, and the measured sparsity of the prunable set (what the mask actually
    left, which the tables and figures plot rather than the requested amount)."""
    params = dict(model.named_parameters())
    prunable = sum(params[n].numel() for n in names)
    zeros = sum(int((params[n] == 0).sum()) for n in names)
    total = sum(p.numel() for p in model.parameters())
    return {"parameters": total, "prunable": prunable, "nonzero_prunable": prunable - zeros,
            "nonzero_parameters": total - zeros, "sparsity_measured": zeros / prunable if prunable else 0.0}


class DerivedPoints:
    """The points of a `Sweep` that need no retraining: post-hoc transforms of a seed's full model
    (quantize, lowrank, lowrank_magnitude) and the heads orders' masks. Apart from `Sweep` (which
    keeps the full models and the retrained points) because these only transform, evaluate and save
    through the sweep; the one state they own is the heads curves, computed once per (seed, order)."""

    def __init__(self, sweep: Sweep):
        self.sweep = sweep
        self.curves: dict[tuple[int, str], Any] = {}  # (seed, order) -> heads.PruningCurve

    def post_hoc(self, s: Seeded, method: str, amount, transform: Callable, params: dict,
                 masks: dict | None = None) -> dict:
        """The point `transform` makes of a copy of the seed's full model (read back when saved)."""
        found = self.sweep.done(method, amount, s.seed)
        if found is not None:
            return found
        t0 = time.time()
        model = transform(copy.deepcopy(s.full))
        return self.sweep.save_point(s, method, amount, model, masks, params, self.sweep.evaluate(model),
                                     time.time() - t0)

    def lowrank_magnitude(self, s: Seeded, rank: int) -> dict:
        """Magnitude pruning of each block matrix (no retraining) to as many nonzero weights as its
        rank-`rank` factorisation has (`equal_parameter_sparsity`): the matrices `lowrank_product`
        factorises (the blocks': not the pooler, embeddings or head the prunable set may add)."""
        params = dict(s.full.named_parameters())
        factorised = set(dense_layers(s.full))
        amounts = {n: equal_parameter_sparsity(tuple(params[n].shape), rank) for n in s.names
                   if n in factorised and params[n].ndim == 2}
        masks = layerwise_magnitude_masks(s.full, amounts)
        return self.post_hoc(s, "lowrank_magnitude", rank, lambda m: apply_masks(m, masks),
                             {"rank": rank, "equal_parameters_to": f"lowrank r{rank}"}, masks=masks)

    def head_curve(self, s: Seeded, order: str, settings) -> Any:
        """An order's curve for seed `s` (`heads.classifier_curve`), computed once per seed: the
        random and bad methods size their equal-size subnetworks by the good curve."""
        key = (s.seed, order)
        if key not in self.curves:
            model = copy.deepcopy(s.full).to(self.sweep.run.device)
            self.curves[key] = H.classifier_curve(model, self.sweep.run, order, settings, s.seed, self.sweep.ft.batch_size)
            model.to("cpu")
        return self.curves[key]

    def head_point(self, s: Seeded, method: str, step, params: dict, units: str = "heads") -> dict:
        """A heads point: the fine-tuned model with `step`'s mask as zeroed weights. A point found
        on disk is read back only when it holds the same mask (a point of another schedule,
        `heads.step_of`, at the same amount is recomputed)."""
        amount = float(step.fraction_removed(units))  # the share of the pruned units removed
        found = self.sweep.done(method, amount, s.seed)
        record = H.mask_record(step.heads_kept, step.mlps_kept)
        if found is not None and all(found.get(k) == v for k, v in record.items()):
            return found
        t0 = time.time()
        masked = H.apply_mask(copy.deepcopy(s.full), step.heads_kept, step.mlps_kept)
        return self.sweep.save_point(s, method, amount, masked, None, {**record, **params},
                                     self.sweep.evaluate(masked), time.time() - t0)

    def heads(self, s: Seeded, method: str) -> list[dict]:
        """Every step of one order's iterative head pruning (or the `remove` mask) as a point; the
        surviving-heads rows of the order's subnetwork go to `self.sweep.head_rows`: its curve's
        threshold mask, or with `heads.subnetworks: equal_size` for random and bad Prasanna et
        al.'s subnetwork of the good one's size (`heads.order_subnetwork`), itself a point too
        (`EQUAL_SIZE_POINTS`). Importance (the dev split by default, `heads.importance_split`) and
        the stopping rule never read the test split;
        the test accuracy of each point is measured afterwards."""
        settings = head_settings(self.sweep.cfg)
        order = HEAD_METHODS[method]
        common = {"fraction": settings.fraction, "step_of": settings.step_of, "threshold": settings.threshold,
                  "importance_split": settings.importance_split, "importance_batch": settings.importance_batch}
        if order is None:
            kept = H.mask_from_removed(s.full, settings.remove, where="heads: remove")
            step = H.PruningStep(1, int(kept.size - kept.sum()), float("nan"), kept)
            return [self.head_point(s, method, step, {"order": order, "pruning_step": 1, **common})]
        curve = self.head_curve(s, order, settings)
        units = curve.units
        sized = settings.subnetworks == "equal_size" and method in EQUAL_SIZE_POINTS
        chosen = H.order_subnetwork({order: curve, "good": self.head_curve(s, "good", settings)} if sized
                                    else {order: curve}, order, s.seed, "equal_size" if sized else "threshold")
        self.sweep.subnetworks[(s.seed, order)] = chosen  # what `heads: refinetune` re-fine-tunes
        self.sweep.head_rows += [r for r in H.curve_rows(curve, model=H.METHOD, family=self.sweep.run.family,
                                                         seed=s.seed, task=self.sweep.ft.task, subnetwork=chosen,
                                                         subnetwork_kind="equal_size" if sized else "threshold")
                                 if r["metric"] in ("head_kept", "heads_prunable", "mlp_kept", "mlps_prunable")]
        mlps_note = f", {curve.mlps_prunable}/{len(curve.steps[0].heads_kept)} MLPs" if units != "heads" else ""
        self.sweep.log(f"  {method} seed {s.seed}: {curve.prunable}/{curve.steps[0].heads_kept.size} heads{mlps_note} "
                       f"prunable at {curve.threshold:.0%} of the full model's dev accuracy")
        unit_params = {"units": units} if units != "heads" else {}
        if units == "both":
            unit_params["both_schedule"] = settings.both_schedule
        # points are filed by amount; a step of Prasanna et al.'s continuation (units both) can land on
        # the amount of an earlier joint step under the line: the later step, on the way to the
        # subnetwork, is the point there (every step stays in the curve's rows)
        by_amount = {float(step.fraction_removed(units)): step for step in curve.steps[1:]}
        out = [self.head_point(s, method, step, {"order": order, "pruning_step": step.step, "phase": step.phase,
                                                 **unit_params, **common}, units)
               for step in by_amount.values()]
        if sized:  # Prasanna et al.'s comparison: the random / bad subnetwork of the good one's size
            out.append(self.head_point(s, EQUAL_SIZE_POINTS[method], chosen,
                                       {"order": order, "subnetwork": "equal_size", "pruning_step": chosen.step,
                                        "size_of": "heads_good", **unit_params, **common}, units))
        return out


# The amounts of every kind of point, for folder names: the config's methods plus the comparison
# `lowrank` writes (not a method a config lists).
AMOUNT_OF = {**METHODS, "lowrank_magnitude": "ranks", "full": "sparsities",
             **{point: "heads" for point in EQUAL_SIZE_POINTS.values()}}


# ------------------------------------------------------------------------------------------ the run

@dataclass
class PruneResult:
    run_id: str
    rows: Any  # pandas DataFrame
    points: list[dict]
    folder: Path


def unit_stages(cfg: PruneConfig, ft) -> list[list[tuple[int | None, str, float | None]]]:
    """The sweep's trainings as executor units, (seed, method, amount), in stages whose units are
    independent: 1. each seed's full model and the masked-LM ticket search (imp_mlm, once per
    sweep); 2. each seed's IMP rounds (one unit: a round prunes the previous round's weights) and
    every oneshot, random and imp_mlm point; 3. every reinit point (IMP's masks). The post-hoc
    points (quantize, lowrank, heads: no training) are made afterwards in the parent (`run_seed`)."""
    methods = cfg.methods
    first = [(seed, "full", None) for seed in ft.seeds] + ([(None, "mlm", None)] if "imp_mlm" in methods else [])
    second, third = [], []
    for seed in ft.seeds:
        if "imp" in methods:
            second.append((seed, "imp", None))
        second += [(seed, m, amount) for amount in cfg.sparsities for m in ("oneshot", "random") if m in methods]
        if "imp_mlm" in methods:
            second += [(seed, "imp_mlm", amount) for amount in mlm_sparsities(cfg)]
        if "reinit" in methods:
            third += [(seed, "reinit", amount) for amount in cfg.sparsities]
    return [stage for stage in (first, second, third) if stage]


def _unit_name(seed: int | None, method: str, amount: float | None) -> str:
    return " ".join([method] + ([amount_label(method, amount)] if amount is not None else [])
                    + ([f"seed {seed}"] if seed is not None else []))


def run_unit(cfg: PruneConfig, ft, folder: str, data, seed: int | None, method: str, amount: float | None) -> None:
    """One unit of `unit_stages` in a worker (a local process or a submitit job): the sweep set up
    again over its folder (the parent claimed it), the unit's training done, its point written
    (`point.json`, read back by the parent). Each point is seeded by its seed alone (the same
    weights as in-process)."""
    from workbench.drivers.finetune import prepare

    folder = Path(folder)
    sweep = Sweep(cfg, ft, prepare(dataclasses.replace(ft, output_dir=str(folder / "full")), data), folder)
    if method == "mlm":
        sweep.mlm_tickets()
        return
    s = sweep.full_model(seed)
    if method == "full":
        return
    imp_masks = sweep.imp(s) if method in ("imp", "reinit") else {}
    if method != "imp":
        sweep.retrained_point(s, method, amount, imp_masks)


def refinetune_stage(cfg: PruneConfig, ft, sweep: "Sweep", folder: Path, options) -> list[dict]:
    """`heads: refinetune`: every seed's good, random and bad subnetwork re-fine-tuned (`refinetune_unit`),
    the executor's units (a worker gets the masks as plain lists); their records in (seed, order) order."""
    from workbench.drivers.executor import Unit, replace_threads, run_driver_units

    todo = [(seed, order) for seed in ft.seeds for order in H.ORDERS]
    good_step = {seed: sweep.subnetworks[(seed, "good")].step for seed in ft.seeds}

    def units(parallel: bool) -> list:
        unit_ft = replace_threads(ft) if parallel else ft
        out = []
        for seed, order in todo:
            sub = sweep.subnetworks[(seed, order)]
            mlps = None if sub.mlps_kept is None else np.asarray(sub.mlps_kept, bool).tolist()
            out.append(Unit(refinetune_unit, (unit_ft, str(folder), seed, order, good_step[seed],
                                              np.asarray(sub.heads_kept, bool).tolist(), mlps),
                            name=f"refinetune {order} seed {seed}"))
        return out

    return run_driver_units(units, len(todo), options, folder, desc="re-fine-tunings")


def refinetune_unit(ft, folder: str, seed: int, order: str, step: int, heads_kept: list, mlps_kept: list | None) -> dict:
    """One subnetwork re-fine-tuned from the pretrained weights (Prasanna et al. 2020), an executor
    unit: the masked pretrained model saved as a derived checkpoint named by its parent and mask
    (`head_pruning.masked_handle`), fine-tuned by the sweep's recipe for this seed with the mask kept
    through training (`head_pruning.mask_keeper`); its record in `refinetuned/seed-S-ORDER/point.json`
    (found there on a rerun). As experiments/prune_heads.py --refinetune, the same weights."""
    from workbench.drivers.finetune import load_finetune_config, run_finetune
    from workbench.loop import TrainingHooks
    from workbench.running.models import ModelHandle

    out = Path(folder) / "refinetuned" / f"seed-{seed}-{order}"
    done = out / "point.json"
    if done.is_file():
        return json.loads(done.read_text(encoding="utf-8"))
    kept = np.asarray(heads_kept, bool)
    mlps = None if mlps_kept is None else np.asarray(mlps_kept, bool)
    masks = [str(ft.checkpoint), kept.tolist()] + ([] if mlps is None else [mlps.tolist()])
    key = hashlib.sha256(json.dumps(masks).encode()).hexdigest()[:12]
    masked = out / f"masked-{key}"
    if not masked.is_dir():
        H.masked_handle(ModelHandle.load(ft.checkpoint), kept, mlps, method="heads", order=order, seed=seed,
                        step=step).save(masked)
    cfg = load_finetune_config(ft, {"checkpoint": str(masked), "seeds": [seed], "baselines": False,
                                    "name": f"refinetune-{order}-seed-{seed}", "output_dir": str(out / "finetune")})
    r = run_finetune(cfg, hooks=TrainingHooks(after_step=H.mask_keeper(kept, mlps)))
    record = {"seed": seed, "order": order, "dev": r.seeds[0].dev["accuracy"], "test": r.seeds[0].test["accuracy"],
              "n_kept": int(kept.sum()), "checkpoint": str(masked),
              **({} if mlps is None else {"n_mlps_kept": int(mlps.sum())})}
    atomic_write_json(done, record)
    return record


def refinetune_rows(records: list[dict], ft) -> list[dict]:
    """The re-fine-tuned accuracies as rows (metric accuracy_refinetuned; experiments/prune_heads.py's)."""
    return [{"model": str(ft.checkpoint), "seed": int(r["seed"]), "probe": H.PROBE, "task": ft.task, "split": split,
             "metric": "accuracy_refinetuned", "value": r[split],
             "extra": {"method": H.METHOD, "order": r["order"], "n_kept": r["n_kept"], "checkpoint": r["checkpoint"]}}
            for r in records for split in ("dev", "test")]


def run_prune(cfg: PruneConfig, ft, store=None, data=None, executor=None) -> PruneResult:
    """Run every point of the sweep (resuming finished ones) and write one results-store run.
    `data` replaces the task's examples (tests plant a task, as `run_finetune` allows); `executor`
    (`workbench.drivers.executor.ExecutorOptions`, default: this process) runs the trainings as independent
    units (`unit_stages`), job files under the sweep folder's `submitit/`."""
    import pandas as pd

    from workbench.store.checkpoints import single_checkpoint
    from workbench.drivers.executor import ExecutorOptions, Unit, replace_threads, run_driver_units
    from workbench.drivers.finetune import prepare, run_slug
    from workbench.paths import runs_root

    options = (executor or ExecutorOptions()).validate()
    single_checkpoint(ft.checkpoint)  # a missing checkpoint is refused before the sweep folder is made
    name = cfg.name or f"prune-{ft.task}-{run_slug(Path(ft.checkpoint).name)}"
    folder = Path(cfg.output_dir) if cfg.output_dir else runs_root() / "prune" / name
    folder.mkdir(parents=True, exist_ok=True)
    key = cfg.key(ft)
    cfg_file = folder / "config.json"
    if cfg_file.is_file():
        old = json.loads(cfg_file.read_text(encoding="utf-8"))
        if old != json.loads(json.dumps(key)):
            raise ConfigError(f"{folder}: holds a prune sweep with another config; choose another name or "
                              f"output_dir, or delete the folder")
    else:
        atomic_write_json(cfg_file, key)
    run = prepare(dataclasses.replace(ft, output_dir=str(folder / "full")), data)
    total = math.ceil(len(run.train.ids) / ft.batch_size) * ft.epochs
    if cfg.rewind_step >= total:  # before any training: the rewind point must leave steps to retrain
        raise ConfigError(f"rewind_step: {cfg.rewind_step} is not below the fine-tuning's {total} steps "
                          f"({len(run.train.ids)} examples, batch_size {ft.batch_size}, {ft.epochs} epochs)")
    sweep = Sweep(cfg, ft, run, folder)
    # the trainings as the executor's units, stage by stage, in workers; then every point is read back
    # below (in this process `run_seed` makes them in order, sharing the fine-tuning's state)
    stages = unit_stages(cfg, ft)
    worker_cfg, worker_ft = dataclasses.replace(cfg, progress=False), replace_threads(ft)  # one thread, quiet
    for stage in stages:
        run_driver_units(lambda parallel, stage=stage: [
            Unit(run_unit, (worker_cfg, worker_ft, str(folder), data, seed, method, amount),
                 name=_unit_name(seed, method, amount)) for seed, method, amount in stage] if parallel else [],
            sum(map(len, stages)), options, folder, desc="prune units")
    for seed in ft.seeds:
        sweep.run_seed(seed)
    rows = build_rows(sweep.points, ft.task, run.family, name)
    rows += [{**r, "extra": {**r["extra"], "sweep": name}} for r in sweep.head_rows]
    if head_settings(cfg).refinetune:  # the last stage: the subnetworks re-fine-tuned, each a unit
        rows += refinetune_rows(refinetune_stage(cfg, ft, sweep, folder, options), ft)
    frame = pd.DataFrame(rows)
    with atomic_path(folder / "rows.csv") as tmp:  # readable without the store (e.g. copied off a GPU machine)
        frame.assign(extra=frame["extra"].map(lambda e: json.dumps(e, sort_keys=True, default=str))).to_csv(tmp, index=False)
    atomic_write_json(folder / "points.json", sweep.points)
    try:
        from workbench.store.results import ResultsStore
    except ImportError as e:  # a GPU machine without pyarrow: say so, the rows are in rows.csv
        get_logger(__name__).warning(f"results store unavailable ({e}); the rows are in {folder / 'rows.csv'}")
        return PruneResult("", frame, sweep.points, folder)
    store = store or ResultsStore()
    with store.start_run("prune", cfg.to_dict(), seeds=ft.seeds, data_files=run.data.files,
                         checkpoints=[run.checkpoint], name=name) as writer:
        writer.add(rows)
        writer.note("points", sweep.points)
        writer.note("folder", str(folder))
        writer.note("base_model", run.model_name)
        run_id = writer.run_id
    return PruneResult(run_id, frame, sweep.points, folder)


def load_driver_config(source: str | Path | dict, overrides: dict | None = None) -> tuple[PruneConfig, Any]:
    """The registry's load: overrides keyed like the YAML (sweep keys, `finetune.KEY` for the
    fine-tuning's), taken apart for `load_prune_config`."""
    outer, finetune = split_section(overrides, "finetune")
    return load_prune_config(source, outer, finetune)


def report(result: PruneResult) -> str:
    """What `bertology prune` prints: the sweep's table and where its points went."""
    return f"{format_table(result.rows)}\nrun {result.run_id}; points under {result.folder / 'points'}"


def _run_loaded(loaded: tuple, store=None, executor=None) -> PruneResult:
    """The driver's run: `load_prune_config` gives (sweep config, fine-tuning config)."""
    cfg, ft = loaded
    return run_prune(cfg, ft, store=store, executor=executor)


DRIVER = DriverSpec("prune", PruneConfig, load_driver_config, _run_loaded, report,
                    identity=lambda loaded: loaded[0].key(loaded[1]))
