"""Pinned training results: the weights a tiny run produces today, so a refactor of the training
loops can prove it changed nothing (same RNG consumption order, same float summation order).

Bit-identical weights are a property of one machine (CPU kind, torch and transformers versions:
another CPU may round a fused kernel differently), so the pins are stored per machine in
`tests/fixtures/training_pins.json`:

    {"<cpu model> | torch <v> | transformers <v>": {"<case>": "<sha256>", ...}, ...}

On a machine with no pins yet the tests skip and say how to record them: run the pinning tests
with `BERTOLOGY_RECORD_PINS=1` ON THE CODE BEFORE the change, commit the file, then change the code.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import pytest

PINS_FILE = Path(__file__).parent / "fixtures" / "training_pins.json"


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
    """sha256 over a state dict's names, dtypes, shapes and raw bytes, in name order."""
    import torch

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def log_hash(records: list[dict]) -> str:
    """sha256 of a training log's records without wall-clock times (losses are logged as exact floats)."""
    keep = [{k: v for k, v in r.items() if k != "elapsed"} for r in records]
    return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


def check_pin(case: str, value: str) -> None:
    """Assert `value` equals this machine's pin for `case` (record it with BERTOLOGY_RECORD_PINS=1)."""
    from workbench.io import atomic_write_json

    key = machine_key()
    pins = json.loads(PINS_FILE.read_text()) if PINS_FILE.exists() else {}
    if os.environ.get("BERTOLOGY_RECORD_PINS") == "1":
        pins.setdefault(key, {})[case] = value
        atomic_write_json(PINS_FILE, pins)
        return
    mine = pins.get(key, {})
    if case not in mine:
        pytest.skip(f"no pinned weights for {case!r} on this machine ({key}); record them on the unchanged "
                    f"code with BERTOLOGY_RECORD_PINS=1")
    assert value == mine[case], f"{case}: the weights changed (pinned {mine[case][:12]}, now {value[:12]})"
