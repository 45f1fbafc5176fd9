"""What a checkpoint cost: training FLOPs, device-hours, energy and CO2e, along its lineage.

Strubell et al. (2019, "Energy and Policy Considerations for Deep Learning in NLP", Table 3) put
a price on every model: hours on which hardware, kWh, CO2e. Every checkpoint the workbench writes
(pretraining steps, fine-tuned `best/` folders, derived models) carries a `cost` record in its
manifest.json:

    cost.own    what producing THIS checkpoint from its parent cost: training FLOPs (analytic,
                below), tokens, device kind and name, device-hours, energy (kWh) and where the
                energy figure comes from, CO2e under the recorded grid intensity;
    cost.parent the parent's folder and its `total` (None for a model trained from scratch);
    cost.total  own + parent's total (flops, device_hours, energy_kwh, co2e_kg); `known: false`
                (and None values, never zero) when some ancestor's cost cannot be known (a Hub
                model trained elsewhere).

FLOPs are analytic, per family (`flops_per_token`): the forward's matmul FLOPs, counted per
non-padding input token (the count the training loop logs as `tokens`): Q/K/V/output projections,
attention scores and weighted values (over the full attention span `seq_len`, as computed),
feed-forward, and the output head on the positions that go through it. Embedding lookups,
LayerNorm, activations, softmax and per-sequence heads (NSP/SOP/pooler) are left out: they are a
few percent at these widths. `benchmarks/bench_train.py` imports the same function for its MFU.
A fine-tuned classifier is charged for what its kind runs (`finetune_forward_flops`: a T5/BART
decoder_last classifier runs both stacks over the input, an encoder-mean or token head the encoder
alone). Beside this full count every record keeps Kaplan et al. (2020)'s C = 6ND (`kaplan_flops`:
N the non-embedding parameters, `non_embedding_params`), the measure their compute laws use, which
leaves out the attention-score matmuls and the heads.

What a training step adds to the forward (Kaplan et al. 2020, Sec. 2.1: C = 6N per token, 2N
forward and 4N backward): the backward of a weight matmul y = x W is two matmuls of the forward's
size, the activation gradient dL/dx = dL/dy W^T (2N) and the weight gradient dL/dW = x^T dL/dy
(2N); a matmul of two activations (attention scores Q K^T, weighted values P V) has no weight and
its backward is two activation gradients. So, in multiples of each part's forward (`PASSES`):

    method                       body weight matmuls    attention scores/values    head    method's own matrices
    full (and pretraining)       3 (fwd, act, weight)   3                          3       -
    head (body frozen)           1 (forward only)       1                          3       -
    bitfit, lora, adapter,       2 (fwd, act grads:     3                          3       3 (LoRA's A and B,
    prompt                         no weight grads)                                          the adapters)

A frozen body under a trainable head needs no backward at all; LoRA, adapters, BitFit's biases and
prompt vectors sit inside or below the body, so the activation gradients run through every layer,
but no frozen weight gets a gradient (bias gradients are sums, prompt rows a scatter: no matmul).
Two upper bounds: the head is charged 3x though its input gradient is needed only when something
below it trains, and the lowest layer's activation gradients below its first trainable module
(e.g. layer 0's Q/K/V input gradients under LoRA) are counted though autograd skips them
(`tests/test_cost.py` measures each method's step with torch's FlopCounterMode against this).

A distillation student's own FLOPs include its teacher's forwards (`training_flops_per_token`,
`finetune_cost_flops`): the teacher runs (1x, no backward) on the student's batches; DistilBERT's
soft-target term over every non-pad token adds both MLM heads at every position.

Energy (`EnergyMeter`): measured where the machine exposes a counter: NVIDIA's NVML total energy
(`pynvml`, GPU runs) or Intel/AMD RAPL (`/sys/class/powercap/intel-rapl:*/energy_uj`, the whole
package, so shared with whatever else runs on it); otherwise ESTIMATED from a configurable power
figure: on a CPU, watts per busy core times the process's CPU seconds (`time.process_time`, all
its threads; on a machine shared with other jobs this counts our work, not the wall time we
waited; `BERTOLOGY_CPU_WATTS_PER_CORE`, default 12.5 W, about a 200 W 16-core server CPU's TDP
share), on a GPU watts times wall time (`BERTOLOGY_GPU_WATTS`, default 400 W). The record says which
(`energy_source`: `measured: rapl`, `measured: nvml` or `estimated: ...`). As Strubell et al., the
energy drawn at the wall is the device energy times a data-centre PUE (`BERTOLOGY_PUE`, default
their 1.58), and CO2e is that energy times a grid intensity (`BERTOLOGY_GRID_GCO2_PER_KWH`,
default their US average 0.954 lb/kWh = 433 g/kWh); `bertology cost --grid G` re-expresses it.

codecarbon (3.3.2) was not used: it is not installed here, wants network for its cloud/region
lookups unless put in offline mode with a country code, and reads the same RAPL files that do not
exist on this machine (no /sys/class/powercap), so here it could only estimate too. This module
does the same arithmetic in ~300 lines with nothing to install, and says which figure it used.

Concerns:
- pretraining FLOPs, asked of the family (`FamilySpec.flops`; the formulas are
  `workbench.families.flops`): `family_flops`, `forward_flops_per_token`, `flops_per_token`,
  `training_flops_per_token`
- Kaplan et al.'s N and C = 6N, per family: `non_embedding_params`, `kaplan_flops_per_token`
- fine-tuning and distillation FLOPs (classifier bodies, PEFT methods, teachers):
  `finetune_forward_flops`, `method_flops`, `finetune_flops`, `finetune_flops_per_token`,
  `method_forward_flops`, `with_method_modules`, `teacher_forward_flops_per_token`,
  `finetune_cost_flops`, `teacher_tokens`
- the device and its energy: `cpu_name`, `device_info`, `EnergyMeter`
- the manifest's cost record and the lineage it sums: `own_cost`, `totals`, `cost_record`,
  `teacher_folder`, `derived_cost`, `add_retraining`, `manifest_kaplan_per_token`, `with_kaplan`,
  `cost_of_manifest`, `checkpoint_cost`, `lineage_chain`
- `bertology cost`'s output (targets, table, store rows, JSON): `cost_targets`, `display_name`,
  `format_cost_table`, `cost_rows`, `record_costs`, `dumps`
"""

