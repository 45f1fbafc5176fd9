"""The one probe runner: checkpoints -> model handle -> random-init twin -> stacks -> resumable units -> one run.

Every probe family (syntax, coreference, cloze, membership, alignment, and the pruning and
distillation sweeps that follow) runs through `run_probe`, so a probe module says only what is
specific to it (in the spirit of structural-probes' one-concern modules and nanoGPT's one loop):

    NAME, TASKS                 what it is called and which tasks it has
    Settings(runner.Settings)   its settings, a dataclass (unknown keys are a ConfigError; the
                                settings go into the run manifest and the resume key; each field is a
                                `--dashed-option` of `bertology probe NAME`, its metadata["help"] the help)
    prepare(settings)           the data it loads once per run -> Prepared(data, files, notes)
    run_task(unit, prepared, task, settings) -> rows   one (model, stack, task)
    PROBE = ProbeSpec(...)      registered in `probes/__init__.py`
    roles={"target": Role(...)} optional: extra checkpoints the probe reads beside the probed one
                                (align's target model, membership's reference model and shadow
                                models, a teacher)

What the runner does, in order, so that bad input fails before any expensive work:
1. settings are coerced and validated (`Settings.validate`), then every checkpoint is resolved
   (folders, training folders, Hub names in the local cache: `workbench.store.checkpoints`) and its
   stacks checked against `settings.stack` from its config.json alone; so is every checkpoint a
   role's setting names (`Role`);
2. `prepare` loads the data once;
3. each role's checkpoints are loaded once for the whole run (`unit.roles[name]`: a handle, or a
   list for a `many` role; a `lazy` role's are hashed, not loaded: the probe loads what it reads,
   e.g. LiRA's shadows one at a time); their hashes go into every unit's resume key and the run's notes
   (`roles`); one results-store run is opened (manifest: settings, seeds, data files with checksums,
   checkpoints with hashes and, for a derived model, its lineage); for each checkpoint the handle is
   loaded and, when "random_init" is among the baselines, its random-init twin is derived
   (`ModelHandle.derive("random_init", ...)`, Hewitt & Manning 2019's random BERT;
   seed = probe seed + TWIN_SEED_OFFSET, checked to differ from the checkpoint); a probe whose
   twin rows depend only on the twin itself (`ProbeSpec.twin_once_per_run`) probes the twin once
   per training folder: the steps of one run share config, tokenizer and seed, hence one twin
   (same weight hash), and its rows are copied to the other steps rather than recomputed;
4. for each (model, stack, task) a *unit*: reused from `<runs root>/partials/` when an interrupted
   attempt finished it (`workbench.store.results.FinishedUnits`), else computed and saved at once;
5. the optional `finish` hook sees every unit's result (cross-model comparisons), notes and
   timings are written, the run is published and the partials are removed.

A unit never changes the model it is given: a probe that needs a changed model (a head masked,
weights quantized) derives one (`unit.handle.derive(...)`), whose hash, and so its activation
cache and rows, are its own. Rows are per layer, or whole-model (`unit.rows` with scalar metrics:
layer NA), e.g. an attack's AUC or an accuracy at a sparsity.

Concerns:
- the probe contract (what a probe module declares): `Settings`, `make_settings`, `Prepared`, `Role`,
  `RoleCheckpoint`, `ProbeSpec`, `Unit`, `UnitResult`
- running it (roles, settings, resumable units, one run): `run_probe`, `run_key`, `resolve_roles`,
  `load_roles`, `resolve_settings`, `checkpoint_stacks`, `torch_threads`
- the generic per-layer summary: `layer_frame`, `format_layer_table`, `aligned`
- `bertology probe NAME`: `build_parser`, `cli_main`
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pandas as pd

from probes.core.statistics import N_BOOT
from workbench.activations import CACHE_DTYPES
from workbench.store.checkpoints import Checkpoint, expand_checkpoints
from workbench.coerce import apply_overrides, build_dataclass, coerce_value
from workbench.errors import CheckpointError, ConfigError, DataFormatError, yaml_problem
from workbench.store.identity import weights_hash
from workbench.io import read_yaml
from workbench.precision import COMPUTE_DTYPES, resolve_compute_dtype
from workbench.progress import get_logger, progress

TWIN_SEED_OFFSET = 7919  # random-init twins use probe seed + this (never a checkpoint's own step-0 init)
RANDOM_INIT_SUFFIX = " (random init)"
STACK_NAMES = ("encoder", "decoder", "all")


# --------------------------------------------------------------------------- settings
@dataclass
class Settings:
    """Settings every probe has; a probe's own Settings subclass adds its fields (all with defaults)."""

    tasks: tuple[str, ...] = field(default=(), metadata={"help": "comma-separated tasks (default: all)"})
    seed: int = field(default=0, metadata={"help": "probe seed (splits, probe init, bootstrap, twin = seed + 7919)"})
    stack: str | None = field(default=None, metadata={
        "help": "encoder | decoder | all (default: the model's first stack)"})
    baselines: tuple[str, ...] = field(default=("random_init",), metadata={
        "help": "comma-separated baselines ('' for none); random_init = the same architecture, fresh weights"})
    n_boot: int = field(default=N_BOOT, metadata={"help": "bootstrap resamples for confidence intervals"})
    batch_size: int = field(default=32, metadata={"help": "sentences per forward pass"})
    cache_dir: str | None = field(default=None, metadata={"help": "activation cache (default: <runs root>/cache)"})
    threads: int | None = field(default=None, metadata={
        "help": "torch threads for this run (1 is often fastest on a busy 2-core machine)"})
    name: str | None = field(default=None, metadata={"help": "run name in the catalog"})
    dtype: str = field(default="fp32", metadata={
        "help": "precision of the model's forward: fp32 | bf16 | auto (bf16 on a CPU with amx_bf16/avx512_bf16, "
                "workbench.precision); activations reach the probes in fp32 either way"})
    cache_dtype: str = field(default="fp32", metadata={
        "help": "how the activation cache stores the vectors: fp32 | fp16 | bf16 (half the disk and reads; "
                "fp16 fails on values beyond +-65504, bf16 keeps the range with 8 bits of mantissa)",
        "key_omits": "fp32"})
    progress: bool = field(default=True, metadata={"help": "progress bars", "cli": False})

    # Fields that change how a run is executed, not what it computes: not part of the resume key.
    EXECUTION_FIELDS = ("batch_size", "cache_dir", "threads", "name", "progress")
    BASELINES = ("random_init",)  # a probe's Settings may offer more (e.g. majority, control)

    def validate(self, spec: "ProbeSpec") -> None:
        """Raise ConfigError for a bad value, before any data or model is loaded."""
        bad = [t for t in self.tasks if t not in spec.tasks]
        if bad or not self.tasks:
            raise ConfigError(f"unknown task(s) {bad}; {spec.name} tasks are {list(spec.tasks)}")
        if len(set(self.tasks)) != len(self.tasks):
            raise ConfigError(f"a task is listed twice in {list(self.tasks)}")
        bad = [b for b in self.baselines if b not in self.BASELINES]
        if bad:
            raise ConfigError(f"unknown baseline(s) {bad}; {spec.name} baselines are {list(self.BASELINES)}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.n_boot < 1:
            raise ConfigError(f"n_boot must be >= 1, got {self.n_boot}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"threads must be >= 1, got {self.threads}")
        if self.dtype not in COMPUTE_DTYPES:
            raise ConfigError(f"dtype must be one of {list(COMPUTE_DTYPES)}, got {self.dtype!r}")
        if self.cache_dtype not in CACHE_DTYPES:
            raise ConfigError(f"cache_dtype must be one of {list(CACHE_DTYPES)}, got {self.cache_dtype!r}")
        if self.stack is not None and self.stack not in STACK_NAMES:
            raise ConfigError(f"stack must be one of {list(STACK_NAMES)} (or unset), got {self.stack!r}")

    def as_config(self) -> dict[str, Any]:
        """The settings as plain JSON values (the manifest's config)."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def resume_key(self) -> dict[str, Any]:
        """What decides the rows: the settings without the execution-only fields. A field added later
        says, as metadata `key_omits`, the value that reproduces the old behaviour: at that value it is
        left out, so the keys of runs started before it existed still hold (e.g. `cache_dtype: fp32`)."""
        omitted = {f.name: f.metadata["key_omits"] for f in dataclasses.fields(self) if "key_omits" in f.metadata}
        return {k: v for k, v in self.as_config().items()
                if k not in self.EXECUTION_FIELDS and not (k in omitted and v == omitted[k])}


def _plain(value):
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def make_settings(cls: type[Settings], values: Mapping[str, Any] | None, where: str = "settings") -> Settings:
    """`cls(**values)` with every value coerced by its field's type, unknown keys refused
    (`workbench.coerce.build_dataclass`, the one coercion shared with the training configs).

    Accepts what YAML and the command line give: lists or comma-separated strings for tuple fields,
    "true"/"false" for booleans, numbers as strings.
    """
    return build_dataclass(cls, values, where)


# --------------------------------------------------------------------------- probe spec and units
@dataclass
class Prepared:
    """What a probe loads once per run: its data, the data files (checksummed in the manifest), notes."""

    data: Any = None
    files: list[Path] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Role:
    """An extra checkpoint a probe reads beside the probed one: a target model (align), a reference
    model (Carlini et al. 2021's reference attack), a teacher (distillation), shadow models (LiRA).

    `setting` is the Settings field naming it: a checkpoint folder, a Hub name in the local cache or
    (`many`) a list or comma-separated string of them, where a training folder gives every saved
    step; empty or None leaves the role out. `checkpoints(settings)`, when given, turns the setting
    into the checkpoints instead (membership: a shadow-set folder -> its models' checkpoints). The
    runner resolves the role with the probed checkpoints (before any work), loads it once per run
    and hands it to every unit (`unit.roles[name]`: a handle, a list of handles for `many`); its
    hash joins each unit's resume key. `used(settings)` says whether these settings read the role at
    all (e.g. only when the attack that needs it runs): an unused role is neither loaded nor keyed.

    `lazy`: the runner resolves and hashes the checkpoints (weight files only: their hashes join
    the resume key and the run's notes) but loads none; `unit.roles[name]` holds `RoleCheckpoint`s
    and the probe loads the ones it reads when it reads them (`.load()`). For a set a probe chooses
    from per unit and would not hold in memory at once: LiRA's shadow models, where the probed
    model's own training run is left out per unit and a fine-tuned target is compared with each
    shadow's step at the target's epoch. The key then covers every checkpoint the probe may read."""

    setting: str
    many: bool = False
    used: Callable[[Settings], bool] | None = None
    checkpoints: Callable[[Settings], Sequence[str | Path]] | None = None
    lazy: bool = False


@dataclass(frozen=True)
class RoleCheckpoint:
    """A checkpoint of a `lazy` role: resolved and hashed by the runner, loaded by the probe (`load`)."""

    checkpoint: Checkpoint
    checkpoint_hash: str  # `workbench.store.identity.weights_hash`: what a loaded handle's hash would be

    @property
    def name(self) -> str:
        return self.checkpoint.name

    @property
    def path(self) -> Path | None:
        return self.checkpoint.path

    def load(self):
        """The model handle (a fresh load each call: the probe decides what stays in memory)."""
        return self.checkpoint.handle if self.checkpoint.handle is not None else _load_handle(self.checkpoint)


@dataclass
class ProbeSpec:
    """A registered probe family (see the module docstring)."""

    name: str
    tasks: tuple[str, ...]
    settings: type[Settings]
    prepare: Callable[[Settings], Prepared]
    run_task: Callable[["Unit", Prepared, str, Settings], list[pd.DataFrame]]
    description: str = ""
    finish: Callable[[list["UnitResult"], Prepared, Settings], list[pd.DataFrame]] | None = None
    summary: Callable[[pd.DataFrame], str] | None = None
    default_tasks: tuple[str, ...] | None = None  # tasks when none are given (default: all)
    # cli_hook(parser) adds the probe's own options and returns apply(args, values): `values` holds the
    # settings given on the command line only (not the settings file's); apply edits it in place, and
    # the result then goes on top of the file's settings by the one override rule (a mapping merges
    # into the file's mapping), as every other option does.
    cli_hook: Callable[[argparse.ArgumentParser], Callable[[argparse.Namespace, dict], None]] | None = None
    # True (or a function of the settings saying so) when a twin's rows depend only on the twin
    # (weights, tokenizer), the settings and the run folder, not on the step it stands beside
    # (fine-tuned membership's do: the epoch picks the shadows' epoch). Then a sweep over one run's
    # steps probes its twin once.
    twin_once_per_run: bool | Callable[[Settings], bool] = False
    # Raised when a change to the probe's code alters its rows for unchanged settings (syntax 2:
    # the structural probe's learning-rate decay). Above 1 it joins experiment run keys and
    # resume keys, so results of the older code are recomputed instead of reused.
    version: int = 1
    # Extra checkpoints by role name (`Role`), e.g. {"reference": Role("reference")}.
    roles: Mapping[str, Role] = field(default_factory=dict)
    # check(checkpoints, settings): what the probe needs of every checkpoint (a corpus record, a
    # generating head, ...), raised as one ConfigError/CheckpointError before the run starts.
    check: Callable[[list[Checkpoint], Settings], None] | None = None
    # summary_frame(rows) -> DataFrame: the printed table's numbers as a frame, one row per (model,
    # stack, layer) (the Python API's `result.summary()`); None: the generic `layer_frame`.
    summary_frame: Callable[[pd.DataFrame], pd.DataFrame] | None = None

    def key_material(self) -> dict[str, int]:
        """What the probe's code adds to a run key: nothing at version 1 (keys stay as they were)."""
        return {"probe_version": self.version} if self.version > 1 else {}


@dataclass
class Unit:
    """One (model, stack): what `run_task` receives for each task of it.

    `handle` is the model handle itself (a probe may need its LM head or its loss; it never changes
    its weights: a changed model is a derived handle, `handle.derive(...)`, with its own hash);
    `activations(...)` gives cached all-layer word vectors of this model and stack; `roles` the
    probe's extra checkpoints (`ProbeSpec.roles`), loaded once per run.
    """

    model: str  # the row name: the checkpoint's name, "+ (random init)" for the twin
    handle: Any
    checkpoint: Checkpoint
    stack: str
    is_twin: bool
    probe: str
    settings: Settings
    notes: dict[str, Any]  # run-level notes (shared by every unit of the run)
    timings: dict[str, float] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict, repr=False)  # a probe's own per-unit memo
    roles: dict[str, Any] = field(default_factory=dict)  # role -> handle (a list for `many`; RoleCheckpoints if lazy)
    _acts: dict = field(default_factory=dict, repr=False)

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def progress(self) -> bool:
        return self.settings.progress

    @property
    def key(self) -> str:
        return f"{self.model}|{self.stack}"

    def activations(self, sentences: Sequence[Sequence[str]], dataset_key: str, pooling: str = "first"):
        """All-layer word vectors of `sentences` (lists of words) for this model and stack, cached on
        disk under `dataset_key` (name it after the data and its selection: same key = same words)."""
        from workbench.activations import extract

        memo = (dataset_key, pooling)
        if memo not in self._acts:
            t0 = time.perf_counter()
            self._acts[memo] = extract(self.handle, sentences, dataset_key, pooling=pooling, stack=self.stack,
                                       batch_size=self.settings.batch_size, cache_dir=self.settings.cache_dir,
                                       dtype=CACHE_DTYPES[self.settings.cache_dtype], progress=self.progress)
            self.timings[f"extract:{dataset_key}"] = round(time.perf_counter() - t0, 3)
        return self._acts[memo]

    def rows(self, task: str, metrics: Mapping[str, Sequence[float]], *, split: str, layers=None, n=None, ci=None,
             extra: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None) -> pd.DataFrame:
        """Tidy result rows of this unit (`rows.layer_rows` with the model's name, family, seed, step, stack);
        `extra`: one dict for every row or one per layer.

        Whole-model metrics (an attack's AUC, an accuracy at a sparsity): scalar values and no
        `layers` give one row per metric with layer NA."""
        from probes.core.rows import layer_rows

        whole_model = layers is None and bool(metrics) and all(np.ndim(v) == 0 for v in metrics.values())
        if whole_model:
            metrics = {k: [v] for k, v in metrics.items()}
            ci = {k: (np.atleast_1d(lo), np.atleast_1d(hi)) for k, (lo, hi) in (ci or {}).items()} or None
            layers = [0]  # a placeholder for layer_rows, replaced by NA below
        per_layer = isinstance(extra, Sequence) and not isinstance(extra, (str, Mapping))
        exs = [dict(e or {}) for e in extra] if per_layer else [dict(extra or {})]
        if self.is_twin:
            for e in exs:
                e["baseline"] = "random_init"
        ex = exs if per_layer else exs[0]
        ck = self.checkpoint
        family = ck.family or getattr(self.handle, "family", None)
        rows = layer_rows(metrics, probe=self.probe, task=task, split=split, layers=layers, n=n, ci=ci, extra=ex,
                          model=self.model, family=family, seed=ck.seed, step=ck.step, stack=self.stack)
        if whole_model:
            rows["layer"] = pd.array([pd.NA] * len(rows), dtype="Int64")
        return rows

    def log(self, message: str) -> None:
        if self.progress:
            get_logger(__name__).info(f"[{self.probe}] {self.key}: {message}")


@dataclass
class UnitResult:
    """A finished (model, stack, task), as the `finish` hook sees it."""

    model: str
    checkpoint: Checkpoint
    stack: str
    task: str
    is_twin: bool
    rows: pd.DataFrame


# --------------------------------------------------------------------------- running
def run_probe(probe: str | ProbeSpec, checkpoints: Sequence[Any], settings: Settings | Mapping[str, Any] | None = None,
              store=None) -> tuple[str, pd.DataFrame]:
    """Run one probe over checkpoints; one run in the results store. Returns (run_id, rows).

    checkpoints: checkpoint folders, training folders (every saved step), Hub names in the local
    cache, or open model handles. settings: the probe's Settings or a mapping of its fields.
    """
    from probes import get_probe

    spec = get_probe(probe) if isinstance(probe, str) else probe
    settings = resolve_settings(spec, settings, f"probe {spec.name}")
    ckpts = expand_checkpoints(checkpoints)
    for ck in ckpts:
        _check_stack(ck, settings.stack)
    if spec.check is not None:
        spec.check(ckpts, settings)
    roles = resolve_roles(spec, settings)
    with torch_threads(settings.threads):
        return _run(spec, ckpts, settings, store, roles)


def run_key(probe: str, checkpoints: Sequence[str], settings: Mapping[str, Any]) -> str:
    """The key a finished run is found by, so that asking again reuses it instead of recomputing:
    a hash of the probe's name, the checkpoints (as strings) and the settings, plus the probe's code
    version above 1 (`ProbeSpec.key_material`). `bertology run` names each run `<experiment>:<key>`
    (`app.experiments.plan_runs`), the Python API `<name>:<key>` (`bertology.probe`)."""
    import hashlib

    from probes import get_probe

    material = json.dumps([probe, list(checkpoints), dict(settings)], sort_keys=True, default=str)
    code = get_probe(probe).key_material()
    if code:
        material += json.dumps(code, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def resolve_roles(spec: ProbeSpec, settings: Settings) -> dict[str, list[Checkpoint]]:
    """Each used role's checkpoints (`Role`), resolved like `--checkpoint`; a ConfigError or
    CheckpointError naming the setting before anything loads."""
    out: dict[str, list[Checkpoint]] = {}
    for role, r in spec.roles.items():
        if not hasattr(settings, r.setting):
            raise ConfigError(f"probe {spec.name}: role {role!r} names setting {r.setting!r}, which its settings lack")
        value = getattr(settings, r.setting)
        if r.used is not None and not r.used(settings):
            continue
        if value is None or (isinstance(value, str) and not value.strip()) or (not isinstance(value, str) and not value):
            continue
        try:
            if r.checkpoints is not None:
                items = [str(v) for v in r.checkpoints(settings)]
            elif isinstance(value, str):
                items = [v.strip() for v in value.split(",") if v.strip()] if r.many else [value.strip()]
            else:
                items = [str(v) for v in value]
            # a lazy role's checkpoints never name rows: one at a time, so that folders of one name
            # in different runs (a fine-tuned set's `best`) may sit side by side; each folder once
            cks = (list({str(c.path.resolve()): c for item in items for c in expand_checkpoints([item])}.values())
                   if r.lazy else expand_checkpoints(items))
        except (CheckpointError, ConfigError) as e:
            raise type(e)(f"{r.setting} ({role}): {e}") from None
        except DataFormatError as e:  # a role's own listing file (a shadow set's shadows.json)
            raise ConfigError(f"{r.setting} ({role}): {e}") from None
        if not r.many and len(cks) != 1:
            raise ConfigError(f"{r.setting} ({role}): {value!r} holds {len(cks)} checkpoints; the {role} role takes "
                              f"one (name a step folder)")
        out[role] = cks
    return out


def load_roles(spec: ProbeSpec, roles: Mapping[str, list[Checkpoint]]) -> dict[str, Any]:
    """Every role's handles, each checkpoint loaded once (a folder named by two roles too); a lazy
    role's `RoleCheckpoint`s (hashed, not loaded)."""
    loaded: dict[str, Any] = {}
    out: dict[str, Any] = {}
    for role, cks in roles.items():
        if spec.roles[role].lazy:
            out[role] = [RoleCheckpoint(ck, ck.handle.checkpoint_hash if ck.handle is not None else weights_hash(ck.path))
                         for ck in cks]
            continue
        handles = []
        for ck in cks:
            key = str(Path(ck.path).resolve()) if ck.path is not None else id(ck.handle)
            if key not in loaded:
                loaded[key] = ck.handle if ck.handle is not None else _load_handle(ck)
            handles.append(loaded[key])
        out[role] = handles if spec.roles[role].many else handles[0]
    return out


def _role_key(role_handles: Mapping[str, Any]) -> str:
    """The roles' part of a unit's resume key: each role's checkpoint hash(es), '' without roles."""
    parts = []
    for role in sorted(role_handles):
        hs = role_handles[role] if isinstance(role_handles[role], list) else [role_handles[role]]
        parts.append(f"|{role}=" + ",".join(h.checkpoint_hash[:16] for h in hs))
    return "".join(parts)


def resolve_settings(spec: ProbeSpec, settings: Settings | Mapping[str, Any] | None, where: str) -> Settings:
    """Settings object from a mapping (or as given), default tasks filled in, validated."""
    if not isinstance(settings, Settings):
        settings = make_settings(spec.settings, settings, where)
    if not settings.tasks:
        settings = dataclasses.replace(settings, tasks=tuple(spec.default_tasks or spec.tasks))
    settings.validate(spec)
    if settings.dtype == "auto":  # resolved here, so manifests and resume keys name what ran
        settings = dataclasses.replace(settings, dtype=resolve_compute_dtype("auto", "cpu"))
    return settings


def _check_stack(ck: Checkpoint, stack: str | None) -> None:
    """A stack the checkpoint does not have fails here, from its config.json, before anything loads."""
    if stack in (None, "all"):
        return
    have = checkpoint_stacks(ck)
    if have is not None and stack not in have:
        raise ConfigError(f"{ck.name}: has stack(s) {list(have)}, not {stack!r}")


def checkpoint_stacks(ck: Checkpoint) -> tuple[str, ...] | None:
    """The stacks a checkpoint's handle will offer, read from config.json (None when unknown)."""
    if ck.handle is not None:
        return tuple(ck.handle.stacks)
    if ck.path is None or not (ck.path / "config.json").is_file():
        return None
    from workbench.running.runner import CAUSAL_MODEL_TYPES

    try:
        cfg = json.loads((ck.path / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{ck.path / 'config.json'}: unreadable ({e})") from e
    if cfg.get("is_encoder_decoder"):
        return ("encoder", "decoder")
    if cfg.get("model_type") in CAUSAL_MODEL_TYPES or cfg.get("is_decoder"):
        return ("decoder",)
    return ("encoder",)


@contextlib.contextmanager
def torch_threads(threads: int | None):
    """Set torch's intra-op thread count for a block and restore it afterwards (None: leave it)."""
    import torch

    if threads is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _run(spec: ProbeSpec, ckpts: list[Checkpoint], settings: Settings, store,
         roles: Mapping[str, list[Checkpoint]] | None = None) -> tuple[str, pd.DataFrame]:
    import torch

    from workbench.store.results import FinishedUnits, ResultsStore

    t_start = time.perf_counter()
    prepared = spec.prepare(settings)
    timings: dict[str, Any] = {"prepare": round(time.perf_counter() - t_start, 3)}
    t0 = time.perf_counter()
    role_handles = load_roles(spec, roles or {})
    role_key = _role_key(role_handles)
    if role_handles:
        timings["roles|load"] = round(time.perf_counter() - t0, 3)
    store = store if store is not None else ResultsStore()
    config = {"probe": spec.name, "checkpoints": [str(c.path) if c.path else c.name for c in ckpts],
              **settings.as_config()}
    notes: dict[str, Any] = dict(prepared.notes)
    notes.setdefault("random_init_twins", [])
    notes["torch_threads"] = torch.get_num_threads()
    notes["probe_version"] = spec.version  # what a reader reusing this run checks (app.reproduce.rows_lm)
    notes["compute_dtype"] = settings.dtype  # the forward's precision (settings' dtype, auto resolved)
    if role_handles:
        notes["roles"] = {role: [_role_record(ck, h) for ck, h in zip(roles[role], hs if isinstance(hs, list) else [hs])]
                          for role, hs in role_handles.items()}
    # Rerunning an interrupted command reuses its finished (model, stack, task) units.
    units = FinishedUnits(store, spec.name, {**settings.resume_key(), **spec.key_material()})
    records = [_checkpoint_record(c) for c in ckpts]
    frames: list[pd.DataFrame] = []
    results: list[UnitResult] = []
    twin_wanted = "random_init" in settings.baselines
    shared_twins: dict[tuple, tuple[str, dict[str, list[pd.DataFrame]]]] = {}  # (run, twin, stack) -> rows

    with store.start_run("probe", config, seeds={"probe": settings.seed}, data_files=prepared.files,
                         checkpoints=records, name=settings.name or spec.name) as run:
        for ck in progress(ckpts, desc="checkpoints", disable=not settings.progress or len(ckpts) < 2):
            t0 = time.perf_counter()
            handle = ck.handle if ck.handle is not None else _load_handle(ck)
            if getattr(handle, "compute_dtype", "fp32") != settings.dtype:  # the same model, run in that precision
                handle = handle.with_dtype(settings.dtype)
            timings[f"{ck.name}|load"] = round(time.perf_counter() - t0, 3)
            variants = [(ck.name, handle, False)]
            if twin_wanted:
                t0 = time.perf_counter()
                twin_seed = settings.seed + TWIN_SEED_OFFSET
                twin = handle.derive("random_init", {"seed": twin_seed})
                if all(torch.equal(a, b) for a, b in zip(twin.model.parameters(), handle.model.parameters())):
                    raise ConfigError(f"{ck.name}: its random-init twin (seed {twin_seed}) has the same weights")
                timings[f"{ck.name}|twin_init"] = round(time.perf_counter() - t0, 3)
                variants.append((ck.name + RANDOM_INIT_SUFFIX, twin, True))
                notes["random_init_twins"].append({"of": ck.name, "sha256": twin.checkpoint_hash, "seed": twin_seed})
            if settings.stack is not None and settings.stack != "all" and settings.stack not in handle.stacks:
                raise ConfigError(f"{ck.name}: has stack(s) {list(handle.stacks)}, not {settings.stack!r}")
            stacks = list(handle.stacks) if settings.stack == "all" else [settings.stack or handle.stacks[0]]
            for model_name, h, is_twin in variants:
                share_key = _shared_twin_key(spec, settings, ck, h) if is_twin else None
                for stk in stacks:
                    if share_key is not None and (share_key, stk) in shared_twins:
                        first, parts_by_task = shared_twins[(share_key, stk)]
                        notes["random_init_twins"][-1]["rows_copied_from"] = first
                        for task, parts in parts_by_task.items():
                            parts = [_relabel(p, model_name, ck) for p in parts]
                            for part in parts:
                                run.add(part)
                                frames.append(part)
                            results.append(UnitResult(model_name, ck, stk, task, is_twin,
                                                      pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()))
                        continue
                    unit = Unit(model_name, h, ck, stk, is_twin, spec.name, settings, notes, roles=role_handles)
                    parts_by_task = {}
                    if share_key is not None:
                        shared_twins[(share_key, stk)] = (model_name, parts_by_task)
                    for task in progress(settings.tasks, desc=f"tasks {model_name}", disable=not settings.progress,
                                     leave=False):
                        name = f"{model_name}|{stk}|{task}|{h.checkpoint_hash[:16]}{role_key}"
                        saved = units.load(name)
                        if saved is not None:
                            unit.log(f"{task} reused from an interrupted attempt")
                            parts = [saved]
                        else:
                            t1 = time.perf_counter()
                            parts = _as_frames(spec.run_task(unit, prepared, task, settings), spec.name, task)
                            units.save(name, parts)
                            unit.timings[f"{task}:total"] = round(time.perf_counter() - t1, 3)
                            unit.log(f"{task} {unit.timings[f'{task}:total']:.1f} s")
                        parts_by_task[task] = parts
                        for part in parts:
                            run.add(part)
                            frames.append(part)
                        results.append(UnitResult(model_name, ck, stk, task, is_twin,
                                                  pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()))
                    timings[unit.key] = unit.timings
        if spec.finish is not None:
            for part in _as_frames(spec.finish(results, prepared, settings), spec.name, "finish"):
                run.add(part)
                frames.append(part)
        timings["total"] = round(time.perf_counter() - t_start, 3)
        notes["reused_units"] = units.reused
        for k, v in notes.items():
            run.note(k, v)
        run.note("timings_s", timings)
        run_id = run.finish()
    units.discard()
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    rows["run_id"] = run_id
    return run_id, rows


def _as_frames(out, probe: str, task: str) -> list[pd.DataFrame]:
    frames = [out] if isinstance(out, pd.DataFrame) else list(out or [])
    if not all(isinstance(f, pd.DataFrame) for f in frames):
        raise TypeError(f"probe {probe}, task {task}: run_task must return DataFrames (use unit.rows)")
    return frames


def _shared_twin_key(spec: ProbeSpec, settings: Settings, ck: Checkpoint, twin) -> tuple | None:
    """(training folder, twin fingerprint) when this probe may reuse a twin's rows across the steps
    of one run, else None. The fingerprint (weights + tokenizer + window) guards against a folder
    whose steps do not share them."""
    from workbench.activations import model_fingerprint

    once = spec.twin_once_per_run
    if not (once(settings) if callable(once) else once) or ck.path is None:
        return None
    return (str(Path(ck.path).resolve().parent), model_fingerprint(twin))


def _relabel(rows: pd.DataFrame, model_name: str, ck: Checkpoint) -> pd.DataFrame:
    """A twin's rows, labelled as the twin of another step of the same run."""
    rows = rows.copy()
    rows["model"] = model_name
    for col, value in (("step", ck.step), ("seed", ck.seed)):
        if col in rows.columns:
            rows[col] = value
    return rows


def _checkpoint_record(ck: Checkpoint):
    """What the run manifest records of a probed checkpoint: the handle, or the folder, plus the
    lineage of a checkpoint made from another (its manifest's `derived_from`)."""
    if ck.handle is not None:
        lineage = getattr(ck.handle, "lineage", None)
        if lineage is None:
            return ck.handle
        return {"path": None, "sha256": ck.handle.checkpoint_hash, "family": ck.handle.family,
                "derived_from": lineage.record(), "lineage": lineage.describe()}
    from workbench.store.checkpoints import read_manifest
    from workbench.running.models import Lineage

    derived = (read_manifest(ck.path) or {}).get("derived_from") if ck.path is not None else None
    if derived is None:
        return ck.path
    lineage = Lineage.from_record(derived, str(ck.path))
    return {"path": ck.path, "derived_from": derived, "lineage": lineage.describe()}


def _role_record(ck: Checkpoint, handle) -> dict[str, Any]:
    return {"name": ck.name, "path": None if ck.path is None else str(Path(ck.path).resolve()),
            "sha256": handle.checkpoint_hash}


def _load_handle(ck: Checkpoint):
    from workbench.running.models import ModelHandle

    return ModelHandle.load(ck.path)


# --------------------------------------------------------------------------- summary table
def layer_frame(rows: pd.DataFrame, max_metrics: int | None = None) -> pd.DataFrame:
    """The generic per-layer summary as a frame: one row per (model, stack, layer), twins included,
    one column per "task metric" (NaN where a block lacks it); `format_layer_table` prints it."""
    blocks = [block.assign(model=model, stack=stack)
              for (model, stack), block in _layer_blocks(rows, max_metrics)]
    if not blocks:
        return pd.DataFrame(columns=["model", "stack", "layer"])
    frame = pd.concat(blocks, ignore_index=True)
    return frame[["model", "stack", "layer", *[c for c in frame.columns if c not in ("model", "stack", "layer")]]]


def _layer_blocks(rows: pd.DataFrame, max_metrics: int | None) -> list[tuple[tuple, pd.DataFrame]]:
    """((model, stack), layers x "task metric" frame) per model block, metrics in row order."""
    if rows is None or len(rows) == 0:
        return []
    df = rows[rows["layer"].notna()]
    out = []
    for key, sub in df.groupby(["model", "stack"], sort=False, dropna=False):
        cols = list(dict.fromkeys(zip(sub["task"], sub["metric"])))[:max_metrics]
        layers = sorted(set(sub["layer"].astype(int)))
        data: dict[str, list] = {"layer": layers}
        for t, m in cols:
            values = []
            for layer in layers:
                v = sub[(sub["layer"] == layer) & (sub["task"] == t) & (sub["metric"] == m)]["value"]
                values.append(float("nan") if v.empty or pd.isna(v.iloc[0]) else float(v.iloc[0]))
            data[f"{t} {m}"] = values
        out.append((key, pd.DataFrame(data)))
    return out


def format_layer_table(rows: pd.DataFrame, max_metrics: int = 8) -> str:
    """A generic per-layer summary: one block per model (twins included), layers x (task metric) columns."""
    if rows is None or len(rows) == 0:
        return "(no rows)"
    blocks = []
    for (model, stack), block in _layer_blocks(rows, max_metrics):
        table = [list(block.columns)] + [[str(int(r[0]))] + ["-" if pd.isna(x) else f"{float(x):.3f}" for x in r[1:]]
                                         for r in block.itertuples(index=False)]
        suffix = f" [{stack}]" if isinstance(stack, str) else ""
        blocks.append(f"== {model}{suffix}\n" + aligned(table))
    return "\n\n".join(blocks) if blocks else "(no per-layer rows)"


def aligned(table: list[list[str]]) -> str:
    """Rows of cells as right-aligned text columns (the first column left-aligned)."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in table)


# --------------------------------------------------------------------------- command line
def build_parser(spec: ProbeSpec) -> tuple[argparse.ArgumentParser, Callable | None]:
    """`bertology probe NAME` options: the checkpoints, the runs root, and one option per settings field."""
    p = argparse.ArgumentParser(prog=f"bertology probe {spec.name}", description=spec.description or None)
    p.add_argument("--checkpoint", action="append", required=True, metavar="CKPT[,CKPT...]",
                   help="checkpoint folder(s), training folder(s) (every saved step) or Hub name(s) in the "
                        "local Hugging Face cache; repeatable")
    p.add_argument("--config", default=None, help="a YAML file of settings (command-line options override it)")
    p.add_argument("--runs-root", default=None, help="results store root (default $BERTOLOGY_RUNS or ./runs)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--figures", default=None, metavar="NAME[,NAME...]",
                   help="figures to render from this run (experiments/figures/NAME.yaml), e.g. "
                        "training_time_heatmap after probing a training folder")
    for f in dataclasses.fields(spec.settings):
        if not f.init or f.metadata.get("cli") is False:
            continue
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata.get("help", "")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if f.name == "tasks":
            help_ += f"; tasks: {','.join(spec.tasks)}"
        shown = ",".join(map(str, default)) if isinstance(default, tuple) else default
        if str(f.type).startswith("bool"):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=f"{help_} (default {shown})")
        elif str(f.type).startswith(("dict", "Mapping")):
            p.add_argument(flag, default=None, metavar="YAML", help=f"{help_} (a YAML mapping, default {shown})")
        else:
            p.add_argument(flag, default=None, help=f"{help_} (default {shown!r})" if help_ else f"default {shown!r}")
    apply = spec.cli_hook(p) if spec.cli_hook else None
    return p, apply


def cli_main(name: str, argv: Sequence[str] | None = None,
             render_figures: Callable[[list[str], str, Any], None] | None = None) -> int:
    """`bertology probe NAME ...`: run, then print the run id and the probe's summary table.

    Bad input raises a WorkbenchError; the caller (`app.cli.main`, `workbench.errors.cli_errors`)
    turns it into one line on stderr and exit status 2. `render_figures(names, run_id, store)` draws
    the `--figures` from the new run (the app layer passes it: probes do not draw).
    """
    import yaml

    from probes import get_probe
    from workbench.paths import CACHE_ENV
    from workbench.store.results import ResultsStore

    spec = get_probe(name)
    parser, apply = build_parser(spec)
    args = parser.parse_args(list(argv) if argv is not None else None)
    from_file: dict[str, Any] = {}
    if args.config:
        from_file = read_yaml(args.config, "settings file")
        make_settings(spec.settings, from_file, str(args.config))  # a bad key or value is named with the file
    values: dict[str, Any] = {}  # the command line's, on top of the file's by the one override rule
    hints = typing.get_type_hints(spec.settings)
    for f in dataclasses.fields(spec.settings):
        got = getattr(args, f.name, None)
        if got is None:
            continue
        option = "--" + f.name.replace("_", "-")
        if str(f.type).startswith(("dict", "Mapping")):
            try:
                got = yaml.safe_load(got)
            except yaml.YAMLError as e:
                raise ConfigError(f"{option}: not a YAML mapping ({yaml_problem(e)})") from None
        coerce_value(got, hints[f.name], "command line", option)  # a bad value is named with its option
        values[f.name] = got
    if args.quiet:
        values["progress"] = False
    if apply is not None:
        apply(args, values)
    values = apply_overrides(from_file, values, "command line")
    store = ResultsStore(args.runs_root)
    if args.runs_root and "cache_dir" not in values and not __import__("os").environ.get(CACHE_ENV):
        values["cache_dir"] = str(Path(args.runs_root) / "cache" / "activations")
    checkpoints = [c.strip() for arg in args.checkpoint for c in arg.split(",") if c.strip()]
    run_id, rows = run_probe(spec, checkpoints, values, store=store)
    print(f"run {run_id}: {len(rows)} rows in {store.root}")
    print((spec.summary or format_layer_table)(rows))
    if args.figures:
        if render_figures is None:
            raise ConfigError("--figures needs the bertology command line (figures are drawn by app/figures.py)")
        render_figures([f.strip() for f in args.figures.split(",") if f.strip()], run_id, store)
    return 0
