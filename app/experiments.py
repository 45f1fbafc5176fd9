"""The experiment runner behind `bertology run EXPERIMENT.yaml`.

An experiment YAML names a training config (or a list of existing checkpoints) and the probes to
run on the result; the runner trains (resuming if the checkpoints exist), probes, and prints the
per-layer table. Every number lands in the results store with its manifest, so the table printed
here and any figure drawn later come from the same rows.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from workbench.errors import ConfigError, yaml_problem

KNOWN_KEYS = {"name", "train", "checkpoints", "probe", "quick"}


def load_experiment(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: experiment file not found")
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {yaml_problem(err)}") from None
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    if spec.get("kind") == "probe":  # one probe's settings file (e.g. experiments/probe_syntax.yaml)
        spec = _single_probe(spec, path)
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; expected {sorted(KNOWN_KEYS)}")
    if ("train" in spec) == ("checkpoints" in spec):
        raise ConfigError(f"{path}: give exactly one of 'train' (a training config) or 'checkpoints' (a list)")
    from probes import get_probe, probe_names

    for probe in spec.get("probe", {}):
        if probe not in probe_names():
            raise ConfigError(f"{path}: probe.{probe}: unknown probe; available: {probe_names()}")
        _check_settings(get_probe(probe), dict(spec["probe"][probe] or {}), f"{path}: probe.{probe}")
    spec["_dir"] = path.resolve().parent
    return spec


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
    from probes.runner import resolve_settings

    resolve_settings(probe_spec, {k: v for k, v in settings.items() if k != "checkpoints"}, where)


def _checkpoints_from_training(spec: dict, quick: bool, which: str) -> list[Path]:
    from workbench.train import list_checkpoints, train_from_config

    train = spec["train"]
    source = str(spec["_dir"] / train) if isinstance(train, str) else train
    overrides = dict(spec.get("quick", {}).get("train", {})) if quick else {}
    if quick:
        overrides.setdefault("name", f"{spec.get('name', 'experiment')}-quick")
    finals = train_from_config(source, overrides)
    if which == "last":
        return finals
    if which == "all":
        return [p for final in finals for _, p in list_checkpoints(final.parent)]
    raise ConfigError(f"probe checkpoints must be 'last' or 'all', not {which!r}")


def run_experiment(path: str | Path, quick: bool = False) -> int:
    """Train (or take the listed checkpoints), run each probe, print its per-layer table."""
    spec = load_experiment(path)
    probes = spec.get("probe", {})
    for probe_name, settings in probes.items():
        settings = dict(settings or {})
        which = settings.pop("checkpoints", "last")
        if "train" in spec:
            checkpoints = _checkpoints_from_training(spec, quick, which)
        else:
            # relative to the YAML file when that exists, else as given (a path from here or a Hub name)
            checkpoints = [spec["_dir"] / c if (spec["_dir"] / c).exists() else c for c in spec["checkpoints"]]
        if quick:
            settings.update(spec.get("quick", {}).get("probe", {}))
        from probes import get_probe
        from probes.runner import format_layer_table, run_probe

        probe_spec = get_probe(probe_name)
        run_id, rows = run_probe(probe_spec, checkpoints, settings)
        print(f"\n{probe_name} probes: run {run_id} ({len(rows)} rows; `bertology runs show {run_id}`)")
        print((probe_spec.summary or format_layer_table)(rows))
    return 0