from __future__ import annotations

import glob
import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from workbench.families.flops import (SEQ2SEQ_CLASSIFIERS, UnknownClassifier, config_value, encoder_body_flops,
                                      encoder_params)
from workbench.store.rowschema import RowSchema

DEFAULT_CPU_WATTS_PER_CORE = 12.5
DEFAULT_GPU_WATTS = 400.0
DEFAULT_PUE = 1.58          # Strubell et al. 2019, Sec. 2 (the 2018 industry average)
DEFAULT_GRID_G_PER_KWH = 433.0  # Strubell et al. 2019: 0.954 lbs CO2e / kWh (US EPA average)
# `kaplan_flops` (Kaplan et al. 2020's 6ND, `kaplan_flops_per_token`) is kept beside `flops` (the
# full count) and adds up along a lineage the same way.
TOTAL_KEYS = ("flops", "kaplan_flops", "device_hours", "energy_kwh", "co2e_kg")


# ---------------------------------------------------------------------------------- FLOPs

def family_flops(family: str):
    """The family's pretraining FLOPs formula (`FamilySpec.flops`), or None where it has none (or
    is no family here)."""
    from workbench.families import find_family

    spec = find_family(family)
    return None if spec is None else spec.flops


def forward_flops_per_token(family: str, model_config: Mapping, vocab: int, seq_len: int,
                            objective: Mapping | None = None, head_fraction: float | None = None) -> dict:
    """The forward's matmul FLOPs per non-padding input token of a family's pretraining model, by
    part, plus `total`. `head_fraction` overrides the share of tokens through an MLM head (e.g. 1.0
    for `BertForMaskedLM`, which projects every position)."""
    formula = family_flops(family)
    if formula is None:
        from workbench.families import available_families

        known = [f for f in available_families() if family_flops(f) is not None]
        raise KeyError(f"no FLOPs count for family {family!r} (known: {', '.join(known)})")
    objective = dict(objective or {})
    if head_fraction is not None:
        objective["mlm_rate"] = head_fraction
    out = dict(formula(dict(model_config), int(vocab), int(seq_len), objective))
    out["total"] = sum(out.values())
    return out


def flops_per_token(family: str, model_config: Mapping, vocab: int, seq_len: int,
                    objective: Mapping | None = None, head_fraction: float | None = None) -> dict:
    """Training FLOPs per non-padding input token of a family's pretraining, by part, plus `total`:
    every part trains, so 3 x its forward (`PASSES["full"]`: forward, activation and weight
    gradients). `head_fraction` as in `forward_flops_per_token`."""
    fwd = forward_flops_per_token(family, model_config, vocab, seq_len, objective, head_fraction)
    fwd.pop("total")
    out = {k: 3 * v for k, v in fwd.items()}
    out["total"] = sum(out.values())
    return out




def non_embedding_params(family: str, model_config: Mapping, classifier: str | None = None) -> int | None:
    """Kaplan et al. (2020)'s N: the parameters of the blocks a token passes through, embeddings
    (token, position, ALBERT/ELECTRA's E -> H projection, ELMo's character CNN, highway and token
    projection: the token embedder) and output heads (MLM/LM heads, tied to the embedding in
    Kaplan's GPT-2s, and classification heads) left out. Deliberate differences, for families Kaplan
    did not train: ALBERT's shared layer counts once per layer it is applied as (C = 6N is per-token
    compute; its stored parameters are 1/L of that); ELECTRA counts generator and discriminator
    (both train on every token); T5/BART count both stacks (cross-attention included) for
    pretraining and the decoder_last classifier, the encoder alone for the encoder-only classifier
    kinds (`ENCODER_ONLY_CLASSIFIERS`); ELMo counts its LSTM layers (both directions, with their
    projections). None when the config is not one this module counts."""
    from workbench.families import find_family

    c = dict(model_config)
    spec = find_family(family)
    try:
        if spec is not None and spec.non_embedding_params is not None:
            return spec.non_embedding_params(c, classifier)
        return encoder_params(c)
    except (KeyError, TypeError):  # UnknownClassifier included: a kind not counted is None here
        return None












def kaplan_flops_per_token(family: str, model_config: Mapping, classifier: str | None = None) -> float | None:
    """Kaplan et al. (2020, Sec. 2.1)'s training compute per token, C = 6N (N =
    `non_embedding_params`): the figure their loss-against-compute laws are drawn in. It leaves out
    what `flops_per_token` counts beside the blocks' weights: attention scores and weighted values
    (their 2 n_layer n_ctx d_attn, dropped from C as sub-leading), the LM/MLM heads (N excludes the
    (un)embedding) and a fine-tuning method's cheaper passes (6N assumes every weight trains). So it
    is comparable with their figures and across model sizes, while `flops` is what the step
    computes (GPT-2 small at 1,024 tokens: the full forward is 1.51x Kaplan's 2N + 2 n_layer n_ctx
    d_attn and 1.68x 2N). None when N cannot be counted."""
    n = non_embedding_params(family, model_config, classifier)
    return None if n is None else 6.0 * n


