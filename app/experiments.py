"""The experiment runner behind `bertology run EXPERIMENT.yaml`.

An experiment YAML names a training config (or a list of existing checkpoints), the probes to run
with their settings, and optionally a sweep:

    name: pooling-sweep
    checkpoints: [runs/train/a/seed-0, sentence-transformers/all-MiniLM-L6-v2]
    runs_per: checkpoint            # one run per checkpoint (default `experiment`: one run over all)
    probe:
      syntax: {tasks: [upos], max_train_sentences: 2000}
    sweep:                          # a grid over any probe setting ("syntax.pooling" for one probe only)
      pooling: [first, mean]
      seed: [0, 1]

The runner expands it into runs (checkpoint group x probe x grid point), each keyed by a hash of its
probe, checkpoints and settings and named `<experiment>:<key>` in the results store. A run whose
key is already in the store is skipped; an interrupted one resumes from its finished units
(`probes.core.runner`); so after a crash, a kill -9 or Ctrl-C the same command finishes the rest. Runs are
independent: they are the units of the one executor layer (`workbench.drivers.executor`): `--jobs N` runs
N at once in local processes, `--executor submitit-local` or `--executor slurm` hands each to
submitit (one job per run, results written to the shared runs root; the store is safe for
concurrent writers), through the same `execute_run` function.
Every number lands in the results store with its manifest, so the tables printed here and any
figure drawn later come from the same rows.
"""

from __future__ import annotations

from pathlib import Path

from workbench.errors import ConfigError
from workbench.io import read_yaml
from workbench.progress import get_logger

KNOWN_KEYS = {"name", "train", "checkpoints", "prune", "probe", "quick", "sweep", "runs_per"}
SOURCES = ("train", "checkpoints", "prune")  # where the probed checkpoints come from: exactly one


def load_experiment(path: str | Path) -> dict:
    path = Path(path)
    spec = read_yaml(path, "experiment file")
    if spec.get("kind") == "probe":  # one probe's settings file (e.g. experiments/probe_syntax.yaml)
        spec = _single_probe(spec, path)
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; expected {sorted(KNOWN_KEYS)}")
    if sum(k in spec for k in SOURCES) != 1:
        raise ConfigError(f"{path}: give exactly one of 'train' (a training config), 'checkpoints' (a list) or "
                          f"'prune' (a bertology prune config: every point is probed)")
    if "prune" in spec:  # checked now, before anything is trained
        from workbench.drivers.prune_sweep import load_prune_config

        load_prune_config(path.resolve().parent / spec["prune"])
    from probes import get_probe, probe_names

    if not spec.get("probe"):
        raise ConfigError(f"{path}: no probe given (probe: {{NAME: {{settings}}}})")
    if spec.get("runs_per", "experiment") not in ("experiment", "checkpoint"):
        raise ConfigError(f"{path}: runs_per must be 'experiment' or 'checkpoint', not {spec['runs_per']!r}")
    sweep = spec.get("sweep") or {}
    if not isinstance(sweep, dict) or not all(isinstance(v, list) and v for v in sweep.values()):
        raise ConfigError(f"{path}: sweep must map settings to non-empty lists of values")
    for probe in spec["probe"]:
        if probe not in probe_names():
            raise ConfigError(f"{path}: probe.{probe}: unknown probe; available: {probe_names()}")
        for point in _grid(sweep, probe):  # every grid point is checked now, before any work
            _check_settings(get_probe(probe), dict(spec["probe"][probe] or {}, **point), f"{path}: probe.{probe}")
    spec["_dir"] = path.resolve().parent
    return spec


def _grid(sweep: dict, probe: str) -> list[dict]:
    """The grid points of a sweep that apply to one probe (`setting` or `probe.setting` keys)."""
    import itertools

    axes = {}
    for key, values in sweep.items():
        target, _, setting = key.rpartition(".")
        if target in ("", probe):
            axes[setting] = values
    return [dict(zip(axes, combo)) for combo in itertools.product(*axes.values())] if axes else [{}]


