"""Pinned training results: the weights a tiny run produces today, so a refactor of the training
loops can prove it changed nothing (same RNG consumption order, same float summation order).

Bit-identical weights are a property of one CPU kind: an AMD EPYC and an Intel Xeon round a fused
kernel differently, so the same code gives other weights there. The pins are therefore keyed by the
CPU kind in `tests/fixtures/training_pins.json`, each kind recording the library versions it was
recorded under:

    {"<cpu model>": {"recorded_under": {"torch": "<v>", "transformers": "<v>", ...},
                     "pins": {"<case>": "<sha256>", ...}}, ...}

The versions are a record, not part of the key: most releases of torch, transformers or tokenizers
change no weight of a tiny run, and a key made of versions failed every pin at every weekly release
(issue 48). On other versions a case still compares with its kind's pin; it passes when the weights
are equal and fails, naming both version sets, when they differ.

A kind without pins FAILS (a skip would let every pinned test pass vacuously on that kind). To add
the current kind, record its pins on the code BEFORE your change (the pins are the old code's
behaviour, which the change must keep), under the versions of the install lock, then commit the file:

    git stash && BERTOLOGY_RECORD_PINS=1 .venv/bin/python -m pytest -q -m pins; git stash pop

Recording only adds the cases this kind lacks, and only under the versions the kind was recorded
under (a kind's pins come from one set of versions). `BERTOLOGY_RECORD_PINS=overwrite` replaces
them and the kind's versions (after a deliberate change of the training's arithmetic, or a
dependency release that changed it, said in the commit; run it over the whole `-m pins` suite).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

PINS_FILE = Path(__file__).parent / "fixtures" / "training_pins.json"
RECORD_COMMAND = ("git stash && BERTOLOGY_RECORD_PINS=1 .venv/bin/python -m pytest -q -m pins; git stash pop "
                  "(on the code before your change; then commit tests/fixtures/training_pins.json)")
LOCK_INSTALL = 'pip install -c requirements.lock -e ".[dev]"'
# The libraries whose arithmetic reaches a tiny run's weights (the tokenizer through its vocabulary).
RECORDED_LIBRARIES = ("torch", "transformers", "tokenizers")


def cpu_kind() -> str:
    """The CPU model name (`/proc/cpuinfo`), the key of a kind's pins."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return cpu


def library_versions() -> dict[str, str]:
    """The installed versions of `RECORDED_LIBRARIES`."""
    from importlib.metadata import version

    return {name: version(name) if name != "torch" else __import__("torch").__version__
            for name in RECORDED_LIBRARIES}


def describe(versions: dict[str, str]) -> str:
    return ", ".join(f"{name} {v}" for name, v in sorted(versions.items())) or "no versions recorded"


def differing_versions(recorded: dict[str, str], current: dict[str, str]) -> dict[str, tuple[str, str]]:
    """The libraries recorded for a kind whose version differs now (a library not recorded is not compared)."""
    return {name: (v, current.get(name, "absent")) for name, v in recorded.items() if current.get(name) != v}


def state_hash(state: dict) -> str:
    """sha256 over a state dict's names, dtypes, shapes and raw bytes, in name order: the workbench's
    one tensor hash (`workbench.store.identity.tensors_hash`) in the pins' format, a `|` after the shape
    (the pinned values of every CPU kind were recorded with it)."""
    from workbench.store.identity import tensors_hash

    return tensors_hash(state.items(), header_end="|")


def log_hash(records: list[dict]) -> str:
    """sha256 of a training log's records without wall-clock times (losses are logged as exact floats)."""
    keep = [{k: v for k, v in r.items() if k != "elapsed"} for r in records]
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


def check_pin(case: str, value: str) -> None:
    """Assert `value` equals this CPU kind's pin for `case`, whatever library versions are installed;
    fail, naming the command, when the kind has none."""
    from workbench.io import atomic_write_json

    kind, current = cpu_kind(), library_versions()
    pins = json.loads(PINS_FILE.read_text()) if PINS_FILE.exists() else {}
    entry = pins.get(kind, {"recorded_under": current, "pins": {}})
    recorded = entry["recorded_under"]
    mode = os.environ.get("BERTOLOGY_RECORD_PINS", "")
    if mode == "overwrite":
        entry["recorded_under"] = current
        entry["pins"][case] = value
        pins[kind] = entry
        atomic_write_json(PINS_FILE, pins)
        return
    if mode == "1":
        if case not in entry["pins"]:
            assert not differing_versions(recorded, current), (
                f"not recording {case!r}: this CPU kind's pins were recorded under {describe(recorded)}, "
                f"and this environment has {describe(current)}. Record under the kind's versions "
                f"({LOCK_INSTALL}), or re-record the whole kind with BERTOLOGY_RECORD_PINS=overwrite.")
            entry["pins"][case] = value
            pins[kind] = entry
            atomic_write_json(PINS_FILE, pins)
        return
    assert case in entry["pins"], (f"no pinned weights for {case!r} on this CPU kind ({kind}, {describe(current)}; "
                                   f"pinned kinds: {sorted(pins) or 'none'}). Record them with: {RECORD_COMMAND}")
    pinned = entry["pins"][case]
    if value == pinned:
        return
    changed = differing_versions(recorded, current)
    if not changed:
        raise AssertionError(f"{case}: the weights changed (pinned {pinned[:12]}, now {value[:12]}; "
                             f"{describe(current)}, the versions they were recorded under)")
    raise AssertionError(
        f"{case}: the weights differ from this CPU kind's pin (pinned {pinned[:12]} under {describe(recorded)}; "
        f"now {value[:12]} under {describe(current)}). Either the new versions changed the arithmetic "
        f"(then, on the code before your change, re-record the kind: {RECORD_COMMAND.replace('=1', '=overwrite')}) "
        f"or your change did (run under the recorded versions: {LOCK_INSTALL}).")