def _mlm_head_per_position(family: str, model_config: Mapping, vocab: int) -> float:
    """Forward FLOPs of a masked-LM family's head (transform + decoder) on one position."""
    d = config_value(model_config, "hidden_size", "dim")
    e = model_config.get("embedding_size") or d
    return 2 * d * e + 2 * e * vocab


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def _teacher_manifest(folder: str | Path | None) -> dict | None:
    if folder is None:
        return None
    try:
        from workbench.store.checkpoints import resolve_checkpoint

        path = Path(resolve_checkpoint(folder))
    except Exception:  # noqa: BLE001 - a teacher that is gone: its forwards cannot be counted
        return None
    manifest = _read_json(path / "manifest.json")
    if manifest is not None:
        manifest = {**manifest, "model_config": manifest.get("model_config") or _read_json(path / "config.json")}
    return manifest


def training_flops_per_token(manifest: Mapping) -> dict:
    """Own training FLOPs per token of a pretraining run (its checkpoint `manifest`), by part, plus
    `total`: the family's step (`flops_per_token`) and, with a distillation teacher in the hooks
    (`TrainingHooks.describe`), the teacher's forward on the same batches (1x: no backward; its
    MLM head at the student's masked share, as its forward computes it) and, for DistilBERT's triple
    loss over every non-pad token (`workbench.drivers.distill_pretraining.TripleLoss`), both heads at every
    position (the student's 3x, the teacher's 1x). `total` is None when the teacher's shape
    cannot be read (unknown, never zero)."""
    family, mc = manifest["family"], manifest["model_config"]
    vocab = (manifest.get("tokenizer") or {}).get("vocab_size")
    seq_len = (manifest.get("config") or {}).get("max_len")
    objective = manifest.get("objective")
    out = flops_per_token(family, mc, vocab, seq_len, objective)
    hooks = manifest.get("hooks") or {}
    teacher = teacher_folder(hooks)
    if teacher is None:
        return out
    tm = _teacher_manifest(teacher)
    t_family = (tm or {}).get("family")
    if family_flops(t_family) is None or not (tm or {}).get("model_config"):
        return {**out, "teacher_forward": None, "total": None}
    rate = float((objective or {}).get("mlm_rate", 0.15))
    out["teacher_forward"] = forward_flops_per_token(t_family, tm["model_config"], vocab, seq_len, objective,
                                                     head_fraction=rate)["total"]
    loss = hooks.get("loss") or {}
    if loss.get("name") == "distilbert_triple" and loss.get("soft_loss_positions", "masked") == "non_pad":
        # the soft targets at every position: each head once more over all tokens (the masked
        # share is already in each model's forward)
        out["soft_loss_student_head"] = 3 * _mlm_head_per_position(family, mc, vocab)
        out["soft_loss_teacher_head"] = _mlm_head_per_position(t_family, tm["model_config"], vocab)
    out["total"] = sum(v for k, v in out.items() if k != "total")
    return out


# What each pass costs in multiples of a part's forward (module docstring): body weight matmuls,
# attention scores/values (two activations), the task head, and the method's own matrices.
PASSES = {
    "full": {"body_weights": 3, "body_scores": 3, "head": 3, "method_modules": 0},
    "head": {"body_weights": 1, "body_scores": 1, "head": 3, "method_modules": 0},
    **{m: {"body_weights": 2, "body_scores": 3, "head": 3, "method_modules": 3}
       for m in ("bitfit", "lora", "adapter", "prompt")},
}
















def finetune_forward_flops(family: str, model_config: Mapping, seq_len: int, num_labels: int,
                           classifier: str | None = None) -> dict | None:
    """Forward FLOPs per token of a classifier: `body_weights` (the body's weight matmuls),
    `body_scores` (attention scores and weighted values: matmuls of two activations) and `head` (a
    linear head on every token: an upper bound for sentence tasks). `classifier` is the classifier
    kind that runs (the fine-tuning manifest's `pooling`: decoder_last, encoder_mean, or "token" for
    token tasks); it matters for T5/BART only (`seq2seq_classifier_flops`). None when the body's
    shape is not one this module counts."""
    from workbench.families import find_family

    c = dict(model_config)
    spec = find_family(family)
    try:
        if spec is not None and spec.classifier_flops is not None:
            body, d = spec.classifier_flops(c, seq_len, classifier)
        else:
            body, d = encoder_body_flops(c, seq_len)
    except UnknownClassifier as e:
        raise UnknownClassifier(f"no FLOPs count for a {family} classifier of kind {classifier!r} "
                                f"(known: {', '.join(SEQ2SEQ_CLASSIFIERS)})") from e
    except (KeyError, TypeError):
        return None
    scores = sum(v for k, v in body.items() if "scores" in k)
    return {"body_weights": sum(body.values()) - scores, "body_scores": scores, "head": 2 * d * num_labels}


def method_flops(forward: Mapping, method: str, method_forward: float = 0.0) -> dict:
    """Training FLOPs per token of fine-tuning with `method`: each part of the classifier's
    `forward` (`finetune_forward_flops`) times its passes (`PASSES`), `method_forward` the forward
    FLOPs per token of the matrices the method adds (`method_forward_flops`: LoRA's A and B, the
    adapters), plus `total`, the method, its passes and the forward parts."""
    if method not in PASSES:
        raise KeyError(f"no FLOPs passes for fine-tuning method {method!r} (known: {', '.join(PASSES)})")
    passes = PASSES[method]
    fwd = {k: float(forward[k]) for k in ("body_weights", "body_scores", "head")}
    fwd["method_modules"] = float(method_forward)
    parts = {k: passes[k] * v for k, v in fwd.items()}
    return {**parts, "total": sum(parts.values()), "method": method, "passes": dict(passes), "forward": fwd}


