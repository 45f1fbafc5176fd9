"""The experiment runner behind `bertology run EXPERIMENT.yaml`.

An experiment YAML names a training config (or a list of existing checkpoints) and the probes to
run on the result; the runner trains (resuming if the checkpoints exist), probes, and prints the
per-layer table. Every number lands in the results store with its manifest, so the table printed
here and any figure drawn later come from the same rows.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from workbench.errors import ConfigError

KNOWN_KEYS = {"name", "train", "checkpoints", "probe", "quick"}
PROBES = {"syntax"}


def load_experiment(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: experiment file not found")
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(spec, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    unknown = set(spec) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) {sorted(unknown)}; expected {sorted(KNOWN_KEYS)}")
    if ("train" in spec) == ("checkpoints" in spec):
        raise ConfigError(f"{path}: give exactly one of 'train' (a training config) or 'checkpoints' (a list)")
    for probe in spec.get("probe", {}):
        if probe not in PROBES:
            raise ConfigError(f"{path}: probe.{probe}: unknown probe; available: {sorted(PROBES)}")
    spec["_dir"] = path.resolve().parent
    return spec


def _check_settings(function, settings: dict, where: str) -> None:
    """Name a misspelt key in the YAML instead of failing later with a TypeError."""
    import inspect

    accepted = set(inspect.signature(function).parameters) - {"checkpoints", "store"}
    unknown = sorted(set(settings) - accepted)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; accepted: {sorted(accepted)}")


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
            checkpoints = [Path(spec["_dir"] / c) for c in spec["checkpoints"]]
        if quick:
            settings.update(spec.get("quick", {}).get("probe", {}))
        if probe_name == "syntax":
            from probes.syntax import format_layer_table, run_syntax_probes

            _check_settings(run_syntax_probes, settings, f"{path}: probe.syntax")
            run_id, rows = run_syntax_probes(checkpoints, **settings)
            print(f"\nsyntax probes: run {run_id} ({len(rows)} rows; `bertology runs show {run_id}`)")
            print(format_layer_table(rows))
    return 0
