"""What a checkpoint is, as a sha256: every identity hash of the workbench, with one cache.

A model's identity keys the activation cache, a probe's resume units, every results row's
checkpoint record and a derived model's lineage, so each hash has exactly one formula, here:

- `weights_hash(folder)`: a checkpoint folder's weight files (`workbench.store.checkpoints.weight_files`:
  exactly what `from_pretrained` reads), each file's sha256 behind its name relative to the folder
  (`workbench.io.sha256_files`). What `ModelHandle.checkpoint_hash` is for a loaded checkpoint.
- `file_sha256(path)`: one file's bytes (a single weights file, a data file a manifest records).
- `checkpoint_hash(path)`: a folder's `weights_hash`, a single weights file's `file_sha256`.
- `state_dict_hash(model)`: an in-memory model (a derived one included): every tensor's name,
  dtype, shape and raw bytes, in name order. What `ModelHandle.checkpoint_hash` is without files.
- `tokenizer_hash(tokenizer)` / `backend_tokenizer_hash(backend)`: the serialised fast tokenizer
  (vocab, merges, normalizer, post-processor).

File hashes are cached in one table keyed by each file's resolved path, size and mtime (ns), so a
large checkpoint read by a handle, a run manifest and a resume key in one process is read once, and
a file rewritten in place is hashed again. The values are those of the functions this module
replaced (`checkpoints.weights_hash`, `manifest.checkpoint_hash`, `models.state_dict_hash`,
`tokenization.tokenizer_hash`), byte for byte: stored run ids, manifests and caches depend on them
(`tests/test_identity.py` pins them on planted files and tensors).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Callable

from workbench.store.checkpoints import weight_files
from workbench.errors import CheckpointError
from workbench.io import sha256_file, sha256_files

# (kind, ((resolved path, size, mtime_ns), ...)) -> sha256; the one cache of every file hash.
HASH_CACHE: dict[tuple, str] = {}


def _stamp(files: Iterable[Path]) -> tuple[tuple[str, int, int], ...]:
    out = []
    for f in files:
        st = f.stat()
        out.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _cached(kind: str, files: Iterable[Path], compute: Callable[[], str]) -> str:
    key = (kind, _stamp(files))
    if key not in HASH_CACHE:
        HASH_CACHE[key] = compute()
    return HASH_CACHE[key]


def file_sha256(path: str | Path) -> str:
    """sha256 of one file's bytes, cached (see the module docstring)."""
    path = Path(path).expanduser()
    return _cached("file", [path], lambda: sha256_file(path))


def weights_hash(folder: str | Path) -> str:
    """sha256 over a checkpoint folder's weight files (names relative to the folder included;
    `workbench.io.sha256_files`), cached. A folder without weight files is a CheckpointError."""
    folder = Path(folder).expanduser()
    files = weight_files(folder)
    if not files:
        raise CheckpointError(f"{folder}: no weight files (model.safetensors or pytorch_model.bin, "
                              f"or a sharded index of either)")
    # the names inside the hash are relative to `folder`: the same files under another folder name
    # hash the same, so the folder is not part of the key (the resolved files are)
    return _cached("weights", files, lambda: sha256_files(files, root=folder))


def checkpoint_hash(path: str | Path) -> str:
    """sha256 over a checkpoint's weights: a folder's `weights_hash` (the same hash as
    `ModelHandle.checkpoint_hash`), a single weights file's bytes (`file_sha256`)."""
    p = Path(path).expanduser().resolve()
    if p.is_file():
        return file_sha256(p)
    if not p.is_dir():
        raise CheckpointError(f"checkpoint {p} does not exist")
    return weights_hash(p)


def tensors_hash(named: Iterable[tuple[str, Any]], header_end: str = "") -> str:
    """sha256 over (name, tensor) pairs in name order: `name|dtype|shape` + `header_end`, then the
    tensor's raw bytes (CPU, contiguous). `state_dict_hash` uses `header_end=""`; the weight pins of
    tests/weight_pins.py were recorded with `"|"` and keep it (pinned values per CPU kind)."""
    import torch

    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda item: item[0]):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}{header_end}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def state_dict_hash(model: Any) -> str:
    """sha256 over a model's state dict (a module, or the state dict itself): every tensor's name,
    dtype, shape and bytes, by name. The identity of an in-memory model (derived ones included):
    what it runs, nothing else. Not cached: tensors change in place (`ModelHandle.checkpoint_hash`
    keeps its own stamp of them)."""
    state = model if isinstance(model, Mapping) else model.state_dict()
    return tensors_hash(state.items())


def backend_tokenizer_hash(backend: Any) -> str:
    """sha256 of a `tokenizers.Tokenizer`'s JSON serialisation (`to_str()`)."""
    return hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()


def tokenizer_hash(tokenizer: Any) -> str:
    """sha256 of a fast tokenizer's serialised backend (vocab, merges, normalizer, post-processor)."""
    return backend_tokenizer_hash(tokenizer.backend_tokenizer)