def finetune_flops(family: str, model_config: Mapping, seq_len: int, num_labels: int, method: str = "full",
                   method_forward: float = 0.0, classifier: str | None = None) -> dict | None:
    """`method_flops` of a classifier's `finetune_forward_flops` (of kind `classifier`); None when the
    body is not counted."""
    fwd = finetune_forward_flops(family, model_config, seq_len, num_labels, classifier)
    return None if fwd is None else method_flops(fwd, method, method_forward)


def finetune_flops_per_token(family: str, model_config: Mapping, seq_len: int, num_labels: int,
                             method: str = "full", method_forward: float = 0.0,
                             classifier: str | None = None) -> float | None:
    """Training FLOPs per token of fine-tuning a classifier (`finetune_flops`'s total; full
    fine-tuning: the body plus a linear head on every token, x 3). None when the body's shape is not
    one this module counts (the caller then records the FLOPs as unknown)."""
    out = finetune_flops(family, model_config, seq_len, num_labels, method, method_forward, classifier)
    return None if out is None else out["total"]


def method_forward_flops(model) -> float:
    """Forward FLOPs per token of the trainable matrices inside a classifier's body after a
    parameter-efficient method is attached (`workbench.running.peft_methods.attach`, then the parameter
    filter applied): 2 x the weights of every trainable `nn.Linear` of the body, each applied once
    per token (LoRA's A and B, the adapters' down and up projections). 0 for head, BitFit and
    prompt tuning (no trainable matrix in the body); not meant for full fine-tuning (every body
    matrix trains, counted by `finetune_flops`)."""
    from torch import nn

    body = getattr(model, getattr(model, "base_model_prefix", ""), model)
    # a pooler (BERT's, trainable under some methods) runs once per sequence: left out, as every
    # per-sequence head
    return float(sum(2 * m.weight.numel() for name, m in body.named_modules()
                     if isinstance(m, nn.Linear) and m.weight.requires_grad and "pooler" not in name))


def with_method_modules(basis: Mapping, model) -> dict:
    """A fine-tuning cost basis (`workbench.drivers.finetune.finetune_cost_basis`: `flops` from
    `finetune_flops`) with the attached method's own matrices counted (`method_forward_flops` of
    `model`); recomputed from the forward parts, so calling it again gives the same record."""
    basis = dict(basis)
    flops = basis.get("flops")
    if not flops or flops["method"] in ("full", "head"):
        return basis
    basis["flops"] = method_flops(flops["forward"], flops["method"], method_forward_flops(model))
    basis["flops_per_token"] = basis["flops"]["total"]
    return basis


def teacher_forward_flops_per_token(teacher: str | Path | None, seq_len: int) -> float | None:
    """Forward FLOPs per token of a fine-tuned classifier teacher (task distillation) at attention
    span `seq_len`, read from its folder (manifest family, classifier kind (`pooling`) and labels,
    config.json); None when it cannot be read."""
    tm = _teacher_manifest(teacher)
    if not tm or not tm.get("model_config") or not tm.get("family"):
        return None
    fwd = finetune_forward_flops(tm["family"], tm["model_config"], seq_len, len(tm.get("label_names") or [0, 1]),
                                 tm.get("pooling"))
    return None if fwd is None else float(sum(fwd.values()))


def finetune_cost_flops(basis: Mapping, tokens: int, teacher: str | Path | None = None,
                        teacher_tokens_: int | None = None) -> float | None:
    """A fine-tuning run's own training FLOPs: its cost basis's FLOPs per token x `tokens`, plus,
    for a distillation student, the teacher's forwards (`teacher_forward_flops_per_token` at the
    run's mean length x the tokens the teacher ran on, `teacher_tokens_`, default `tokens`). None
    when either is unknown."""
    fpt = basis.get("flops_per_token")
    if fpt is None:
        return None
    flops = fpt * tokens
    if teacher is None:
        return flops
    t_fpt = teacher_forward_flops_per_token(teacher, max(1, round(basis.get("mean_train_length") or 1)))
    return None if t_fpt is None else flops + t_fpt * (tokens if teacher_tokens_ is None else teacher_tokens_)


def teacher_tokens(teacher_module, tokens: int, epochs_done: int) -> int:
    """Tokens a distillation teacher ran on while a student trained on `tokens` over `epochs_done`
    full epochs: all of them, or, for a teacher that keeps its logits per example
    (`workbench.drivers.distill.CachedTeacher`, which has a `cache`), one epoch's (each example once)."""
    if getattr(teacher_module, "cache", None) is not None and epochs_done > 0:
        return int(round(tokens / epochs_done))
    return int(tokens)


# ---------------------------------------------------------------------------------- device and energy

def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}: not a number: {raw!r}") from None
    if not value > 0:
        raise ValueError(f"environment variable {name}: must be > 0, got {raw!r}")
    return value


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_info(device) -> dict:
    """{"kind": "cpu"|"cuda", "name": model name, "count": devices, "threads": torch threads}."""
    import torch

    kind = getattr(device, "type", str(device)).split(":")[0]
    if kind == "cuda":
        index = getattr(device, "index", None) or 0
        return {"kind": "cuda", "name": torch.cuda.get_device_name(index), "count": 1}
    return {"kind": "cpu", "name": cpu_name(), "count": 1, "threads": torch.get_num_threads()}


def _rapl_files() -> list[Path]:
    # package-level domains only (intel-rapl:0, intel-rapl:1): their sub-domains are inside them
    return [Path(p) for p in sorted(glob.glob("/sys/class/powercap/intel-rapl:[0-9]*/energy_uj"))
            if Path(p).parent.name.count(":") == 1]


