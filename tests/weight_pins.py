"""Pinned training results: the weights a tiny run produces today, so a refactor of the training
loops can prove it changed nothing (same RNG consumption order, same float summation order).

Bit-identical weights are a property of one CPU kind (and the torch and transformers versions): an
AMD EPYC and an Intel Xeon round a fused kernel differently, so the same code gives other weights
there. The pins are therefore stored per kind in `tests/fixtures/training_pins.json`:

    {"<cpu model> | torch <v> | transformers <v>": {"<case>": "<sha256>", ...}, ...}

A kind without pins FAILS (a skip would let every pinned test pass vacuously on that kind). To add
the current kind, record its pins on the code BEFORE your change (the pins are the old code's
behaviour, which the change must keep), then commit the file:

    git stash && BERTOLOGY_RECORD_PINS=1 .venv/bin/python -m pytest -q -m pins; git stash pop

Recording only adds the cases this kind lacks; `BERTOLOGY_RECORD_PINS=overwrite` replaces them
(after a deliberate change of the training's arithmetic, said in the commit).
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


def machine_key() -> str:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} | torch {torch.__version__} | transformers {transformers.__version__}"


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
    """Assert `value` equals this CPU kind's pin for `case`; fail, naming the command, when the kind has none."""
    from workbench.io import atomic_write_json

    key = machine_key()
    pins = json.loads(PINS_FILE.read_text()) if PINS_FILE.exists() else {}
    mine = pins.get(key, {})
    mode = os.environ.get("BERTOLOGY_RECORD_PINS", "")
    if mode in ("1", "overwrite"):
        if case not in mine or mode == "overwrite":
            pins.setdefault(key, {})[case] = value
            atomic_write_json(PINS_FILE, pins)
        return
    assert case in mine, (f"no pinned weights for {case!r} on this CPU kind ({key}; pinned kinds: "
                          f"{sorted(pins) or 'none'}). Record them with: {RECORD_COMMAND}")
    assert value == mine[case], f"{case}: the weights changed (pinned {mine[case][:12]}, now {value[:12]})"
