"""Task distillation (Hinton, Vinyals & Dean 2015) from a fine-tuned classifier into smaller students.

The question: what does a student keep of its teacher, at what size and speed. A teacher is any
classifier folder `bertology finetune` wrote (`finetune/<name>/seed-S/best`); a student is the same
architecture with fewer layers, either initialised from the teacher's layers (DistilBERT's
initialisation, Sanh et al. 2019: embeddings, the kept blocks, pooler and classifier copied) or
randomly (the same student architecture from scratch).

Which teacher layers a student of depth k keeps (`student_layers`): spread evenly over the L
teacher layers, first and last kept, layer i = round_half_up(i * (L - 1) / (k - 1)). For 12 -> 6
this is DistilBERT's extraction [0, 2, 4, 7, 9, 11]; 6 -> 3 gives [0, 3, 5], 6 -> 2 gives [0, 5].

The loss of one batch (`TaskKD`): alpha * T^2 * KL(softmax(z_t / T) || softmax(z_s / T)) +
(1 - alpha) * CE(y, z_s), KL with batch-mean reduction (`workbench.loop.kl_to_teacher`); T^2 keeps
the soft term's gradient scale independent of T. alpha = 0 is plain fine-tuning of the student.

A sweep (`DistillConfig`, `bertology distill CONFIG.yaml`) runs every point of
depths x inits x temperatures x alphas (alpha = 0 does not depend on T: one point, T recorded as
none) over the seeds, each point a fine-tuning run of `workbench.drivers.finetune` with the teacher as a
training hook (the one training loop, its resume and early stopping), in

    distill/<name>/config.json                 the sweep's config (a different one is refused)
    distill/<name>/students/<depth>-<init>/    the initial student (a derived checkpoint: lineage, layer map)
    distill/<name>/points/<point>/             the fine-tuning run folder of one point (seed-S/best ...)
    distill/<name>/points/<point>/point.json   the point is done: its test accuracies per seed
    distill/<name>/teacher.json                the teacher's test accuracy, size and latency

Rows (probe "distill", one results-store run per sweep): per point and seed `accuracy` (test and
dev), `accuracy_kept` (student / teacher test accuracy), and per student architecture
`parameters`, `file_bytes`, `latency_ms` (CPU forward of a fixed batch, median of repeats, one
thread), each with the teacher's value in `extra`. Rerunning the command skips finished points and
resumes a point's unfinished seed where it stopped.

Points are independent runs (`run_point`): `run_distill(..., jobs=N)` runs N at once in spawned
local processes (one torch thread each unless `threads` is set) and `executor="submitit-local"` or
`"slurm"` hands each point to submitit: the points are units of the one executor layer
(`workbench.drivers.executor`), as every driver's are. The
parent prepares what the points share first (initial students, the teacher's evaluation, the
latency batch), and writes the rows from the `point.json` files at the end, so a parallel sweep's
rows equal a sequential one's (each point is seeded by its seeds alone; latencies are timings).

Concerns:
- students cut from (or shaped like) the teacher: `student_layers`, `cut_student`, `random_student`,
  `classifier_handle`, `make_student`, `count_parameters`
- the distillation loss as a training hook: `TaskKD`, `CachedTeacher`
- the sweep's config and grid: `DistillConfig`, `load_distill_config`, `Point`, `sweep_points`
- running the sweep (points over seeds, CPU latency): `DistillResult`, `run_point`, `run_distill`,
  `cpu_latency_ms`
- its rows and printed table: `distill_rows`, `format_table`, `report`
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import json
import math
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from workbench.drivers.spec import NOT_IDENTITY, DriverSpec, identity_hash
from workbench.coerce import load_config
from workbench.errors import ConfigError
from workbench.families import ModelTypeTable
from workbench.io import atomic_write_json
from workbench.store.rowschema import RowSchema
from workbench.loop import TrainingHooks, kl_to_teacher

PROBE = "distill"
# The `extra` of every row of the producer "distill" (checked by the results store,
# `workbench.store.rowschema`): task distillation's (`distill_rows`) and pretraining distillation's
# held-out MLM loss rows (`workbench.drivers.distill_pretraining`), declared in one place so that
# either module's import registers both kinds.
EXTRA_SCHEMAS = (
    RowSchema(PROBE, "teacher", required={"role": str, "depth": int}),
    RowSchema(PROBE, "student", required={"role": str, "depth": int, "init": str, "temperature": float | None, "alpha": float,
                                          "teacher": str}, optional={"teacher_value": float, "fraction_of_teacher": float}),
    RowSchema(PROBE, "pretraining teacher", required={"role": str, "depth": int, "parameters": int}),
    RowSchema(PROBE, "pretraining student", required={"role": str, "depth": int, "init": str}, optional={
        "teacher": str, "teacher_layers": list | None, "temperature": float, "alpha_ce": float, "alpha_mlm": float,
        "alpha_cos": float, "soft_loss_positions": str, "checkpoint": str, "teacher_loss": float, "parameters": int}),
)
INITS = ("teacher", "random")
# The state-dict key of a transformer block: "<...>.<list>.<i>.<rest>" for the layer lists of the
# families a student can be cut from (BERT/RoBERTa/ELECTRA/DeBERTa "encoder.layer", DistilBERT
# "transformer.layer", GPT-2 "h").
_LAYER_KEY = re.compile(r"^(.*?(?:^|\.)(?:encoder\.layer|transformer\.layer|h))\.(\d+)\.(.*)$")
# Families whose blocks are not a plain list of independent layers (ALBERT shares one layer;
# encoder-decoders have two stacks): a student of fewer layers is not defined here for them
# (model type -> why: `FamilySpec.distill_unsupported`).
_UNSUPPORTED_MODEL_TYPES = ModelTypeTable({}, lambda spec: spec.distill_unsupported)


# ---------------------------------------------------------------------------------------- students

def student_layers(teacher_depth: int, depth: int) -> list[int]:
    """The teacher layers (0-based) a student of `depth` layers keeps: evenly spread, first and
    last kept (DistilBERT's [0, 2, 4, 7, 9, 11] for 12 -> 6); a 1-layer student keeps the last."""
    if not 1 <= depth <= teacher_depth:
        raise ConfigError(f"student depth {depth}: must be in [1, {teacher_depth}] (the teacher has {teacher_depth} layers)")
    if depth == 1:
        return [teacher_depth - 1]
    return [math.floor(i * (teacher_depth - 1) / (depth - 1) + 0.5) for i in range(depth)]


def _depth(config) -> int:
    return int(config.num_hidden_layers)


def _check_cuttable(model) -> None:
    model_type = getattr(model.config, "model_type", "")
    if model_type in _UNSUPPORTED_MODEL_TYPES:
        raise ConfigError(f"distill: cannot cut a {model_type} model into fewer layers "
                          f"({_UNSUPPORTED_MODEL_TYPES[model_type]})")
    layers = {int(m.group(2)) for k in model.state_dict() if (m := _LAYER_KEY.match(k))}
    if layers != set(range(_depth(model.config))):
        raise ConfigError(f"distill: {type(model).__name__}: cannot find its {_depth(model.config)} blocks "
                          f"in the state dict (found layer indices {sorted(layers)})")


def _student_config(teacher, depth: int):
    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = depth
    return config


def cut_student(teacher, layers: list[int]):
    """A student of `len(layers)` blocks, the same class and config otherwise, whose block j is a
    copy of the teacher's block `layers[j]` and whose every other tensor (embeddings, pooler,
    classifier) is a copy of the teacher's. Every tensor of the student is set (strict load)."""
    _check_cuttable(teacher)
    with torch.random.fork_rng(devices=[]):  # the weights it draws are all overwritten
        student = type(teacher)(_student_config(teacher, len(layers)))
    source = teacher.state_dict()
    mapped = {}
    for key in student.state_dict():
        m = _LAYER_KEY.match(key)
        teacher_key = f"{m.group(1)}.{layers[int(m.group(2))]}.{m.group(3)}" if m else key
        mapped[key] = source[teacher_key].detach().clone()
    student.load_state_dict(mapped, strict=True)
    return student.eval()


def random_student(teacher, depth: int, seed: int):
    """A student of `depth` blocks, the teacher's class and config otherwise, with the class's own
    initialisation under `seed` (a forked RNG: the global one is untouched)."""
    _check_cuttable(teacher)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return type(teacher)(_student_config(teacher, depth)).eval()


def classifier_handle(folder: Path):
    """The fine-tuned classifier of `folder` as a `ModelHandle` over its classifier class (not the
    LM class `ModelHandle.load` opens), keeping the folder's identity: `ModelHandle.load_classifier`."""
    from workbench.running.models import ModelHandle

    return ModelHandle.load_classifier(folder)


def make_student(teacher_handle, depth: int, init: str, seed: int = 0):
    """A derived handle (`ModelHandle.derive`) over the student: lineage = the teacher (folder,
    hash), transform "distill_student" with the layer map and init. A random student is derived
    as fresh weights (it keeps nothing the teacher learnt)."""
    from workbench.running.model_loading import DERIVATIONS, Derivation

    teacher_depth = _depth(teacher_handle.model.config)
    if init == "teacher":
        layers = student_layers(teacher_depth, depth)
        return teacher_handle.derive("distill_student", {"init": "teacher", "teacher_layers": layers,
                                                          "teacher_depth": teacher_depth}, apply=_cut_apply_params)
    if init == "random":
        DERIVATIONS.setdefault("distill_student_random", Derivation("distill_student_random", _random_student_params,
                                                                    fresh_weights=True))
        return teacher_handle.derive("distill_student_random", {"init": "random", "depth": depth, "seed": int(seed),
                                                                 "teacher_depth": teacher_depth})
    raise ConfigError(f"distill: init {init!r}: known {', '.join(INITS)}")


def _cut_apply_params(model, init: str, teacher_layers: list[int], teacher_depth: int):
    return cut_student(model, list(teacher_layers))


def _random_student_params(model, init: str, depth: int, seed: int, teacher_depth: int):
    return random_student(model, depth, seed)


# -------------------------------------------------------------------------------------------- loss

class TaskKD:
    """The task-distillation loss of Hinton, Vinyals & Dean (2015), as a training-hook loss:
    alpha * T^2 * KL(softmax(z_t/T) || softmax(z_s/T)) (batch mean) + (1 - alpha) * CE(y, z_s).
    Returns every term ("loss", "kd", "ce") so a sweep over alpha can be read per term."""

    def __init__(self, temperature: float, alpha: float, record: dict | None = None):
        if not temperature > 0:
            raise ConfigError(f"distill: temperature must be > 0, got {temperature}")
        if not 0 <= alpha <= 1:
            raise ConfigError(f"distill: alpha must be in [0, 1], got {alpha}")
        self.temperature = float(temperature)
        self.alpha = float(alpha)
        self.record = dict(record or {})

    def __call__(self, student_out, batch, teacher_out) -> dict[str, torch.Tensor]:
        ce = student_out.loss  # the classifier's own cross-entropy against batch["labels"]
        if self.alpha == 0:
            return {"loss": ce, "ce": ce.detach()}
        kd = kl_to_teacher(student_out.logits, teacher_out.logits, self.temperature)
        loss = self.alpha * kd + (1 - self.alpha) * ce
        return {"loss": loss, "kd": kd.detach(), "ce": ce.detach()}

    def describe(self) -> dict:
        """What the manifest records (and what a resumed run must match)."""
        return {"name": "task_kd", "temperature": self.temperature, "alpha": self.alpha, **self.record}


class CachedTeacher(torch.nn.Module):
    """A frozen teacher whose logits are kept per example: when the data repeats (epochs), the
    teacher runs once per distinct example. Keyed by the example's unpadded token ids, so batches
    that pad the same sentence to other lengths share it (the logits then agree to float rounding,
    not bit for bit: padding changes the shapes of the masked softmax). Only `logits` is returned."""

    def __init__(self, teacher):
        super().__init__()
        self.teacher = teacher
        self.config = teacher.config
        self.cache: dict[bytes, torch.Tensor] = {}
        self.computed = 0  # examples the teacher actually ran on
        self.served = 0  # examples answered (computed or cached)

    def forward(self, input_ids, attention_mask, **_):
        keys = [ids[m.bool()].cpu().numpy().tobytes() for ids, m in zip(input_ids, attention_mask)]
        todo = [i for i, k in enumerate(keys) if k not in self.cache]
        if todo:
            idx = torch.tensor(todo, device=input_ids.device)
            out = self.teacher(input_ids=input_ids[idx], attention_mask=attention_mask[idx]).logits.detach()
            for j, i in enumerate(todo):
                self.cache[keys[i]] = out[j]
            self.computed += len(todo)
        self.served += len(keys)
        from transformers.modeling_outputs import SequenceClassifierOutput

        return SequenceClassifierOutput(logits=torch.stack([self.cache[k] for k in keys]))


# ------------------------------------------------------------------------------------------ config

@dataclass
class DistillConfig:
    """One task-distillation sweep. Unknown keys and bad values are `ConfigError`s (`load_distill_config`)."""

    teacher: str                                                  # a fine-tuned classifier folder (finetune/<name>/seed-S/best)
    kind: str = "task"                                            # task | pretraining (workbench.drivers.distill_pretraining)
    name: str | None = field(default=None, metadata=NOT_IDENTITY)  # sweep folder name; default <teacher run name>
    depths: list[int] = field(default_factory=lambda: [3, 2])     # student layers (each <= the teacher's)
    inits: list[str] = field(default_factory=lambda: ["teacher", "random"])
    temperatures: list[float] = field(default_factory=lambda: [2.0])
    alphas: list[float] = field(default_factory=lambda: [0.5])
    seeds: list[int] = field(default_factory=lambda: [0])
    cache_teacher: bool = True                                    # keep the frozen teacher's logits per example
    epochs: int = 3
    lr: float = 1e-4
    batch_size: int = 32
    max_len: int = 64
    warmup: float = 0.1
    weight_decay: float = 0.01
    patience: int = 2
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    latency_batch: int = 32                                       # sentences per timed CPU forward
    latency_repeats: int = 5
    device: str = field(default="auto", metadata=NOT_IDENTITY)  # auto (cuda when available) | cpu | cuda | cuda:N
    threads: int | None = field(default=None, metadata=NOT_IDENTITY)
    output_dir: str | None = field(default=None, metadata=NOT_IDENTITY)  # default <runs root>/distill/<name>
    progress: bool = field(default=True, metadata=NOT_IDENTITY)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def key(self) -> str:
        """What changes the sweep's results: the identity fields (`workbench.drivers.spec.identity_hash`;
        not display, device, threads or folders)."""
        return identity_hash(self)


def load_distill_config(source: str | Path | dict, overrides: dict | None = None) -> DistillConfig:
    """A validated config (YAML file or dict, `overrides` on top); the teacher is checked too (it
    must be a classifier with at least as many layers as every student) before any work. `overrides`
    by `workbench.coerce.load_config`'s rule (None values ignored)."""
    cfg, where = load_config(DistillConfig, source, overrides, label="distill config")
    _validate(cfg, where)
    return cfg


def _validate(cfg: DistillConfig, where: str) -> None:
    def fail(key, msg):
        raise ConfigError(f"{where}: {key}: {msg}")

    if cfg.kind != "task":
        fail("kind", f"must be task here (pretraining: workbench.drivers.distill_pretraining), got {cfg.kind!r}")
    for key in ("depths", "inits", "temperatures", "alphas", "seeds"):
        values = getattr(cfg, key)
        if not values:
            fail(key, "list at least one value")
        if len(set(values)) != len(values):
            fail(key, f"values repeat: {values}")
    for t in cfg.temperatures:
        if not (t > 0 and math.isfinite(t)):
            fail("temperatures", f"a temperature must be > 0, got {t}")
    for a in cfg.alphas:
        if not 0 <= a <= 1:
            fail("alphas", f"alpha must be in [0, 1], got {a}")
    for i in cfg.inits:
        if i not in INITS:
            fail("inits", f"unknown init {i!r} (known: {', '.join(INITS)})")
    if any(s < 0 for s in cfg.seeds):
        fail("seeds", f"seeds must be >= 0, got {cfg.seeds}")
    for key in ("epochs", "batch_size", "patience", "latency_batch", "latency_repeats"):
        if getattr(cfg, key) < 1:
            fail(key, f"must be >= 1, got {getattr(cfg, key)}")
    if not (cfg.lr > 0 and math.isfinite(cfg.lr)):
        fail("lr", f"must be > 0, got {cfg.lr}")
    if not 0 <= cfg.warmup < 1:
        fail("warmup", f"must be a fraction in [0, 1), got {cfg.warmup}")
    if cfg.max_len < 4:
        fail("max_len", f"must be >= 4, got {cfg.max_len}")
    for key in ("max_train_examples", "max_eval_examples"):
        v = getattr(cfg, key)
        if v is not None and v < 2:
            fail(key, f"must be >= 2, got {v}")
    if not (cfg.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", cfg.device)):
        fail("device", f"must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.name is not None and not re.fullmatch(r"[\w.+-]+", cfg.name):
        fail("name", f"use letters, digits and . _ + - only, got {cfg.name!r}")
    # the teacher: a fine-tuned classifier folder, deep enough for every student
    folder = Path(cfg.teacher).expanduser()
    if not (folder / "config.json").is_file():
        fail("teacher", f"{folder}: not a checkpoint folder (no config.json); give a fine-tuned classifier, "
                        f"e.g. <runs>/finetune/NAME/seed-0/best")
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        fail("teacher", f"{folder / 'config.json'}: unreadable ({e})")
    archs = config.get("architectures") or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        fail("teacher", f"{folder}: has no sequence-classification head (architectures {archs}); task "
                        f"distillation needs a classifier from `bertology finetune`")
    manifest = _teacher_manifest(folder)
    if manifest.get("kind") != "finetune" or "task" not in manifest:
        fail("teacher", f"{folder}: its manifest.json does not name the task it was fine-tuned on "
                        f"(not a `bertology finetune` checkpoint)")
    depth = config.get("num_hidden_layers", config.get("n_layer", config.get("n_layers")))
    if config.get("model_type") in _UNSUPPORTED_MODEL_TYPES:
        fail("teacher", f"{folder}: a {config['model_type']} model cannot be cut into fewer layers "
                        f"({_UNSUPPORTED_MODEL_TYPES[config['model_type']]})")
    for d in cfg.depths:
        if not 1 <= d <= int(depth):
            fail("depths", f"a student of {d} layers: must be in [1, {depth}] (the teacher has {depth} layers)")


def _teacher_manifest(folder: Path) -> dict:
    try:
        return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


# ------------------------------------------------------------------------------------------- sweep

@dataclass(frozen=True)
class Point:
    depth: int
    init: str
    temperature: float | None  # None: alpha = 0 (plain cross-entropy, T plays no part)
    alpha: float

    @property
    def name(self) -> str:
        t = "none" if self.temperature is None else f"{self.temperature:g}"
        return f"L{self.depth}-{self.init}-T{t}-a{self.alpha:g}"


def sweep_points(cfg: DistillConfig) -> list[Point]:
    """Every (depth, init, T, alpha) of the sweep; alpha = 0 once per (depth, init), T = None."""
    points = []
    for depth, init in itertools.product(cfg.depths, cfg.inits):
        if 0 in cfg.alphas:
            points.append(Point(depth, init, None, 0.0))
        for t, a in itertools.product(cfg.temperatures, [a for a in cfg.alphas if a != 0]):
            points.append(Point(depth, init, float(t), float(a)))
    return points


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


def cpu_latency_ms(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, repeats: int) -> float:
    """Median wall time (ms) of one forward of the batch on the CPU with one thread (one warm-up)."""
    threads = torch.get_num_threads()
    model = copy.deepcopy(model).to("cpu").eval()
    torch.set_num_threads(1)
    try:
        times = []
        with torch.no_grad():
            for r in range(repeats + 1):
                t0 = time.perf_counter()
                model(input_ids=input_ids, attention_mask=attention_mask)
                if r:
                    times.append((time.perf_counter() - t0) * 1000)
        return float(statistics.median(times))
    finally:
        torch.set_num_threads(threads)


def _file_bytes(folder: Path) -> int:
    from workbench.store.checkpoints import weight_files

    return sum(p.stat().st_size for p in weight_files(folder))


@dataclass
class DistillResult:
    run_id: str
    rows: Any  # pandas DataFrame
    folder: Path


def _finetune_cfg(cfg: DistillConfig, point: Point, seeds: list[int], folder: Path, student: Path,
                  task_keys: dict):
    """The fine-tuning config of one point: its student, the teacher's task and split, the sweep's
    training settings, its own run folder."""
    from workbench.drivers.finetune import load_finetune_config

    return load_finetune_config({
        "checkpoint": str(student), **task_keys, "name": point.name,
        "seeds": seeds, "epochs": cfg.epochs, "lr": cfg.lr, "batch_size": cfg.batch_size,
        "max_len": cfg.max_len, "warmup": cfg.warmup, "weight_decay": cfg.weight_decay,
        "patience": cfg.patience, "max_train_examples": cfg.max_train_examples,
        "max_eval_examples": cfg.max_eval_examples, "baselines": False, "device": cfg.device,
        "output_dir": str(folder / "points" / point.name), "progress": cfg.progress})


def run_point(cfg: DistillConfig, point: Point, shared: dict, store_root: str | None = None) -> dict:
    """One point of the sweep (a fine-tuning run over the seeds with the teacher as a hook), in this
    process, a local worker or a submitit job; writes and returns its `point.json` document.
    `shared` is what the parent prepared (`run_distill`): the sweep folder, the teacher (folder,
    hash, depth), the task keys, the initial students' folders and the latency batch."""
    from workbench.drivers.finetune import run_finetune
    from workbench.running.classifier_loading import load_classifier
    from workbench.store.results import ResultsStore

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    folder = Path(shared["folder"])
    teacher_folder = Path(shared["teacher_folder"])
    teacher = classifier_handle(teacher_folder)
    layers = student_layers(shared["teacher_depth"], point.depth) if point.init == "teacher" else None
    loss = TaskKD(point.temperature or 1.0, point.alpha,
                  record={"teacher": str(teacher_folder), "teacher_sha256": shared["teacher_hash"],
                          "init": point.init, "teacher_layers": layers, "depth": point.depth,
                          "temperature_used": point.temperature is not None})
    teacher_module = CachedTeacher(teacher.model) if cfg.cache_teacher else teacher.model
    hooks = TrainingHooks(loss=loss, teacher=teacher_module if point.alpha > 0 else None)
    student = Path(shared["students"][f"L{point.depth}-{point.init}"])
    result = run_finetune(_finetune_cfg(cfg, point, list(cfg.seeds), folder, student, shared["task_keys"]),
                          store=ResultsStore(store_root), hooks=hooks)
    student_folder = Path(result.seeds[0].checkpoint)
    student_model = load_classifier(student_folder)
    lat = shared["latency_batch"]
    doc = {"point": dataclasses.asdict(point), "finetune_run": result.run_id,
           "seeds": {str(r.seed): {"test_accuracy": r.test["accuracy"], "dev_accuracy": r.dev["accuracy"],
                                    "test_n": r.test["n"], "checkpoint": r.checkpoint, "best_epoch": r.best_epoch}
                     for r in result.seeds},
           "parameters": count_parameters(student_model), "file_bytes": _file_bytes(student_folder),
           "latency_ms": cpu_latency_ms(student_model, lat["input_ids"], lat["attention_mask"], cfg.latency_repeats),
           "teacher_calls": ({"computed": teacher_module.computed, "served": teacher_module.served}
                             if hooks.teacher is not None and isinstance(teacher_module, CachedTeacher) else None)}
    atomic_write_json(folder / "points" / point.name / "point.json", doc)
    return doc


def run_distill(cfg: DistillConfig, store=None, jobs: int | None = None, executor="local") -> DistillResult:
    """Run (or resume) every point of the sweep, then write one results-store run (module docstring).
    The points are the executor's units (`workbench.drivers.executor`): `jobs` > 1 runs them in parallel
    local processes; `executor` submitit-local | slurm (or `ExecutorOptions`) hands each to submitit,
    job files under the sweep folder's `submitit/`."""
    import pandas as pd

    from workbench.store.checkpoints import checkpoint_name
    from workbench.drivers.executor import Unit, replace_threads, resolve_options, run_driver_units
    from workbench.drivers.finetune import collate, evaluate, prepare
    from workbench.paths import runs_root
    from workbench.store.results import ResultsStore

    options = resolve_options(executor, jobs)
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    teacher_folder = Path(cfg.teacher).expanduser().resolve()
    teacher_manifest = _teacher_manifest(teacher_folder)
    # a fine-tuned checkpoint is named by its run: <run>/seed-S/best
    teacher_name = ("/".join(teacher_folder.parts[-3:]) if teacher_folder.name == "best"
                    else checkpoint_name(teacher_folder))
    name = cfg.name or re.sub(r"[^\w.+-]+", "_", teacher_name).strip("_")
    folder = Path(cfg.output_dir) if cfg.output_dir else runs_root() / "distill" / name
    folder.mkdir(parents=True, exist_ok=True)
    key = {"key": cfg.key(), "teacher": str(teacher_folder)}
    cfg_file = folder / "config.json"
    if cfg_file.is_file():
        old = json.loads(cfg_file.read_text(encoding="utf-8"))
        if {k: old.get(k) for k in key} != key:
            raise ConfigError(f"{folder}: holds a distillation sweep with another config or teacher; "
                              f"choose another name or delete the folder")
    else:
        atomic_write_json(cfg_file, {**key, "config": cfg.to_dict()})

    teacher = classifier_handle(teacher_folder)
    teacher_hash = teacher.checkpoint_hash
    teacher_depth = _depth(teacher.model.config)
    ft = (teacher_manifest.get("finetune") or {}).get("config") or {}
    task_keys = {"task": teacher_manifest["task"], "split_seed": ft.get("split_seed", 0),
                 "dev_fraction": ft.get("dev_fraction", 0.1), "test_fraction": ft.get("test_fraction", 0.1),
                 "pooling": ft.get("pooling", "auto")}

    # ---- the initial students (one per depth x init; a random one per seed would change the
    # initial point with the seed: the seed instead drives the data order and dropout, as in finetune)
    students: dict[tuple[int, str], Path] = {}
    for depth, init in itertools.product(cfg.depths, cfg.inits):
        path = folder / "students" / f"L{depth}-{init}"
        if not (path / "config.json").is_file():
            handle = make_student(teacher, depth, init, seed=0)
            handle.save(path, overwrite=path.exists())
        students[(depth, init)] = path

    points = sweep_points(cfg)
    # ---- the teacher on the same test split (its own accuracy, size, latency)
    teacher_file = folder / "teacher.json"
    # (its own folder: a fine-tuning folder belongs to one config and one set of hooks)
    eval_cfg = dataclasses.replace(_finetune_cfg(cfg, points[0], list(cfg.seeds), folder,
                                                 students[(points[0].depth, points[0].init)], task_keys),
                                   output_dir=str(folder / "teacher_eval"))
    first_run = prepare(eval_cfg)
    latency_rows = sorted(range(len(first_run.test.ids)), key=lambda r: len(first_run.test.ids[r]))
    lat_batch = collate(first_run.test, latency_rows[len(latency_rows) // 2:][: cfg.latency_batch], first_run.pad_id)
    if teacher_file.is_file():
        teacher_doc = json.loads(teacher_file.read_text(encoding="utf-8"))
    else:
        teacher.model.to(first_run.device)
        acc, n, _ = evaluate(teacher.model, first_run.test, list(range(len(first_run.test.ids))),
                             first_run.pad_id, cfg.batch_size)
        dev_acc, dev_n, _ = evaluate(teacher.model, first_run.dev, list(range(len(first_run.dev.ids))),
                                     first_run.pad_id, cfg.batch_size)
        teacher.model.to("cpu")
        teacher_doc = {"test_accuracy": acc, "test_n": n, "dev_accuracy": dev_acc, "dev_n": dev_n,
                       "parameters": count_parameters(teacher.model), "file_bytes": _file_bytes(teacher_folder),
                       "latency_ms": cpu_latency_ms(teacher.model, lat_batch["input_ids"], lat_batch["attention_mask"],
                                                    cfg.latency_repeats),
                       "depth": teacher_depth, "sha256": teacher_hash, "path": str(teacher_folder)}
        atomic_write_json(teacher_file, teacher_doc)

    # ---- every point, each a fine-tuning run with the teacher as a hook (in parallel if asked)
    store = store or ResultsStore()
    shared = {"folder": str(folder), "teacher_folder": str(teacher_folder), "teacher_hash": teacher_hash,
              "teacher_depth": teacher_depth, "task_keys": task_keys,
              "students": {f"L{d}-{i}": str(p) for (d, i), p in students.items()},
              "latency_batch": {k: lat_batch[k] for k in ("input_ids", "attention_mask")}}
    done: dict[str, dict] = {}
    todo = []
    for point in points:
        point_file = folder / "points" / point.name / "point.json"
        if point_file.is_file():
            done[point.name] = json.loads(point_file.read_text(encoding="utf-8"))
        else:
            todo.append(point)
    docs = run_driver_units(  # parallel: one thread, no bars
        lambda parallel: [Unit(run_point, (replace_threads(cfg) if parallel else cfg, point, shared, str(store.root)),
                               name=point.name) for point in todo], len(todo), options, folder, desc="points")
    done.update({point.name: doc for point, doc in zip(todo, docs)})
    done = {p.name: done[p.name] for p in points}  # the sweep's order, whatever finished first

    rows = distill_rows(done, teacher_doc, teacher_name, teacher.family, task_keys["task"])
    with store.start_run(PROBE, cfg.to_dict(), seeds=list(cfg.seeds), checkpoints=[teacher_folder],
                         name=name) as writer:
        writer.add(rows)
        writer.note("teacher", teacher_doc)
        writer.note("points", done)
        writer.note("folder", str(folder))
        run_id = writer.run_id
    return DistillResult(run_id, pd.DataFrame(rows), folder)


def distill_rows(points: dict[str, dict], teacher: dict, teacher_name: str, family: str, task: str) -> list[dict]:
    """The sweep's rows: the teacher's, then per point and seed accuracy and accuracy kept, and
    per point its size and latency with the teacher's as a fraction."""
    common = {"family": family, "probe": PROBE, "task": task}
    t_extra = {"role": "teacher", "depth": teacher["depth"]}
    rows = [{**common, "model": teacher_name, "split": "test", "metric": "accuracy", "value": teacher["test_accuracy"],
             "n": teacher["test_n"], "extra": t_extra}]
    for metric in ("parameters", "file_bytes", "latency_ms"):
        rows.append({**common, "model": teacher_name, "metric": metric, "value": float(teacher[metric]), "extra": t_extra})
    for name, doc in points.items():
        p = doc["point"]
        extra = {"role": "student", "depth": p["depth"], "init": p["init"], "temperature": p["temperature"],
                 "alpha": p["alpha"], "teacher": teacher_name}
        model = f"{teacher_name}/distill/{name}"
        for seed, r in doc["seeds"].items():
            rows.append({**common, "model": model, "seed": int(seed), "split": "test", "metric": "accuracy",
                         "value": r["test_accuracy"], "n": r["test_n"], "extra": extra})
            rows.append({**common, "model": model, "seed": int(seed), "split": "dev", "metric": "accuracy",
                         "value": r["dev_accuracy"], "extra": extra})
            rows.append({**common, "model": model, "seed": int(seed), "split": "test", "metric": "accuracy_kept",
                         "value": r["test_accuracy"] / teacher["test_accuracy"], "n": r["test_n"], "extra": extra})
        for metric in ("parameters", "file_bytes", "latency_ms"):
            rows.append({**common, "model": model, "metric": metric, "value": float(doc[metric]),
                         "extra": {**extra, "teacher_value": teacher[metric],
                                   "fraction_of_teacher": doc[metric] / teacher[metric]}})
    return rows


def format_table(rows) -> str:
    """One line per point: test accuracy and accuracy kept (means over seeds, through the one seed
    statistic `workbench.store.aggregate.aggregate`), parameters, latency, and the number of seeds."""
    import pandas as pd

    from workbench.store.aggregate import aggregate

    df = pd.DataFrame(rows)
    lines = [f"{'model':<44} {'acc':>7} {'kept%':>6} {'params':>10} {'latency ms':>10} seeds"]
    for model, g in df.groupby("model", sort=False):
        test = g[(g.metric == "accuracy") & (g.split == "test")]
        acc = aggregate(test, over="seed", by=[], interval="none")
        kept = aggregate(g[g.metric == "accuracy_kept"], over="seed", by=[], interval="none")
        params = g[g.metric == "parameters"]["value"]
        lat = g[g.metric == "latency_ms"]["value"]
        kept_text = f"{100 * kept['value'].iloc[0]:6.1f}" if len(kept) else f"{100.0:6.1f}"
        lines.append(f"{str(model)[-44:]:<44} {acc['value'].iloc[0] if len(acc) else float('nan'):7.4f} {kept_text} "
                     f"{int(params.iloc[0]):>10d} {float(lat.iloc[0]):10.1f} {len(test)}")
    return "\n".join(lines)


def report(result) -> str:
    """What `bertology distill` prints: the students' table and where the sweep went."""
    return f"{format_table(result.rows)}\nrun {result.run_id}; students under {result.folder}"


DRIVER = DriverSpec("distill", DistillConfig, load_distill_config, run_distill, report,
                    identity=DistillConfig.key)