def _single_probe(spec: dict, path: Path) -> dict:
    """`kind: probe, probe: NAME, checkpoints: [...], <settings>` -> the experiment form."""
    settings = {k: v for k, v in spec.items() if k not in ("kind", "probe", "checkpoints", "checkpoint", "name")}
    checkpoints = spec.get("checkpoints", spec.get("checkpoint"))
    if not isinstance(spec.get("probe"), str) or checkpoints is None:
        raise ConfigError(f"{path}: a `kind: probe` file needs `probe: NAME` and `checkpoints`")
    checkpoints = [checkpoints] if isinstance(checkpoints, str) else list(checkpoints)
    return {"name": spec.get("name", path.stem), "checkpoints": checkpoints, "probe": {spec["probe"]: settings}}


def _check_settings(probe_spec, settings: dict, where: str) -> None:
    """Name a misspelt key or a bad value in the YAML before anything is trained or loaded."""
    from probes.core.runner import resolve_settings

    resolve_settings(probe_spec, {k: v for k, v in settings.items() if k != "checkpoints"}, where)


def _checkpoints_from_training(spec: dict, quick: bool, which: str) -> list[Path]:
    from workbench.drivers.train import list_checkpoints, train_from_config

    train = spec["train"]
    source = str(spec["_dir"] / train) if isinstance(train, str) else train
    overrides = dict(spec.get("quick", {}).get("train", {})) if quick else {}
    if quick:
        overrides.setdefault("name", f"{spec.get('name', 'experiment')}-quick")
    if spec.get("_precision"):  # `bertology run --precision`: its own run folder (a different training hash)
        base = overrides.get("name") or (Path(source).stem if isinstance(source, str) else source.get("name", "run"))
        overrides.update(precision=spec["_precision"], cpu_bf16=False, name=f"{base}_{spec['_precision']}")
    finals = train_from_config(source, overrides)
    if which == "last":
        return finals
    if which == "all":
        return [p for final in finals for _, p in list_checkpoints(final.parent)]
    raise ConfigError(f"probe checkpoints must be 'last' or 'all', not {which!r}")


def _checkpoints_from_pruning(spec: dict, quick: bool) -> list[Path]:
    """Run the prune sweep (resuming its finished points) and return every point's checkpoint, the
    full fine-tuned models first (the probe's rows then hold each sparsity / bits / rank)."""
    from workbench.drivers.prune_sweep import load_prune_config, run_prune

    overrides = dict(spec.get("quick", {}).get("prune", {})) if quick else {}
    cfg, ft = load_prune_config(spec["_dir"] / spec["prune"], overrides)
    if not cfg.keep_checkpoints:
        raise ConfigError(f"{spec['_dir'] / spec['prune']}: keep_checkpoints: false drops the points' weights; "
                          f"probing them needs keep_checkpoints: true")
    points = run_prune(cfg, ft).points
    return [Path(p["checkpoint"]) for p in sorted(points, key=lambda p: p["method"] != "full")]


def plan_runs(spec: dict, quick: bool = False) -> list[dict]:
    """The experiment's runs: one dict per (checkpoint group, probe, grid point), with its key."""
    from probes.core.runner import run_key

    out = []
    for probe_name, settings in spec["probe"].items():
        settings = dict(settings or {})
        which = settings.pop("checkpoints", "last")
        if "train" in spec:
            checkpoints = [str(p) for p in _checkpoints_from_training(spec, quick, which)]
        elif "prune" in spec:
            checkpoints = [str(p) for p in _checkpoints_from_pruning(spec, quick)]
        else:
            # relative to the YAML file when that exists, else as given (a path from here or a Hub name)
            checkpoints = [str(spec["_dir"] / c) if (spec["_dir"] / c).exists() else str(c) for c in spec["checkpoints"]]
        if quick:
            settings.update(spec.get("quick", {}).get("probe", {}))
        groups = [[c] for c in checkpoints] if spec.get("runs_per") == "checkpoint" else [checkpoints]
        for group in groups:
            for point in _grid(spec.get("sweep") or {}, probe_name):
                run_settings = dict(settings, **point)
                key = run_key(probe_name, group, run_settings)
                out.append({"experiment": spec.get("name", "experiment"), "key": key, "probe": probe_name,
                            "checkpoints": group, "settings": run_settings, "point": point})
    return out