class EnergyMeter:
    """Device energy since the meter was made (joules): NVML or RAPL counters when readable, else
    estimated (module docstring). `already_joules`: what a resumed run had used before (carried
    from the resumed checkpoint's record)."""

    def __init__(self, device_info_: Mapping, already_joules: float | None = None):
        self.info = dict(device_info_)
        self.source: str | None = None
        self._read = None
        self.already = already_joules or 0.0
        if self.info.get("kind") == "cuda":
            try:  # pragma: no cover - needs an NVIDIA GPU
                import pynvml

                pynvml.nvmlInit()
                h = pynvml.nvmlDeviceGetHandleByIndex(0)
                pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                self._read, self.source = (lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0), "measured: nvml"
            except Exception:  # no pynvml, no permission, or an older GPU without the counter
                self._read = None
        else:
            files = _rapl_files()
            try:
                if files:
                    [int(f.read_text()) for f in files]
                    self._read, self.source = (lambda: sum(int(f.read_text()) for f in files) / 1e6), "measured: rapl"
            except (OSError, ValueError):
                self._read = None
        self._start = self._read() if self._read else None
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()

    def reading(self) -> tuple[float, str]:
        """(device energy in joules since the start, resumed part included; where it comes from)."""
        carried = " (+ the resumed run's earlier energy)" if self.already else ""
        if self._read is not None:
            return self.already + (self._read() - self._start), self.source + carried
        if self.info.get("kind") == "cuda":
            w = _env_float("BERTOLOGY_GPU_WATTS", DEFAULT_GPU_WATTS) * self.info.get("count", 1)
            return self.already + w * (time.perf_counter() - self._t0), f"estimated: {w:g} W (GPU) x wall time" + carried
        w = _env_float("BERTOLOGY_CPU_WATTS_PER_CORE", DEFAULT_CPU_WATTS_PER_CORE)
        return (self.already + w * (time.process_time() - self._cpu0),
                f"estimated: {w:g} W per busy core x process CPU seconds" + carried)


def own_cost(*, flops: float | None, flops_per_token: float | None, tokens: int | None, seconds: float,
             device: Mapping, energy_joules: float, energy_source: str, what: str,
             kaplan_per_token: float | None = None) -> dict:
    """One checkpoint's own cost record (see the module docstring); `kaplan_per_token` is
    `kaplan_flops_per_token` of what trained (None: unknown), kept beside the full count."""
    pue = _env_float("BERTOLOGY_PUE", DEFAULT_PUE)
    grid = _env_float("BERTOLOGY_GRID_GCO2_PER_KWH", DEFAULT_GRID_G_PER_KWH)
    kwh = energy_joules / 3.6e6 * pue
    return {
        "what": what,
        "flops": None if flops is None else float(flops),
        "flops_per_token": None if flops_per_token is None else float(flops_per_token),
        "kaplan_flops_per_token": None if kaplan_per_token is None else float(kaplan_per_token),
        "kaplan_flops": None if kaplan_per_token is None or tokens is None else float(kaplan_per_token) * tokens,
        "tokens": tokens,
        "seconds": round(float(seconds), 3),
        "device": dict(device),
        "device_hours": float(seconds) * device.get("count", 1) / 3600.0,
        "energy_joules_device": float(energy_joules),  # before PUE: what a resumed run carries on
        "energy_kwh": kwh,
        "energy_source": energy_source,
        "pue": pue,
        "grid_gco2_per_kwh": grid,
        "co2e_kg": kwh * grid / 1000.0,
    }


def totals(own: Mapping, parent_total: Mapping | None) -> dict:
    """own + the parent's total per key; a None anywhere (unknown) makes that total None, and
    `known` says whether every ancestor's cost was known."""
    known = (bool(own.get("known", True)) and own.get("flops") is not None
             and (parent_total is None or bool(parent_total.get("known"))))
    out: dict[str, Any] = {}
    for k in TOTAL_KEYS:
        a = own.get(k)
        b = 0.0 if parent_total is None else parent_total.get(k)
        out[k] = None if a is None or b is None else float(a) + float(b)
    out["known"] = known
    return out


def cost_record(own: Mapping, parent: str | Path | None, teacher: str | Path | None = None) -> dict:
    """The manifest's `cost`: own, parent (folder + its total, read from its manifest or
    reconstructed: `checkpoint_cost`), total = own + parent's total. A distillation teacher's total
    is added too (`teacher`): the student could not exist without it (its forward passes during
    distillation are in the run's time and energy, not in `own.flops`, which counts the student),
    once: a student initialised from the teacher's layers has the teacher in its lineage already,
    so the parent's total holds it (`in_parent_total: true`)."""
    ancestors: dict | None = None
    out: dict[str, Any] = {"own": dict(own), "parent": None}
    for role, folder in (("parent", parent), ("teacher", teacher)):
        if folder is None:
            continue
        try:
            t = checkpoint_cost(folder)["total"]
        except Exception:  # noqa: BLE001 - a folder that is gone: its cost is unknown, never zero
            t = dict(UNKNOWN_TOTAL)
        out[role] = {"checkpoint": str(folder), "total": t}
        if role == "teacher" and parent is not None and _in_lineage(folder, parent):
            out[role]["in_parent_total"] = True
            continue
        ancestors = t if ancestors is None else totals(t, ancestors)
    out["total"] = totals(own, ancestors)
    return out


