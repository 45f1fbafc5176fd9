"""The probe registry: name -> the module that defines it (its `PROBE`, a `probes.core.runner.ProbeSpec`).

`bertology probe --help`, `bertology probe NAME`, `bertology run` configs and the app all read this
one table, so adding a probe family is one line here plus its module. Modules are imported only
when used (they pull in torch), so the help text lives here too.
"""

from __future__ import annotations

import importlib

from workbench.errors import ConfigError

# name -> (module, one-line description)
PROBES: dict[str, tuple[str, str]] = {
    "syntax": ("probes.syntax", "POS, XPOS, dependency labels and arcs, structural probe (Hewitt & Manning 2019)"),
    "align": ("probes.align", "cross-lingual/cross-model alignment per layer: Procrustes, CSLS, BLI, CKA"),
    "cloze": ("probes.cloze", "oLMpics cloze (Talmor et al. 2020): zero-shot with the own head, logit lens, blank probe, learning curves"),
    "coref": ("probes.coref", "coreference: GUM mention pairs/entity types, GAP, coreference heads, gender cloze"),
    "extraction": ("probes.extraction", "training-data extraction: ranked samples (Carlini et al. 2021), k-extractability, canary exposure"),
    "membership": ("probes.membership", "membership inference from manifests: LOSS, zlib, reference, Min-K%(++), LiRA, layer probe"),
}

_RUNTIME: dict[str, object] = {}  # specs registered at run time (tests, notebooks)


def register(spec) -> None:
    """Add a probe defined outside `probes/` (a notebook, a test) under `spec.name`."""
    _RUNTIME[spec.name] = spec


def unregister(name: str) -> None:
    _RUNTIME.pop(name, None)


def probe_names() -> list[str]:
    return sorted({*PROBES, *_RUNTIME})


def describe() -> str:
    """One line per probe, for `bertology probe --help`."""
    lines = [f"  {name:<12} {PROBES[name][1] if name in PROBES else getattr(_RUNTIME[name], 'description', '')}"
             for name in probe_names()]
    return "probes:\n" + "\n".join(lines)


def get_probe(name: str):
    """The ProbeSpec registered as `name` (ConfigError naming the known ones otherwise)."""
    if name in _RUNTIME:
        return _RUNTIME[name]
    if name not in PROBES:
        raise ConfigError(f"unknown probe {name!r}; available: {', '.join(probe_names())}")
    return importlib.import_module(PROBES[name][0]).PROBE
