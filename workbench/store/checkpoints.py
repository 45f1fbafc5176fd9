"""Checkpoints in one place: step folders, a training folder's steps, a checkpoint's manifest, its hash.

A workbench checkpoint is a plain `save_pretrained` folder `<run>/[seed-S/]step-NNNNNNN/` with the
tokenizer and a `manifest.json` (family, step, seed, training config, corpus). A checkpoint made
from another (`ModelHandle.derive` + `save`) is one too; its manifest adds `derived_from` (parent
and its sha256, transform, parameters: `derived_manifest`). Any other local folder
holding a `config.json` is a checkpoint too (family/step/seed unknown), and so is a Hub name
(`bert-base-uncased`, `org/name`) that is not a local path: `resolve_checkpoint` finds it in the
local Hugging Face cache the way `from_pretrained(name)` does offline, and never touches the network.
Every command that takes a checkpoint goes through `resolve_checkpoint` (via `expand_checkpoints`
or `ModelHandle.load`).

Which files are the weights (`weight_files`, hashed by `workbench.store.identity.weights_hash`): exactly the files that
`from_pretrained` reads, in its order of preference: `model.safetensors`, else the shards named
by `model.safetensors.index.json`, else `pytorch_model.bin`, else the shards named by
`pytorch_model.bin.index.json`. Everything else in the folder leaves the hash alone: config and
tokenizer files, our `manifest.json` and `trainer_state/`, a Trainer's `training_args.bin` /
`optimizer.pt` / `rng_state.pth`, sub-folders (SpanBERT's `sbo_head/`, sentence-transformers'
`1_Pooling/`) and other frameworks' weights (`tf_model.h5`, `flax_model.msgpack`, `onnx/`), none
of which change the hidden states a `ModelHandle` computes. The results manifest and the handle
(whose hash keys the activation cache) both use `identity.weights_hash`, so they agree on every folder.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from workbench.errors import CheckpointError, ConfigError

STEP_PREFIX = "step-"
SEED_PREFIX = "seed-"
MANIFEST_NAME = "manifest.json"
# (single file, sharded index) in `from_pretrained`'s order of preference.
WEIGHT_NAMES = (("model.safetensors", "model.safetensors.index.json"),
                ("pytorch_model.bin", "pytorch_model.bin.index.json"))


@dataclass
class Checkpoint:
    """What the rows say about a model: name, and family/step/seed from its manifest.json."""

    name: str
    path: Path | None
    family: str | None = None
    step: int | None = None
    seed: int | None = None
    handle: Any = None  # an already-open handle (tests, planted models)


_STEP_DIR = re.compile(rf"{STEP_PREFIX}(\d+)\Z")
_SEED_DIR = re.compile(rf"{SEED_PREFIX}(\d+)\Z")


# ---- the step folder layout ------------------------------------------------------------------------


def step_dir(run: str | Path, step: int) -> Path:
    """`<run>/step-NNNNNNN`: zero-padded so a plain listing is in step order too."""
    return Path(run) / f"{STEP_PREFIX}{int(step):07d}"


def seed_dir(run: str | Path, seed: int) -> Path:
    """`<run>/seed-S`: the folder of one training seed of a run (training writes one for every seed,
    a single one included; its steps: `step_dir`)."""
    return Path(run) / f"{SEED_PREFIX}{int(seed)}"


def step_number(path: str | Path) -> int | None:
    """The step of a `step-NNNNNNN` folder, None for any other name."""
    m = _STEP_DIR.match(Path(path).name)
    return int(m.group(1)) if m else None


def list_steps(folder: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of the complete checkpoints of a training output folder: its own `step-*`
    folders and those of its `seed-S/` sub-folders, by seed then step (both numeric).

    Complete means the folder holds a `config.json`: checkpoints are written atomically
    (`workbench.io.atomic_dir`), so a half-written one is a hidden `.step-*.tmp` folder, never listed.
    """
    folder = Path(folder)
    found = []
    for p in [*folder.glob(f"{STEP_PREFIX}*"), *folder.glob(f"{SEED_PREFIX}*/{STEP_PREFIX}*")]:
        step = step_number(p)
        seed = _SEED_DIR.match(p.parent.name) if p.parent != folder else None
        if step is None or (p.parent != folder and seed is None) or not (p / "config.json").is_file():
            continue
        found.append(((int(seed.group(1)) if seed else -1, step), p))
    return [(order[1], p) for order, p in sorted(found)]


