"""The pieces every training loop of the workbench shares, and the hooks that change what it trains.

Three loops use them: pretraining (`workbench.drivers.train`), fine-tuning (`workbench.drivers.finetune`) and the
cloze probe's multiple-choice fine-tuning (`probes.cloze.finetune_mc`). Each loop stays readable
top to bottom, in the manner of nanoGPT's train.py: its own data order, evaluation and
bookkeeping, and these pieces for what every loop does the same way:

- setup: `apply_param_filter` (freeze what does not train), `adamw` (weight decay on matrices
  only), `linear_warmup_decay` (the learning-rate schedule), `prepare_teacher`;
- step: `loss_terms` (the forward pass, with a teacher's outputs when there is one) and
  `optimizer_step` (clip, step, schedule, zero the gradients, the after-step hook);
- evaluate: `evaluating` (eval mode, no gradients, the training mode restored afterwards);
- save: `write_model_folder` (a plain `save_pretrained` folder with tokenizer and manifest).

Hooks (`TrainingHooks`), all optional and off by default; with none a loop trains exactly as it
did before they existed (tests pin the weights of every family, tests/weight_pins.py):

- `trainable`: a `ParamFilter`. Parameters it rejects are frozen (`requires_grad` False) and kept
  out of the optimizer; the checkpoint manifest records the filter and the trainable count.
  `biases_only()` is BitFit (Ben Zaken, Ravfogel & Goldberg 2022); `names_matching(regex)`
  selects added parameters by name (adapters, Houlsby et al. 2019; prompts, Lester et al. 2021).
- `teacher` and `loss`: the teacher is frozen, in eval mode, and runs under no_grad on the same
  batch as the student; `loss(student_out, batch, teacher_out)` returns the loss terms as a
  dict whose "loss" is the one backpropagated. Every term is logged separately, as in DistilBERT's
  distillation script (Sanh et al. 2019), so a sweep over the weights of a composite loss can be
  read afterwards. `kl_to_teacher` is the soft-target term of Hinton, Vinyals & Dean (2015).
- `initial(model)`: sets the initial weights of the model the loop built, in place, before the
  optimizer is made (a resumed run then loads its saved state over them): a distillation student
  initialised from its teacher's layers (DistilBERT, Sanh et al. 2019; `workbench.drivers.distill_pretraining`).
- `after_step(model, step)`: called after every optimizer step with the (unwrapped) model and
  the number of steps done, e.g. to re-apply pruning masks so that pruned weights stay exactly
  zero, or to rewind weights (Frankle & Carbin 2019).
- `before_step(model, step)`: called after the backward pass, before the gradients are clipped
  and the optimizer steps, e.g. to zero the gradients of pruned weights so that the clipping norm
  is that of the live weights (`workbench.compress.masks.zero_pruned_gradients`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.errors import ConfigError
from workbench.io import atomic_write_json

# ---- hooks ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamFilter:
    """Which parameters train: `keep(name, parameter)` is True for those that do. `name` is what
    the manifest records (and what tells two runs apart)."""

    name: str
    keep: Callable[[str, torch.nn.Parameter], bool]


def biases_only() -> ParamFilter:
    """BitFit (Ben Zaken, Ravfogel & Goldberg 2022): only the bias terms train."""
    return ParamFilter("biases_only", lambda name, p: name == "bias" or name.endswith(".bias"))


def names_matching(pattern: str) -> ParamFilter:
    """Only parameters whose full name matches the regular expression `pattern` (re.search)."""
    regex = re.compile(pattern)
    return ParamFilter(f"names_matching:{pattern}", lambda name, p: regex.search(name) is not None)


def outside(module: torch.nn.Module, name: str) -> ParamFilter:
    """Every parameter except those of `module` (e.g. a classifier's body: train the head only)."""
    inside = {id(p) for p in module.parameters()}
    return ParamFilter(name, lambda _, p: id(p) not in inside)


LossFn = Callable[[Any, Any, Any], dict[str, torch.Tensor]]


@dataclass
class TrainingHooks:
    """What a training loop may be asked to do beyond its plain objective (module docstring)."""

    after_step: Callable[[torch.nn.Module, int], None] | None = None
    before_step: Callable[[torch.nn.Module, int], None] | None = None  # after backward, before clipping
    initial: Callable[[torch.nn.Module], None] | None = None  # sets the built model's initial weights in place
    loss: LossFn | None = None  # (student outputs, batch, teacher outputs or None) -> {"loss": ..., ...}
    teacher: torch.nn.Module | None = None
    trainable: ParamFilter | None = None

    def __post_init__(self):
        if self.teacher is not None and self.loss is None:
            raise ConfigError("training hooks: a teacher needs a loss that reads its outputs (hooks.loss)")

    def describe(self) -> dict:
        """What the hooks are, for manifests and for refusing to resume a run made with other hooks."""
        out: dict = {}
        if self.trainable is not None:
            out["trainable"] = self.trainable.name
        if self.loss is not None:
            # a loss with parameters (a distillation loss: T, alpha, its teacher) describes itself
            describe = getattr(self.loss, "describe", None)
            out["loss"] = describe() if callable(describe) else _callable_name(self.loss)
        if self.teacher is not None:
            config = getattr(self.teacher, "config", None)
            out["teacher"] = {"class": type(self.teacher).__name__,
                              "name_or_path": str(getattr(config, "_name_or_path", "") or "")}
        if self.after_step is not None:
            out["after_step"] = _callable_name(self.after_step)
        if self.before_step is not None:
            out["before_step"] = _callable_name(self.before_step)
        if self.initial is not None:
            describe = getattr(self.initial, "describe", None)
            out["initial"] = describe() if callable(describe) else _callable_name(self.initial)
        return out


NO_HOOKS = TrainingHooks()


def _callable_name(fn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def kl_to_teacher(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float = 1.0,
                  mask: torch.Tensor | None = None) -> torch.Tensor:
    """KL(teacher || student) of the softened distributions over the last axis, times T^2 (Hinton,
    Vinyals & Dean 2015: keeps the gradient scale independent of T), averaged over the positions
    `mask` selects (all by default)."""
    t = temperature
    log_p_student = torch.log_softmax(student_logits.float() / t, -1)
    log_p_teacher = torch.log_softmax(teacher_logits.float() / t, -1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1)
    if mask is not None:
        kl = kl[mask]
    return kl.mean() * t * t


# ---- setup ------------------------------------------------------------------------------------------


def apply_param_filter(model: torch.nn.Module, param_filter: ParamFilter | None) -> dict:
    """Freeze the parameters `param_filter` rejects (None: all train); returns `count_trainable`."""
    if param_filter is not None:
        for name, p in model.named_parameters():
            if not param_filter.keep(name, p):
                p.requires_grad_(False)
    record = count_trainable(model, param_filter)
    if param_filter is not None and record["parameters"] == 0:
        raise ConfigError(f"parameter filter {param_filter.name}: no parameter of {type(model).__name__} passes it")
    return record


def count_trainable(model: torch.nn.Module, param_filter: ParamFilter | None = None) -> dict:
    """The record a manifest keeps: the filter's name, how many parameter values train and how many
    there are (tensors shared between modules counted once)."""
    params = list(model.parameters())
    return {"filter": param_filter.name if param_filter is not None else "all",
            "parameters": sum(p.numel() for p in params if p.requires_grad),
            "total": sum(p.numel() for p in params)}


def adamw(named_parameters: Iterable[tuple[str, torch.nn.Parameter]], lr: float, weight_decay: float,
          betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW (Loshchilov & Hutter 2019) over the parameters that train, in the order given (a saved
    optimizer state is matched by position); weight decay on matrices only: biases and
    LayerNorm/RMSNorm weights (1-d) are exempt. `foreach=True`: one multi-tensor update instead of
    torch's per-tensor loop (its CPU default), bit-identical weights (the pins in
    tests/test_train_loop.py hold) and a faster step where a large embedding matrix trains every step
    (benchmarks/bench_distill.py, MiniLM's student: x1.12; the fused kernel, x1.18, changes the last
    bit of the weights, so it stays off)."""
    decay, no_decay = [], []
    for _, p in named_parameters:
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, foreach=True)


def linear_warmup_decay(warmup: int, total: int):
    """The lr factor at a step: linear warm-up from 0 over `warmup` steps, then linear decay to 0 at
    `total` (Devlin et al. 2019)."""

    def factor(step: int) -> float:
        if warmup > 0 and step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total - step) / max(1, total - warmup))

    return factor


def prepare_teacher(hooks: TrainingHooks, device) -> TrainingHooks:
    """The teacher on `device`, in eval mode (no dropout: it consumes no random numbers), frozen."""
    if hooks.teacher is not None:
        hooks.teacher.to(device).eval().requires_grad_(False)
    return hooks


# ---- step -------------------------------------------------------------------------------------------


def call_with_batch(model, batch: dict):
    """The usual forward: a dict batch as keyword arguments."""
    return model(**batch)


def loss_terms(model, batch, hooks: TrainingHooks, default_loss: Callable[[Any, Any], dict[str, torch.Tensor]],
               forward: Callable[[Any, Any], Any] = call_with_batch) -> dict[str, torch.Tensor]:
    """The loss terms of one batch, "loss" first: the loop's own objective (`default_loss(outputs,
    batch)`) or, with `hooks.loss`, that function of the student's outputs, the batch and the
    teacher's outputs (the teacher runs under no_grad on the same batch)."""
    out = forward(model, batch)
    if hooks.loss is None:
        return default_loss(out, batch)
    teacher_out = None
    if hooks.teacher is not None:
        with torch.no_grad():
            teacher_out = forward(hooks.teacher, batch)
    terms = hooks.loss(out, batch, teacher_out)
    if not isinstance(terms, dict) or "loss" not in terms:
        raise ConfigError(f"training hooks: the loss {_callable_name(hooks.loss)} must return a dict with a "
                          f"'loss' entry (the term to backpropagate)")
    return {"loss": terms["loss"], **{k: v for k, v in terms.items() if k != "loss"}}


def optimizer_step(model: torch.nn.Module, optimizer, scheduler, clip: float, hooks: TrainingHooks,
                   step: int) -> float:
    """Call the before-step hook (it may change the gradients), clip the gradient norm of `model`'s
    parameters (0: no clipping), step the optimizer and the schedule, drop the gradients, then call
    the after-step hook with the model and `step` (steps done). Returns the learning rate the step
    used."""
    if hooks.before_step is not None:
        hooks.before_step(model, step)
    if clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    lr = scheduler.get_last_lr()[0] if scheduler is not None else optimizer.param_groups[0]["lr"]
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if hooks.after_step is not None:
        hooks.after_step(model, step)
    return lr


# ---- evaluate ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def evaluating(model: torch.nn.Module):
    """Eval mode (no dropout, so no random numbers drawn) and no gradients inside the block; the
    model's training mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train(was_training)


# ---- save -------------------------------------------------------------------------------------------


def write_model_folder(folder: Path, model, tokenizer, manifest: dict) -> None:
    """A plain `save_pretrained` folder with the tokenizer and `manifest.json` into `folder` (a
    temporary folder of `workbench.io.atomic_dir`: the caller makes the write atomic)."""
    from workbench.hf_quiet import quiet_transformers

    with quiet_transformers():
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    atomic_write_json(Path(folder) / "manifest.json", manifest)