def execute_run(job: dict, runs_root: str | None = None, progress: bool = True) -> str:
    """Run one planned run (in this process, a local worker or a submitit job) and return its run id."""
    from probes import get_probe
    from probes.core.runner import run_probe
    from workbench.store.results import ResultsStore

    settings = dict(job["settings"], name=f"{job['experiment']}:{job['key']}")
    settings.setdefault("progress", progress)
    run_id, _ = run_probe(get_probe(job["probe"]), job["checkpoints"], settings, store=ResultsStore(runs_root))
    return run_id


def _done(store, job: dict) -> str | None:
    runs = store.runs(name=f"{job['experiment']}:{job['key']}")
    return None if runs.empty else str(runs["run_id"].iloc[-1])


def run_experiment(path: str | Path, quick: bool = False, jobs: int | None = None, executor="local",
                   runs_root: str | None = None, slurm: dict | None = None, precision: str | None = None) -> int:
    """Train (or take the listed checkpoints), run every planned probe run not already in the store,
    print each run's table (one run) or where the results are (a sweep). `precision` (auto | fp32 |
    bf16) overrides the training config's, in a run folder named after it. The runs are the
    executor's units (`executor` a name with `jobs`, or `workbench.drivers.executor.ExecutorOptions`;
    `slurm`: further submitit parameters, e.g. timeout_min, slurm_partition)."""
    import dataclasses

    from probes import get_probe
    from probes.core.runner import format_layer_table
    from workbench.drivers.executor import Unit, resolve_options, run_driver_units
    from workbench.store.results import ResultsStore

    options = resolve_options(executor, jobs)
    if slurm:
        options = dataclasses.replace(options, slurm={**options.slurm, **slurm}).validate()
    spec = load_experiment(path)
    if precision is not None:
        from workbench.precision import PRECISIONS

        if precision not in PRECISIONS:
            raise ConfigError(f"--precision must be one of {PRECISIONS}, got {precision!r}")
        if "train" not in spec:
            raise ConfigError(f"{path}: --precision applies to experiments that train (a `train:` key)")
        spec["_precision"] = precision
    store = ResultsStore(runs_root)
    plan = plan_runs(spec, quick)
    done = {job["key"]: _done(store, job) for job in plan}
    todo = [job for job in plan if done[job["key"]] is None]
    if len(plan) > 1:
        get_logger(__name__).info(f"{spec.get('name', path)}: {len(plan)} runs planned, {len(plan) - len(todo)} "
                                  f"already in the store, {len(todo)} to run")

    def units(parallel: bool) -> list:
        if not parallel:
            return [Unit(execute_run, (job, runs_root), {"progress": len(todo) < 2}, name=job["key"]) for job in todo]
        # parallel runs share the cores: one torch thread each unless the config says otherwise
        root = runs_root if options.executor == "local" else str(store.root)
        return [Unit(execute_run, (dict(job, settings=_one_thread(job["settings"])), root, False), name=job["key"])
                for job in todo]

    ran = run_driver_units(units, len(todo), options, store.root, str(spec.get("name", "experiment")), desc="runs")
    done.update({job["key"]: run_id for job, run_id in zip(todo, ran)})
    if len(plan) == 1:
        run_id = done[plan[0]["key"]]
        probe_spec = get_probe(plan[0]["probe"])
        rows = store.read(run_id)
        print(f"\n{plan[0]['probe']} probes: run {run_id} ({len(rows)} rows; `bertology runs show {run_id}`)")
        print((probe_spec.summary or format_layer_table)(rows))
    else:
        print(f"results: {store.root} ({len(plan)} runs named '{spec.get('name', 'experiment')}:<key>')")
        for job in plan:
            point = ", ".join(f"{k}={v}" for k, v in job["point"].items())
            print(f"  {done[job['key']]}  {job['probe']}  {','.join(job['checkpoints'])}  {point}")
    return 0


def _one_thread(settings: dict) -> dict:
    """Parallel runs share the cores: one torch thread each unless the config says otherwise."""
    return dict(settings) if "threads" in settings else dict(settings, threads=1)
