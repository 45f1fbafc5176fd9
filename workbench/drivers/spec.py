"""The driver contract, beside the probe contract (`probes.core.runner.ProbeSpec`).

A *driver* trains or changes models and writes rows: fine-tuning (`bertology finetune`), task
distillation and pretraining distillation (`bertology distill`), the compression sweep
(`bertology prune`), the PEFT sweep (`bertology peft`). Each says only what is specific to it:

    Config dataclass            its settings; a field whose value does not change the results (a
                                folder, a display name, the device, threads, progress) carries
                                `field(..., metadata=NOT_IDENTITY)`; a field that counts only in
                                some configs carries `metadata={"identity": predicate}` with
                                `predicate(config) -> bool` (fine-tuning's method options count only
                                for the method that reads them)
    load(source, overrides)     `load_config` + its own validation, before any work
    run(config, store, executor=ExecutorOptions)   its independent units through `workbench.drivers.executor`
    DRIVER = DriverSpec(...)    registered in `DRIVERS` below

The run's identity is computed generically (`identity`, `identity_hash`): every identity field,
as plain JSON values, hashed by `workbench.coerce.settings_hash` (sha256 of the sorted JSON). The
hand-kept "not part of the key" lists the drivers had are these metadata now; the hashes and keys
they gave are unchanged (tests/test_drivers.py compares them with the ones the old code gave for
every example config under experiments/).

One override rule (`load_config`) for every driver's YAML: the file (or a mapping, or a config
object) is read, then each override replaces the key of the same name; an override whose value is
None (a flag not given) changes nothing; a dotted key `section.key` replaces `key` inside the
mapping field `section` (`finetune.checkpoint` = the prune and PEFT sweeps' --checkpoint). Then the
mapping is coerced field by field (`workbench.coerce.build_dataclass`: unknown keys and bad
values are one ConfigError naming the file and the key).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workbench.coerce import build_dataclass, settings_hash
from workbench.errors import ConfigError

IDENTITY = "identity"
NOT_IDENTITY = {IDENTITY: False}  # field metadata: this field does not change the results


# ------------------------------------------------------------------------------------- identity

def identity_fields(config) -> list[str]:
    """The names of the config's fields that count for its identity (their metadata, the config's values)."""
    names = []
    for f in dataclasses.fields(config):
        rule = f.metadata.get(IDENTITY, True)
        if rule is False or (callable(rule) and not rule(config)):
            continue
        names.append(f.name)
    return names


def identity(config, **derived: Any) -> dict[str, Any]:
    """The config's identity: its identity fields as plain values (`dataclasses.asdict`'s). `derived`
    gives a field's value by what stands for it (the prune sweep's `finetune` mapping is replaced by
    the fine-tuning's own identity: its training hash, checkpoint and seeds)."""
    values = dataclasses.asdict(config)
    return {name: (derived[name] if name in derived else copy.deepcopy(values[name]))
            for name in identity_fields(config)}


def identity_hash(config, **derived: Any) -> str:
    """`settings_hash` of `identity(config, **derived)`: equal settings, equal hash (run folders,
    resume keys)."""
    return settings_hash(identity(config, **derived))


# ------------------------------------------------------------------------------------- loading

def load_config(cls: type, source: str | Path | Mapping | Any, overrides: Mapping[str, Any] | None = None,
                label: str = "config") -> tuple[Any, str]:
    """(config, where): `cls` built from a YAML file, a mapping or a config object, with `overrides`
    applied by the one rule of the module docstring. `where` names the source in messages (the
    file, "<label>" for a mapping, "<config>" for an object)."""
    from workbench.io import read_yaml

    if isinstance(source, cls):
        data, where = dataclasses.asdict(source), "<config>"
    elif isinstance(source, Mapping):
        data, where = dict(source), label
    else:
        where = str(source)
        data = read_yaml(Path(source))
    data = apply_overrides(data, overrides, where)
    return build_dataclass(cls, data, where), where


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any] | None, where: str = "config") -> dict:
    """`data` with `overrides` on top (module docstring: None changes nothing; `a.b` sets key b of mapping a)."""
    out = dict(data)
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        section, dot, inner = key.partition(".")
        if not dot:
            out[key] = value
            continue
        nested = out.get(section)
        if nested is None:
            nested = {}
        if not isinstance(nested, Mapping):
            raise ConfigError(f"{where}: {section}: expected a mapping (to set {inner}), got {nested!r}")
        out[section] = {**nested, inner: value}
    return out


# ------------------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class DriverSpec:
    """A registered driver (module docstring)."""

    name: str
    config: type
    load: Callable[..., Any]          # (source, overrides=None) -> a validated config
    run: Callable[..., Any]           # (config, store=None, executor=ExecutorOptions | None) -> its result
    units: str                        # what its independent units are, for messages: "seeds", "points", ...
    description: str = ""
    identity: Callable[[Any], Any] | None = None  # the run's identity when it is not `identity_hash(config)`

    def run_identity(self, config) -> Any:
        return (self.identity or identity_hash)(config)


# name -> (module defining DRIVER, one-line description); imported only when used (they pull in torch)
DRIVERS: dict[str, tuple[str, str]] = {
    "finetune": ("workbench.drivers.finetune", "fine-tune a checkpoint on a classification task over seeds"),
    "distill": ("workbench.drivers.distill", "distil a fine-tuned classifier into smaller students (a sweep)"),
    "distill_pretraining": ("workbench.drivers.distill_pretraining",
                            "DistilBERT-style pretraining distillation (bertology distill, kind: pretraining)"),
    "peft": ("probes.peft_change",
             "fine-tune with every method (full, head, bitfit, adapter, prompt, lora); CKA per layer"),
    "prune": ("workbench.drivers.prune_sweep",
              "compression sweep: lottery tickets, quantization, low rank (bertology prune CONFIG.yaml)"),
}


def driver_names() -> list[str]:
    return list(DRIVERS)


def describe(name: str) -> str:
    """The driver's one-line description (`bertology --help`), without importing it."""
    if name not in DRIVERS:
        raise ConfigError(f"unknown driver {name!r}; available: {', '.join(DRIVERS)}")
    return DRIVERS[name][1]


def get_driver(name: str) -> DriverSpec:
    """The DriverSpec registered as `name` (ConfigError naming the known ones otherwise)."""
    if name not in DRIVERS:
        raise ConfigError(f"unknown driver {name!r}; available: {', '.join(DRIVERS)}")
    return importlib.import_module(DRIVERS[name][0]).DRIVER