def checkpoint_name(path: Path) -> str:
    """`<run>/step-NNNNNNN` (or `<run>/seed-S/step-NNNNNNN`) for the workbench's own checkpoints,
    the Hub id for a snapshot folder of the Hugging Face cache, else the folder name."""
    path = Path(path).resolve()
    hub = _hub_id(path)
    if hub is not None:
        return hub
    if not _STEP_DIR.match(path.name):
        return path.name
    parent = path.parent
    if _SEED_DIR.match(parent.name):
        return f"{parent.parent.name}/{parent.name}/{path.name}"
    return f"{parent.name}/{path.name}"


# ---- Hub names -----------------------------------------------------------------------------------------


def hub_cache() -> Path:
    """The Hugging Face Hub cache folder, read from the environment now (huggingface_hub reads it
    once, at import): HF_HUB_CACHE, else the legacy HUGGINGFACE_HUB_CACHE, else HF_HOME/hub, else
    $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub."""
    env = os.environ
    home = env.get("HF_HOME") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE") or os.path.join(home, "hub")
    return Path(os.path.expandvars(os.path.expanduser(cache)))


def is_hub_id(name: str) -> bool:
    """Whether `name` is a valid Hugging Face Hub repository id (`name` or `org/name`), by
    `huggingface_hub.utils.validate_repo_id`: what may be looked up in the local Hub cache."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _hub_id(path: Path) -> str | None:
    """`org/name` for `<cache>/models--org--name/snapshots/<revision>` (ids cannot hold "--")."""
    repo = path.parent.parent.name
    if path.parent.name == "snapshots" and repo.startswith("models--"):
        return repo[len("models--"):].replace("--", "/")
    return None


def resolve_checkpoint(item: str | Path) -> Path:
    """The folder a checkpoint argument names: a local path as given; else a Hub id's snapshot
    folder in the local Hugging Face cache, the one `from_pretrained(id)` reads offline (the
    revision `refs/main` names), looked up with `huggingface_hub.snapshot_download(...,
    local_files_only=True)`, so nothing is ever downloaded. A name that is neither is one
    CheckpointError line that says how to get it.
    """
    path = Path(item).expanduser()
    if path.exists():
        return path
    name = str(item)
    if not is_hub_id(name):
        raise CheckpointError(f"{path}: checkpoint does not exist")
    import huggingface_hub.errors
    from huggingface_hub import snapshot_download

    incomplete = getattr(huggingface_hub.errors, "IncompleteSnapshotError", ())  # huggingface_hub >= 2
    cache = hub_cache()
    try:
        return Path(snapshot_download(name, cache_dir=cache, local_files_only=True))
    except OSError as e:  # LocalEntryNotFoundError: not cached; IncompleteSnapshotError: half there
        why = str(e).split(". ")[0] if isinstance(e, incomplete) else ""
        raise CheckpointError(
            f"{name}: neither a local checkpoint folder nor a model in the Hugging Face cache {cache}"
            f"{' (' + why + ')' if why else ''}; get it with `hf download {name}` (huggingface_hub's CLI) on a machine "
            f"with internet and copy that cache here (or point HF_HUB_CACHE / HF_HOME at it), or pass a "
            f"local folder (`--checkpoint /path/to/folder`)") from e


# ---- a checkpoint's manifest and weights ---------------------------------------------------------


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The checkpoint's `manifest.json` as a dict (None when it has none); a CheckpointError naming
    the file when it is not a JSON object."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:
        raise CheckpointError(f"{path}: unreadable manifest ({e})") from e
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}: unreadable manifest (a JSON object expected, got {type(manifest).__name__})")
    return manifest


# What a model made with fresh weights (random init) keeps of its parent's manifest: how it is read
# (family; the training config's window `max_len` and objective), not what the weights learnt from
# (corpus, steps, tokens seen), which would make membership or a step axis read a record of another model.
READING_KEYS = ("family", "config")


def derived_manifest(parent: Mapping[str, Any] | None, derived_from: Mapping[str, Any] | None, *,
                     family: str | None = None, content_sha256: str | None = None,
                     cost: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of a checkpoint made from another (`ModelHandle.save`): the parent's manifest
    (its training record still describes weights made from it: corpus, step, seed; only the reading
    keys when the weights are fresh) plus `derived_from` = the lineage (parent folder and sha256,
    transform, parameters, the parent's own lineage) and the in-memory content hash it had, and
    `cost` = its cost record (`workbench.cost.derived_cost`, computed by the caller: this module
    sits below `workbench.cost`, which reads checkpoints)."""
    fresh = bool((derived_from or {}).get("fresh_weights"))
    base = {k: v for k, v in dict(parent or {}).items() if not fresh or k in READING_KEYS}
    base.pop("derived_from", None)  # the parent's lineage lives inside the new record
    if family is not None:
        base.setdefault("family", family)
    if derived_from is not None:
        base["derived_from"] = {**derived_from, "content_sha256": content_sha256}
        if cost is not None:
            base["cost"] = dict(cost)
    return base


