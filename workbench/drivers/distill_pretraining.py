"""Pretraining distillation, DistilBERT-style (Sanh et al. 2019): a student with fewer layers learns
the masked LM from a teacher trained here, through the one pretraining loop (`workbench.drivers.train`).

The student is the teacher's family and shape with `depth` layers (default half the teacher's),
initialised from the teacher's layers (`workbench.drivers.distill.student_layers`: evenly spread, first
and last kept; DistilBERT's [0, 2, 4, 7, 9, 11] for 12 -> 6; embeddings and the MLM head copied)
or randomly (the training loop's own initialisation under the seed). It trains on the teacher's
corpus, tokenizer and masking (the teacher's training config, depth and length changed) with
DistilBERT's triple loss (`TripleLoss`), the weights of its training script:

    loss = alpha_ce * T^2 * KL(softmax(t / T) || softmax(s / T))    every non-pad token (batch mean), T = 2
         + alpha_mlm * CE(masked tokens, s)                          the student's own MLM loss
         + alpha_cos * mean(1 - cos(h_s, h_t))                       last hidden states, every non-pad token

with alpha_ce 5.0, alpha_mlm 2.0, alpha_cos 1.0. The soft-target term is the reference
`distiller.py`'s (Sanh et al. 2019, the authors' code in transformers' examples/research_projects/
distillation): KLDivLoss(reduction="batchmean") of the student's log-softmax against the teacher's
softmax at temperature T, over the positions the attention mask selects (every non-pad token,
[CLS] and [SEP] included; one row per position, so "batchmean" is the mean over those positions),
times T^2. Its `--restrict_ce_to_mask` (off by default) keeps only the masked positions;
`restrict_soft_loss_to_mask: true` here does the same (about 15% of the tokens; this module's only
behaviour before issue 40). The teacher runs on the same batch (same masks) as the student
(`workbench.loop.TrainingHooks`: teacher, loss, and `initial` for the weights); the logits at
unmasked positions come from the MLM head each pretrainer hands over in `extra["mlm_head"]`.

The student of a BERT teacher is trained as the `distilbert` family (`FamilySpec.distill_student`): a
`DistilBertForMaskedLM` (no token types, no pooler, masked LM only on `[CLS] block [SEP]`
sequences), initialised from the teacher's layers through `bert_to_distilbert` (exact on
one-segment inputs), so its checkpoints are DistilBERT checkpoints from the first step; the BERT
teacher reads the same batches as one segment (`OneSegmentTeacher`). A student of another family
(the DeBERTa-style reference encoder) stays in its family with fewer layers.

Result: each student's held-out MLM loss on the fixed held-out batches of `train.evaluate_heldout`
(the same batches, built by the student's family, for teacher and students), rows with probe
"distill", task "mlm". Every student is a plain training run folder
(`<runs>/train/<name>-L<depth>-<init>/seed-S/step-N`), so every probe reads it as any other model.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from workbench.drivers.distill import INITS, cut_student, student_layers
from workbench.drivers.spec import NOT_IDENTITY, DriverSpec
from workbench.coerce import load_config
from workbench.errors import ConfigError
from workbench.loop import TrainingHooks, kl_to_teacher

PROBE = "distill"
# its rows' `extra` (teacher and students' held-out MLM loss) is declared with the task
# distillation's, `workbench.drivers.distill.EXTRA_SCHEMAS`: one home for the producer "distill".


def teacher_families() -> list[str]:
    """Families whose pretrainers' outputs carry the masked logits and hidden states (BERT, DeBERTa,
    DistilBERT): those naming a student family (`FamilySpec.distill_student`)."""
    from workbench.families import available_families, get_family

    return [n for n in available_families() if get_family(n).distill_student is not None]


def student_family(teacher: str) -> str:
    """The student's family of a `teacher` family (`FamilySpec.distill_student`: a BERT's is a DistilBERT)."""
    from workbench.families import get_family

    return get_family(teacher).distill_student or teacher


class TripleLoss:
    """DistilBERT's loss (module docstring) over the outputs of two pretrainers: `extra["hidden"]`
    (last layer), `extra["mlm_head"]` (hidden -> vocabulary logits), `extra["logits"]` (the head at
    the masked positions), the student's `loss` being its MLM CE.

    The soft-target term covers every non-pad token (the reference's default); with
    `restrict_soft_loss_to_mask` only the masked positions (`--restrict_ce_to_mask`)."""

    def __init__(self, temperature: float = 2.0, alpha_ce: float = 5.0, alpha_mlm: float = 2.0,
                 alpha_cos: float = 1.0, record: dict | None = None, restrict_soft_loss_to_mask: bool = False):
        if not temperature > 0:
            raise ConfigError(f"distill: temperature must be > 0, got {temperature}")
        if min(alpha_ce, alpha_mlm, alpha_cos) < 0 or alpha_ce + alpha_mlm + alpha_cos == 0:
            raise ConfigError(f"distill: the loss weights must be >= 0 and not all 0, got "
                              f"{alpha_ce}, {alpha_mlm}, {alpha_cos}")
        self.temperature, self.alpha_ce, self.alpha_mlm, self.alpha_cos = (float(temperature), float(alpha_ce),
                                                                           float(alpha_mlm), float(alpha_cos))
        self.restrict_soft_loss_to_mask = bool(restrict_soft_loss_to_mask)
        self.record = dict(record or {})

    def soft_logits(self, student, batch, teacher) -> tuple[torch.Tensor, torch.Tensor]:
        """(student, teacher) logits at the positions of the soft-target term, one row each: the
        masked positions (what the pretrainers return) or every non-pad token (the MLM head applied
        to the last hidden states there; the teacher's under no_grad, as its forward)."""
        if self.restrict_soft_loss_to_mask:
            return student.extra["logits"], teacher.extra["logits"]
        keep = batch["attention_mask"].bool()
        s = student.extra["mlm_head"](student.extra["hidden"][keep])
        with torch.no_grad():
            t = teacher.extra["mlm_head"](teacher.extra["hidden"][keep])
        return s, t

    def __call__(self, student, batch, teacher) -> dict[str, torch.Tensor]:
        ce = kl_to_teacher(*self.soft_logits(student, batch, teacher), self.temperature)
        mlm = student.loss
        keep = batch["attention_mask"].bool()
        cos = (1 - F.cosine_similarity(student.extra["hidden"][keep].float(), teacher.extra["hidden"][keep].float(),
                                       dim=-1)).mean()
        loss = self.alpha_ce * ce + self.alpha_mlm * mlm + self.alpha_cos * cos
        return {"loss": loss, "ce": ce.detach(), "mlm": mlm.detach(), "cos": cos.detach()}

    def describe(self) -> dict:
        return {"name": "distilbert_triple", "temperature": self.temperature, "alpha_ce": self.alpha_ce,
                "alpha_mlm": self.alpha_mlm, "alpha_cos": self.alpha_cos,
                "soft_loss_positions": "masked" if self.restrict_soft_loss_to_mask else "non_pad", **self.record}


class TeacherLayers:
    """The `initial` hook: the built student's weights set to the teacher's chosen layers (through
    the student family's `FamilySpec.teacher_converters` where the teacher is another architecture:
    `bert_to_distilbert` when a BERT teacher's student is a DistilBERT)."""

    def __init__(self, teacher_model, layers: list[int], record: dict):
        self.teacher_model, self.layers, self.record = teacher_model, list(layers), record

    def __call__(self, student_module) -> None:
        inner = student_module.model  # the pretrainer's transformers model
        cut = cut_student(self.teacher_model, self.layers)
        if inner.config.model_type != cut.config.model_type:  # FamilySpec.teacher_converters (a BERT's to a DistilBERT)
            from workbench.families import family_of_model_type

            student = family_of_model_type(inner.config.model_type, primary=True)
            convert = None if student is None else student.teacher_converters.get(cut.config.model_type)
            if convert is not None:
                cut = convert(cut)
        inner.load_state_dict(cut.state_dict(), strict=True)

    def describe(self) -> dict:
        return {"name": "teacher_layers", "teacher_layers": self.layers, **self.record}


class OneSegmentTeacher(torch.nn.Module):
    """A BERT pretrainer reading a DistilBERT student's batches (no `token_type_ids`) as one segment,
    the input on which its DistilBERT conversion is exact; its loss is then the MLM loss alone."""

    def __init__(self, teacher):
        super().__init__()
        self.teacher = teacher

    @property
    def config(self):
        """The teacher's config: `TrainingHooks.describe` records its folder (`_name_or_path`) from
        it, and the student's cost record adds the teacher's cost and forwards from that folder."""
        return self.teacher.config

    def forward(self, input_ids, attention_mask, labels, **_):
        return self.teacher(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                            token_type_ids=torch.zeros_like(input_ids))


@dataclass
class PretrainDistillConfig:
    """A pretraining-distillation sweep (`bertology distill CONFIG.yaml` with `kind: pretraining`)."""

    teacher: str                                   # a checkpoint folder of a run trained here (train/<name>/seed-S/step-N)
    kind: str = "pretraining"
    name: str | None = field(default=None, metadata=NOT_IDENTITY)  # student runs: <name>-L<depth>-<init>; default <teacher run>-distil
    depths: list[int] | None = None                # default [half the teacher's layers]
    inits: list[str] = field(default_factory=lambda: ["teacher", "random"])
    seeds: list[int] = field(default_factory=lambda: [0])
    steps: int = 256                               # optimizer steps of each student
    lr: float | None = None                        # default: the teacher's
    warmup: int | None = None                      # default: the teacher's, capped at steps // 4
    temperature: float = 2.0
    alpha_ce: float = 5.0
    alpha_mlm: float = 2.0
    alpha_cos: float = 1.0
    restrict_soft_loss_to_mask: bool = False       # true: soft-target term at the masked positions only (distiller.py's --restrict_ce_to_mask)
    heldout_batches: int = 32                      # fixed held-out batches for teacher and students
    device: str = field(default="auto", metadata=NOT_IDENTITY)
    progress: bool = field(default=True, metadata=NOT_IDENTITY)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_pretrain_distill_config(source: str | Path | dict, overrides: dict | None = None) -> PretrainDistillConfig:
    """A validated config (YAML file or dict, `overrides` by `workbench.coerce.load_config`'s rule),
    the teacher checked, before any work."""
    cfg, where = load_config(PretrainDistillConfig, source, overrides, label="distill config")

    def fail(key, msg):
        raise ConfigError(f"{where}: {key}: {msg}")

    if cfg.kind != "pretraining":
        fail("kind", f"must be pretraining here, got {cfg.kind!r}")
    if not (cfg.temperature > 0 and math.isfinite(cfg.temperature)):
        fail("temperature", f"must be > 0, got {cfg.temperature}")
    for key in ("alpha_ce", "alpha_mlm", "alpha_cos"):
        if getattr(cfg, key) < 0:
            fail(key, f"must be >= 0, got {getattr(cfg, key)}")
    if cfg.alpha_ce + cfg.alpha_mlm + cfg.alpha_cos == 0:
        fail("alpha_ce", "the three loss weights are all 0")
    for i in cfg.inits:
        if i not in INITS:
            fail("inits", f"unknown init {i!r} (known: {', '.join(INITS)})")
    for key in ("steps", "heldout_batches"):
        if getattr(cfg, key) < 1:
            fail(key, f"must be >= 1, got {getattr(cfg, key)}")
    folder = Path(cfg.teacher).expanduser()
    manifest = _read_manifest(folder)
    if manifest is None or "config" not in manifest or manifest.get("family") is None:
        fail("teacher", f"{folder}: not a checkpoint trained here (no manifest.json with its training config); "
                        f"give a train/<name>/seed-S/step-N folder")
    if manifest["family"] not in teacher_families():
        fail("teacher", f"{folder}: family {manifest['family']!r}: pretraining distillation reads the masked-LM "
                        f"logits of {', '.join(teacher_families())} only")
    depth = int(manifest["model_config"]["num_hidden_layers"])
    for d in cfg.depths or []:
        if not 1 <= d <= depth:
            fail("depths", f"a student of {d} layers: must be in [1, {depth}] (the teacher has {depth} layers)")
    return cfg


def _read_manifest(folder: Path) -> dict | None:
    try:
        return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def student_train_config(cfg: PretrainDistillConfig, teacher_manifest: dict, depth: int, init: str, name: str):
    """The teacher's training config with the student's name, depth, steps and seeds, and the
    student's family (`FamilySpec.distill_student`: a BERT's student is a DistilBERT, which keeps BERT's
    masked-LM settings and drops NSP and token types)."""
    from workbench.config import load_train_config
    from workbench.families import get_family

    base = dict(teacher_manifest["config"])
    for k in ("output_dir", "tokens", "steps", "name", "seeds", "checkpoints", "device", "progress"):
        base.pop(k, None)
    model = {**(base.pop("model", None) or {}), "num_hidden_layers": depth}
    student = student_family(base["family"])
    if student != base["family"]:
        known = set(get_family(student).objective)
        base["objective"] = {k: v for k, v in (base.get("objective") or {}).items() if k in known}
        model.pop("type_vocab_size", None)
        base["family"] = student
    warmup = cfg.warmup if cfg.warmup is not None else min(int(base.get("warmup") or 0), cfg.steps // 4)
    return load_train_config({**base, "model": model, "name": f"{name}-L{depth}-{init}", "steps": cfg.steps,
                        "seeds": list(cfg.seeds), "warmup": warmup, "lr": cfg.lr or base["lr"],
                        "checkpoints": {"log_spaced": False, "every": max(1, cfg.steps // 4)},
                        "device": cfg.device, "progress": cfg.progress})


@dataclass
class PretrainDistillResult:
    run_id: str
    rows: Any
    students: dict[str, Path]


def _setup(cfg: PretrainDistillConfig):
    """What every student of the sweep shares: the teacher (loaded), its manifest, hash and depth, the
    student family, the depths and the sweep name (built in the parent and again in each worker)."""
    from types import SimpleNamespace

    from workbench.store.checkpoints import checkpoint_name
    from workbench.store.identity import weights_hash
    from workbench.families import get_family
    from workbench.running.model_loading import load_pretrainer

    teacher_folder = Path(cfg.teacher).expanduser().resolve()
    tm = _read_manifest(teacher_folder)
    family_name = tm["family"]
    teacher = load_pretrainer(teacher_folder, family_name).eval()
    teacher_depth = int(teacher.model.config.num_hidden_layers)
    student_family_name = student_family(family_name)
    return SimpleNamespace(
        teacher_folder=teacher_folder, manifest=tm, family_name=family_name, teacher=teacher,
        teacher_depth=teacher_depth, teacher_name=checkpoint_name(teacher_folder),
        teacher_hash=weights_hash(teacher_folder), student_family_name=student_family_name,
        student_family=get_family(student_family_name),
        # the teacher as it reads the student's batches (a BERT: one segment, no token types)
        reader=OneSegmentTeacher(teacher) if student_family_name != family_name else teacher,
        depths=cfg.depths or [max(1, teacher_depth // 2)],
        name=cfg.name or f"{tm['config'].get('name', 'teacher')}-distil")


def _student_data(cfg: PretrainDistillConfig, setup, depth: int, init: str):
    """The student's training config and data (the teacher's corpus and tokenizer, checked)."""
    from workbench.store.identity import tokenizer_hash
    from workbench.drivers.train import prepare_data

    scfg = student_train_config(cfg, setup.manifest, depth, init, setup.name)
    data = prepare_data(scfg, setup.student_family)
    if tokenizer_hash(data.tokenizer) != setup.manifest["tokenizer"]["sha256"]:
        raise ConfigError(f"{setup.teacher_folder}: the student's corpus and tokenizer settings give another "
                          f"tokenizer than the teacher's (sha256 {setup.manifest['tokenizer']['sha256'][:12]}); "
                          f"is the teacher's corpus folder still there?")
    return scfg, data


def train_student(cfg: PretrainDistillConfig, depth: int, init: str, threads: int | None = None) -> list[str]:
    """Train (or resume; a finished run is free) one student of the sweep over its seeds, in this
    process, a local worker or a submitit job; the final checkpoint folder of each seed."""
    from workbench.drivers.train import train_from_config

    if threads is not None:
        torch.set_num_threads(threads)
    setup = _setup(cfg)
    scfg, _ = _student_data(cfg, setup, depth, init)
    layers = student_layers(setup.teacher_depth, depth) if init == "teacher" else None
    record = {"teacher": str(setup.teacher_folder), "teacher_sha256": setup.teacher_hash, "init": init,
              "teacher_layers": layers, "depth": depth}
    hooks = TrainingHooks(loss=TripleLoss(cfg.temperature, cfg.alpha_ce, cfg.alpha_mlm, cfg.alpha_cos, record,
                                          restrict_soft_loss_to_mask=cfg.restrict_soft_loss_to_mask),
                          teacher=setup.reader,
                          initial=TeacherLayers(setup.teacher.model, layers, record) if layers else None)
    return [str(f) for f in train_from_config(scfg, hooks=hooks)]


def run_pretrain_distill(cfg: PretrainDistillConfig, store=None, jobs: int | None = None,
                         executor="local") -> PretrainDistillResult:
    """Train every (depth, init, seed) student (resuming finished ones for free), the (depth, init)
    students as the executor's units (`workbench.drivers.executor`: `jobs` > 1 in parallel local processes,
    one thread each; `executor` submitit-local | slurm, or `ExecutorOptions`: one submitit job each),
    then evaluate teacher and students on the same held-out batches and write the rows."""
    import pandas as pd

    from workbench.store.checkpoints import checkpoint_name
    from workbench.drivers.executor import Unit, resolve_options, run_driver_units
    from workbench.running.model_loading import load_pretrainer
    from workbench.store.results import ResultsStore
    from workbench.drivers.train import evaluate_heldout, init_distributed

    options = resolve_options(executor, jobs)
    setup = _setup(cfg)
    grid = [(depth, init) for depth in setup.depths for init in cfg.inits]
    # the data (corpus, tokenizer, tokenised splits) is built once here, before any worker reads it
    scfg, data = _student_data(cfg, setup, *grid[0])
    device = init_distributed(scfg.device).device(scfg.device)
    teacher_loss = evaluate_heldout(setup.reader.to(device), setup.student_family, data.heldout, data.tokenizer,
                                    scfg, cfg.heldout_batches, device)["loss"]
    setup.reader.to("cpu")

    def units(parallel: bool) -> list:
        if not parallel:
            return [Unit(train_student, (cfg, *point), name=f"L{point[0]}-{point[1]}") for point in grid]
        # parallel students: one thread each (the unit's own argument), no progress bars locally
        quiet = cfg if options.executor != "local" else dataclasses.replace(cfg, progress=False)
        return [Unit(train_student, (quiet, *point, 1), name=f"L{point[0]}-{point[1]}") for point in grid]

    runs = ResultsStore(None if store is None else store.root).root
    finals = dict(zip(grid, run_driver_units(units, len(grid), options, runs, setup.name, desc="students")))

    common = {"family": setup.family_name, "probe": PROBE, "task": "mlm", "split": "heldout",
              "metric": "heldout_mlm_loss"}
    rows = [{**common, "model": setup.teacher_name, "value": teacher_loss,
             "extra": {"role": "teacher", "depth": setup.teacher_depth,
                       "parameters": sum(p.numel() for p in setup.teacher.model.parameters())}}]
    students = {}
    for (depth, init), folders in finals.items():
        layers = student_layers(setup.teacher_depth, depth) if init == "teacher" else None
        for seed, final in zip(cfg.seeds, map(Path, folders)):
            student = load_pretrainer(final, setup.student_family_name).to(device).eval()
            loss = evaluate_heldout(student, setup.student_family, data.heldout, data.tokenizer, scfg,
                                    cfg.heldout_batches, device)["loss"]
            extra = {"role": "student", "depth": depth, "init": init, "teacher": setup.teacher_name,
                     "teacher_layers": layers, "temperature": cfg.temperature, "alpha_ce": cfg.alpha_ce,
                     "alpha_mlm": cfg.alpha_mlm, "alpha_cos": cfg.alpha_cos,
                     "soft_loss_positions": "masked" if cfg.restrict_soft_loss_to_mask else "non_pad", "checkpoint": str(final),
                     "teacher_loss": teacher_loss, "parameters": sum(p.numel() for p in student.model.parameters())}
            rows.append({**common, "family": setup.student_family_name, "model": checkpoint_name(final), "seed": seed,
                         "step": cfg.steps, "value": loss, "extra": extra})
            students[f"L{depth}-{init}-seed{seed}"] = final
    store = store or ResultsStore()
    with store.start_run(PROBE, cfg.to_dict(), seeds=list(cfg.seeds), checkpoints=[setup.teacher_folder],
                         name=setup.name) as w:
        w.add(rows)
        w.note("students", {k: str(v) for k, v in students.items()})
        run_id = w.run_id
    return PretrainDistillResult(run_id, pd.DataFrame(rows), students)


def report(result) -> str:
    """What `bertology distill` prints for `kind: pretraining`: each student's held-out MLM loss."""
    table = result.rows[["model", "value"]].rename(columns={"value": "heldout_mlm_loss"}).to_string(index=False)
    return f"{table}\nrun {result.run_id}"


DRIVER = DriverSpec("distill_pretraining", PretrainDistillConfig, load_pretrain_distill_config, run_pretrain_distill,
                    report)