def _in_lineage(folder: str | Path, descendant: str | Path) -> bool:
    """Whether `folder` is `descendant` or one of its ancestors (`lineage_chain`), compared as
    resolved paths (a Hub name through the local cache), so two spellings of one folder match."""
    from workbench.store.checkpoints import resolve_checkpoint

    def key(item) -> str:
        try:
            return str(Path(resolve_checkpoint(item)).resolve())
        except Exception:  # noqa: BLE001 - an ancestor that is gone: compare it as recorded
            return str(item)

    return key(folder) in {key(a) for a in lineage_chain(descendant)}


def teacher_folder(hooks_description: Mapping | None) -> str | None:
    """The distillation teacher's checkpoint folder or Hub name from `TrainingHooks.describe()`, if any."""
    name = ((hooks_description or {}).get("teacher") or {}).get("name_or_path")
    return str(name) if name else None


def derived_cost(parent_manifest: Mapping | None, parent_folder: str | None, transform: str,
                 fresh_weights: bool = False) -> dict:
    """Cost of a model made by a transform (`ModelHandle.derive` + `save`): no training of its own
    (zero FLOPs, a known zero), plus its parent's total unless the weights are fresh."""
    own = {"what": f"transform {transform} (no training)", "flops": 0.0, "flops_per_token": None,
           "kaplan_flops": 0.0, "kaplan_flops_per_token": None, "tokens": 0,
           "seconds": 0.0, "device": None, "device_hours": 0.0, "energy_kwh": 0.0, "energy_source": "none",
           "co2e_kg": 0.0}
    if fresh_weights:
        return {"own": own, "parent": None, "total": totals(own, None)}
    parent_total = cost_of_manifest(parent_manifest or {}, parent_folder)["total"]
    return {"own": own, "parent": {"checkpoint": parent_folder, "total": parent_total},
            "total": totals(own, parent_total)}


def add_retraining(folder: str | Path, own: Mapping | None, prior: str | Path | None = None,
                   search: Sequence[str | Path] = ()) -> dict:
    """Rewrite a derived checkpoint's cost (`derived_cost`, own = 0) for a transform followed by
    training, e.g. a lottery ticket (pruned, rewound, retrained: `workbench.drivers.prune_sweep`): own =
    that training's own record (unknown when None), total = own + the total of `prior` (the
    checkpoint whose weights the mask was found in: an earlier IMP round, which holds the rounds
    before it) plus the own cost of every run in `search` (training after `prior` that found the
    mask: a pretraining ticket's masked-LM rounds, Chen et al. 2020) or, without a prior, the
    derivation's parent's total. Returns the new record."""
    from workbench.store.checkpoints import read_manifest
    from workbench.io import atomic_write_json

    folder = Path(folder)
    manifest = read_manifest(folder) or {}
    rec = dict(manifest.get("cost") or {})
    own = dict(own) if own is not None else {"what": "retraining (cost not recorded)", "flops": None, "known": False}
    rec["own"] = {**own, "what": f"{own.get('what', 'training')} after {(rec.get('own') or {}).get('what', 'a transform')}"}
    base = (rec.get("parent") or {}).get("total")
    if prior is not None:
        try:
            base = checkpoint_cost(prior)["total"]
            for run in search:
                base = totals(checkpoint_cost(run)["own"], base)
        except Exception:  # noqa: BLE001 - gone: unknown, never zero
            base = dict(UNKNOWN_TOTAL)
        rec["prior"] = {"checkpoint": str(prior), "total": base}
        if search:
            rec["prior"]["search"] = [str(run) for run in search]
    rec["total"] = totals(rec["own"], base)
    atomic_write_json(folder / "manifest.json", {**manifest, "cost": rec})
    return rec


UNKNOWN_TOTAL = {**{k: None for k in TOTAL_KEYS}, "known": False}


def manifest_kaplan_per_token(manifest: Mapping, folder: str | Path | None = None) -> float | None:
    """`kaplan_flops_per_token` of the model a checkpoint's own training trained: its family and
    shape (the manifest's `model_config`, else the folder's config.json) and, for a fine-tuned
    classifier, the kind that ran (`pooling`; "token" for token tasks). A distillation teacher's
    forwards are in `flops`, not here: 6ND is the trained model's."""
    family, mc = manifest.get("family"), manifest.get("model_config")
    if mc is None and folder is not None:
        mc = _read_json(Path(folder) / "config.json")
    if not family or not mc:
        return None
    classifier = manifest.get("pooling") if manifest.get("kind") == "finetune" else None
    try:
        return kaplan_flops_per_token(family, mc, classifier)
    except KeyError:  # a classifier kind this module does not count: unknown, never zero
        return None


def with_kaplan(record: Mapping, manifest: Mapping, folder: str | Path | None = None) -> dict:
    """A stored cost record with `kaplan_flops` (own and total) filled in where it was written
    before the figure existed: own from the manifest (`manifest_kaplan_per_token` x own tokens; 0 for
    a transform, which trains nothing), total = own + the totals its record adds (the parent's, or
    a retrained ticket's prior and search runs, and a teacher not already in the lineage), each read
    again through `checkpoint_cost` so that they are filled in too. A record that has it is
    returned as it is."""
    rec = dict(record)
    if "kaplan_flops" in (rec.get("total") or {}):
        return rec
    own = dict(rec.get("own") or {})
    if "kaplan_flops" not in own:
        if own.get("flops") == 0.0 and not own.get("tokens"):
            own.update(kaplan_flops=0.0, kaplan_flops_per_token=None)
        else:
            kpt = manifest_kaplan_per_token(manifest, folder)
            tokens = own.get("tokens")
            own.update(kaplan_flops_per_token=kpt, kaplan_flops=None if kpt is None or tokens is None else kpt * tokens)
    rec["own"] = own

    def total_of(folder_) -> float | None:
        try:
            return checkpoint_cost(folder_)["total"].get("kaplan_flops")
        except Exception:  # noqa: BLE001 - a folder that is gone: unknown, never zero
            return None

    parts = [own.get("kaplan_flops")]
    prior = rec.get("prior")
    if prior:
        parts.append(total_of(prior["checkpoint"]))
        for run in prior.get("search") or []:
            try:
                parts.append(checkpoint_cost(run)["own"].get("kaplan_flops"))
            except Exception:  # noqa: BLE001
                parts.append(None)
    elif rec.get("parent"):
        parts.append(total_of(rec["parent"]["checkpoint"]))
    teacher = rec.get("teacher")
    if teacher and not teacher.get("in_parent_total"):
        parts.append(total_of(teacher["checkpoint"]))
    total = dict(rec.get("total") or {})
    total["kaplan_flops"] = None if any(v is None for v in parts) else float(sum(parts))
    rec["total"] = total
    return rec