def weight_files(folder: str | Path) -> list[Path]:
    """The weight files `from_pretrained` would read from this folder (see the module docstring);
    [] when there are none. A sharded index that is unreadable or names a missing shard is a
    CheckpointError naming the index."""
    folder = Path(folder)
    for single, index in WEIGHT_NAMES:
        if (folder / single).is_file():
            return [folder / single]
        if (folder / index).is_file():
            try:
                shards = sorted(set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values()))
            except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
                raise CheckpointError(f"{folder / index}: unreadable shard index ({type(e).__name__}: {e})") from e
            missing = [s for s in shards if not (folder / s).is_file()]
            if missing:
                raise CheckpointError(f"{folder / index}: names shard(s) that are missing: {missing[:3]}")
            return [folder / s for s in shards]
    return []


def weight_names(folder: str | Path) -> list[str] | None:
    """The tensor names a safetensors checkpoint holds (single file or sharded), read from the file's
    header or the shard index, never the tensors; None when the folder has no safetensors weights."""
    folder = Path(folder)
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():  # the order `weight_files` (and transformers) read them in
        from safetensors import safe_open

        with safe_open(str(single), "pt") as f:
            return list(f.keys())
    if index.is_file():
        return list(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}))
    return None


# ---- checkpoint lists --------------------------------------------------------------------------------


def expand_checkpoints(items: Iterable[Any]) -> list[Checkpoint]:
    """Paths (a training output folder expands to all its step-* checkpoints), handles or Checkpoints
    -> Checkpoints.

    Fails before any work with a CheckpointError naming the first path that is not a checkpoint.
    """
    out: list[Checkpoint] = []
    for item in items:
        if isinstance(item, Checkpoint):  # already resolved (the Python API's loaded model: no second load)
            out.append(item)
            continue
        if not isinstance(item, (str, Path)):  # a handle
            path = getattr(item, "path", None)
            name = checkpoint_name(Path(path)) if path is not None else f"in-memory-{item.checkpoint_hash[:8]}"
            out.append(Checkpoint(name, Path(path) if path else None, getattr(item, "family", None), handle=item))
            continue
        path = resolve_checkpoint(item)
        if path.is_dir() and not (path / "config.json").is_file():
            steps = list_steps(path)  # one run, or one per seed
            if not steps:
                raise CheckpointError(f"{path}: neither a checkpoint folder (no config.json) nor a training "
                                      f"output folder with step-* checkpoints")
            out.extend(_from_path(p) for _, p in steps)
        else:
            out.append(_from_path(path))
    if not out:
        raise ConfigError("no checkpoints given")
    names = [c.name for c in out]
    dup = [n for n, k in Counter(names).items() if k > 1]
    if dup:
        raise ConfigError(f"two checkpoints have the same name {dup[0]!r}; rows could not tell them apart")
    return out


def single_checkpoint(spec: str | Path) -> Path:
    """One checkpoint folder from a folder, a training output folder (its last step; one seed) or a
    Hub name (`expand_checkpoints` resolves those): what a command that trains or reads one model
    from a checkpoint argument takes (fine-tuning, generation, the prune sweep)."""
    found = expand_checkpoints([spec])
    if len(found) > 1:
        seeds = {c.path.parent for c in found}
        if len(seeds) > 1:
            raise ConfigError(f"{spec}: holds checkpoints of {len(seeds)} seeds; give one seed-S folder or one step folder")
    path = found[-1].path
    if path is None:
        raise CheckpointError(f"{spec}: not a checkpoint on disk")
    return Path(path)


def _from_path(path: Path) -> Checkpoint:
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint folder")
    ck = Checkpoint(checkpoint_name(path), path)
    m = read_manifest(path)
    if m is not None:
        ck.family = m.get("family")
        try:
            ck.step = None if m.get("step") is None else int(m["step"])
            ck.seed = None if m.get("seed") is None else int(m["seed"])
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"{path / MANIFEST_NAME}: step/seed must be integers ({e})") from e
    return ck
