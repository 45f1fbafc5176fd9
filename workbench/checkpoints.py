"""Checkpoints in one place: step folders, a training folder's steps, a checkpoint's manifest, its hash.

A workbench checkpoint is a plain `save_pretrained` folder `<run>/[seed-S/]step-NNNNNNN/` with the
tokenizer and a `manifest.json` (family, step, seed, training config, corpus). Any other local folder
holding a `config.json` is a checkpoint too (family/step/seed unknown).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from workbench.errors import CheckpointError, ConfigError


@dataclass
class Checkpoint:
    """What the rows say about a model: name, and family/step/seed from its manifest.json."""

    name: str
    path: Path | None
    family: str | None = None
    step: int | None = None
    seed: int | None = None
    handle: Any = None  # an already-open handle (tests, planted models)


_STEP_DIR = re.compile(r"step-\d+\Z")
_SEED_DIR = re.compile(r"seed-\d+\Z")


def checkpoint_name(path: Path) -> str:
    """`<run>/step-NNNNNNN` (or `<run>/seed-S/step-NNNNNNN`) for the workbench's own checkpoints,
    else the folder name."""
    path = Path(path).resolve()
    if not _STEP_DIR.match(path.name):
        return path.name
    parent = path.parent
    if _SEED_DIR.match(parent.name):
        return f"{parent.parent.name}/{parent.name}/{path.name}"
    return f"{parent.name}/{path.name}"


def expand_checkpoints(items: Iterable[Any]) -> list[Checkpoint]:
    """Paths (a training output folder expands to all its step-* checkpoints) or handles -> Checkpoints.

    Fails before any work with a CheckpointError naming the first path that is not a checkpoint.
    """
    out: list[Checkpoint] = []
    for item in items:
        if not isinstance(item, (str, Path)):  # a handle
            path = getattr(item, "path", None)
            name = checkpoint_name(Path(path)) if path is not None else f"in-memory-{item.checkpoint_hash[:8]}"
            out.append(Checkpoint(name, Path(path) if path else None, getattr(item, "family", None), handle=item))
            continue
        path = Path(item).expanduser()
        if not path.exists():
            raise CheckpointError(f"{path}: checkpoint does not exist")
        if path.is_dir() and not (path / "config.json").is_file():
            found = [*path.glob("step-*"), *path.glob("seed-*/step-*")]  # one run, or one per seed
            steps = sorted((p for p in found if (p / "config.json").is_file()), key=_step_order)
            if not steps:
                raise CheckpointError(f"{path}: neither a checkpoint folder (no config.json) nor a training "
                                      f"output folder with step-* checkpoints")
            out.extend(_from_path(p) for p in steps)
        else:
            out.append(_from_path(path))
    if not out:
        raise ConfigError("no checkpoints given")
    names = [c.name for c in out]
    dup = [n for n, k in Counter(names).items() if k > 1]
    if dup:
        raise ConfigError(f"two checkpoints have the same name {dup[0]!r}; rows could not tell them apart")
    return out


def _step_order(path: Path) -> tuple[str, int]:
    """Seed folder, then step number (numeric, not lexicographic)."""
    return (path.parent.name if _SEED_DIR.match(path.parent.name) else "", int(path.name.split("-")[1]))


def _from_path(path: Path) -> Checkpoint:
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint folder")
    ck = Checkpoint(checkpoint_name(path), path)
    manifest = path / "manifest.json"
    if manifest.is_file():
        try:
            m = json.loads(manifest.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{manifest}: unreadable manifest ({e})") from e
        ck.family = m.get("family")
        ck.step = None if m.get("step") is None else int(m["step"])
        ck.seed = None if m.get("seed") is None else int(m["seed"])
    return ck