def cost_of_manifest(manifest: Mapping, folder: str | Path | None = None) -> dict:
    """A checkpoint's cost record: the manifest's own `cost`, or, for checkpoints written before
    costs were recorded, one reconstructed from the training record (FLOPs from family, model
    config, vocabulary, max_len and tokens_seen; energy estimated from elapsed_seconds, the device
    unknown), else unknown (None values, `known: false`; never zero)."""
    if manifest.get("cost"):
        return with_kaplan(manifest["cost"], manifest, folder)
    family, mc = manifest.get("family"), manifest.get("model_config")
    tokens, seconds = manifest.get("tokens_seen"), manifest.get("elapsed_seconds")
    vocab = (manifest.get("tokenizer") or {}).get("vocab_size")
    max_len = (manifest.get("config") or {}).get("max_len")
    if manifest.get("kind") != "finetune" and family_flops(family) is not None and mc and tokens is not None and vocab and max_len:
        fpt = training_flops_per_token({**manifest, "config": {**(manifest.get("config") or {}), "max_len": max_len}})["total"]
        device = {"kind": "unknown", "name": "unknown (checkpoint written before costs were recorded)",
                  "count": int(manifest.get("world_size") or 1), "threads": 1}
        seconds = float(seconds or 0.0)
        w = _env_float("BERTOLOGY_CPU_WATTS_PER_CORE", DEFAULT_CPU_WATTS_PER_CORE)
        own = own_cost(flops=None if fpt is None else fpt * tokens, flops_per_token=fpt, tokens=int(tokens),
                       seconds=seconds, device=device,
                       energy_joules=w * seconds,
                       energy_source=f"estimated after the fact: {w:g} W (one busy core assumed) x elapsed_seconds",
                       what="pretraining (reconstructed from the manifest)",
                       kaplan_per_token=manifest_kaplan_per_token(manifest, folder))
        return {"own": own, "parent": None, "total": totals(own, None), "reconstructed": True}
    return {"own": None, "parent": None, "total": dict(UNKNOWN_TOTAL),
            "unknown": "no cost record and no training record to compute one from (e.g. a Hub model trained elsewhere)"}


def checkpoint_cost(folder: str | Path) -> dict:
    """`cost_of_manifest` of a checkpoint folder (a Hub name resolves through the HF cache)."""
    from workbench.store.checkpoints import read_manifest, resolve_checkpoint

    path = resolve_checkpoint(folder)
    return cost_of_manifest(read_manifest(path) or {}, path)


def lineage_chain(folder: str | Path) -> list[str]:
    """The checkpoint and its ancestors, newest first, as the cost records name them."""
    chain, seen = [], set()
    cur: str | None = str(folder)
    while cur is not None and cur not in seen:
        seen.add(cur)
        chain.append(cur)
        try:
            cost = checkpoint_cost(cur)
        except Exception:  # an ancestor that is gone: the chain ends there
            break
        cur = (cost.get("parent") or {}).get("checkpoint")
    return chain


def cost_targets(items: list[str]) -> list[Path]:
    """Checkpoint folders to cost: a checkpoint itself; a training folder -> the last step of each
    seed; a fine-tuning run folder -> each seed's `best/`. A CheckpointError names a path that is
    none of these (before any work)."""
    from workbench.store.checkpoints import list_steps, resolve_checkpoint
    from workbench.errors import CheckpointError

    out: list[Path] = []
    for item in items:
        path = resolve_checkpoint(item)
        # a fine-tuning run folder holds a config.json of its own: look for its best/ folders first
        best = sorted(p for p in path.glob("seed-*/best") if (p / "config.json").is_file())
        if (path / "best" / "config.json").is_file():
            best = [path / "best"]
        if best:
            out.extend(best)
            continue
        if (path / "config.json").is_file():
            out.append(path)
            continue
        last: dict[Path, Path] = {}
        for _, p in list_steps(path):
            last[p.parent] = p  # steps come in order: the last one per seed folder stays
        if not last:
            raise CheckpointError(f"{path}: not a checkpoint, a training folder or a fine-tuning run folder")
        out.extend(last.values())
    return out


def display_name(path: Path) -> str:
    """A checkpoint's name in tables: `<run>/seed-S/best` for a fine-tuned best folder."""
    from workbench.store.checkpoints import checkpoint_name

    path = Path(path)
    if path.name == "best" and path.parent.name.startswith("seed-"):
        return f"{path.parent.parent.name}/{path.parent.name}/best"
    return checkpoint_name(path) if path.exists() else str(path)


def format_cost_table(folders: list[str], grid: float | None = None) -> str:
    """Strubell et al. (2019) Table 3's shape: model, hardware, then own and lineage-total FLOPs,
    device-hours, kWh (PUE included) and CO2e, where the energy comes from, and the parent chain.
    `grid` (gCO2/kWh) re-expresses CO2e from the recorded kWh."""
    from workbench.store.checkpoints import resolve_checkpoint

    def num(x, fmt):
        return "unknown" if x is None else format(x, fmt)

    def co2(part):
        if grid is not None and part.get("energy_kwh") is not None:
            return part["energy_kwh"] * grid / 1000.0
        return part.get("co2e_kg")

    head = (f"{'model':<40} {'hardware':<22} {'FLOPs':>9} {'dev-h':>7} {'kWh':>9} {'CO2e kg':>9} | "
            f"{'total FLOPs':>11} {'6ND':>9} {'dev-h':>7} {'kWh':>9} {'CO2e kg':>9}  energy     lineage (parent first)")
    lines = [head, "-" * len(head)]
    for f in folders:
        path = resolve_checkpoint(f)
        cost = checkpoint_cost(path)
        own, total = cost.get("own") or {}, cost["total"]
        dev = own.get("device") or {}
        hw = f"{dev.get('kind')}: {dev.get('name')}"[:22] if dev else "-"
        source = (own.get("energy_source") or "unknown").split(":")[0].replace("estimated after the fact", "estimated")
        if cost.get("reconstructed"):
            source = "estimated*"
        if cost.get("unknown"):
            chain = "(cost unknown: trained elsewhere, no record)"
        else:
            chain = " <- ".join(display_name(Path(p)) for p in lineage_chain(path)[1:]) or "(trained here from scratch)"
        lines.append(f"{display_name(path)[:40]:<40} {hw:<22} {num(own.get('flops'), '.3g'):>9} "
                     f"{num(own.get('device_hours'), '.4f'):>7} {num(own.get('energy_kwh'), '.3g'):>9} "
                     f"{num(co2(own), '.3g'):>9} | {num(total.get('flops'), '.3g'):>11} "
                     f"{num(total.get('kaplan_flops'), '.3g'):>9} "
                     f"{num(total.get('device_hours'), '.4f'):>7} {num(total.get('energy_kwh'), '.3g'):>9} "
                     f"{num(co2(total), '.3g'):>9}  {source:<10} {chain}")
    pue = _env_float("BERTOLOGY_PUE", DEFAULT_PUE)
    g = f"{grid:g} gCO2/kWh" if grid is not None else "the recorded grid intensity"
    lines.append(f"kWh include a PUE of {pue:g} (Strubell et al. 2019); CO2e at {g}; total = own + the parent's total; "
                 f"'unknown' = not knowable (never counted as zero); estimated* = reconstructed from an old manifest.")
    lines.append("FLOPs: every matmul the steps compute (attention scores and heads included); 6ND: Kaplan et al. "
                 "(2020)'s C = 6 x non-embedding parameters x tokens, the figure their compute laws use.")
    return "\n".join(lines)


# The `extra` of `cost_rows` (checked by the results store, `workbench.store.rowschema`).
EXTRA_SCHEMAS = (
    RowSchema("cost", "training cost", required={
        "path": str, "hardware": str | None, "untracked": bool, "energy_source": str, "known": bool, "lineage": list,
        "reconstructed": bool, "grid_gco2_per_kwh": float | None, "pue": float | None}),
)


def cost_rows(folders: list[str | Path]) -> list[dict]:
    """The cost of each checkpoint as results-store rows (probe "cost", task "training_cost"):
    one row per (own | total) x (flops, device_hours, energy_kwh, co2e_kg); an unknown value is
    NaN with `known: false` in extra (never 0). Model names are the workbench's checkpoint names,
    so the rows join with probe rows of the same checkpoints (score vs FLOPs)."""
    from workbench.store.checkpoints import read_manifest, resolve_checkpoint

    rows = []
    for f in folders:
        path = resolve_checkpoint(f)
        manifest = read_manifest(path) or {}
        cost = cost_of_manifest(manifest, path)
        own, total = cost.get("own") or {}, cost["total"]
        dev = own.get("device") or {}
        hardware = (f"{dev.get('kind')}: {dev.get('name')}" if dev else
                    "none (a transform, no training)" if str(own.get("what", "")).startswith("transform") else None)
        extra = {"path": str(path), "hardware": hardware, "untracked": bool(cost.get("unknown")),
                 "energy_source": own.get("energy_source") or "unknown", "known": bool(total.get("known")),
                 "lineage": [display_name(Path(p)) for p in lineage_chain(path)[1:]],
                 "reconstructed": bool(cost.get("reconstructed")), "grid_gco2_per_kwh": own.get("grid_gco2_per_kwh"),
                 "pue": own.get("pue")}
        for split, part in (("own", own), ("total", total)):
            for k in TOTAL_KEYS:
                v = part.get(k)
                rows.append({"model": display_name(path), "family": manifest.get("family"), "probe": "cost",
                             "task": "training_cost", "split": split, "metric": k,
                             "value": float("nan") if v is None else float(v),
                             "step": manifest.get("step"), "seed": manifest.get("seed"), "extra": extra})
    return rows


def record_costs(folders: list[str | Path], store=None, name: str | None = None) -> str:
    """Write `cost_rows` as one results-store run (kind "cost"); returns its run id."""
    from workbench.store.results import ResultsStore

    store = store or ResultsStore()
    with store.start_run("cost", {"checkpoints": [str(f) for f in folders]}, checkpoints=[Path(f) for f in folders],
                         name=name or "cost") as writer:
        writer.add(cost_rows(folders))
        run_id = writer.run_id
    return run_id


def dumps(record: Mapping) -> str:
    return json.dumps(record, indent=2, sort_keys=True)
