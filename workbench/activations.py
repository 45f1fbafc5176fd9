"""Word-level activations of every layer, extracted once and cached on disk as memory-mapped arrays.

`extract(handle, sentences, dataset_key)` runs the model handle over a list of word-tokenised
sentences and returns `Activations`: a layer-major array `[L+1, N_words, H]` (layer 0 = embeddings,
the HF `hidden_states` convention) plus sentence offsets. Every probe reads from it, so a second
probe on the same data and checkpoint extracts nothing.

How it stays fast and bounded (what diagNNose's per-layer pickles do not give):
- sentences are processed in batches sorted by length (little padding), one handle call per batch,
  which returns all layers at once (the handle does the subword -> word pooling);
- the words are counted first, the output file is preallocated at its final size and each batch is
  written straight into its place with `os.pwrite`, so peak memory does not grow with the corpus
  (writes through a writable memmap would keep every dirtied page resident in this process);
- the tokenizer runs one batch ahead and a writer thread writes batch k (and flushes the file every
  eight batches) while the model runs batch k+1 (one batch in flight at most), so tokenising,
  writing and syncing overlap the forward pass;
- everything is written in a hidden `.<name>.partial` folder which is renamed into place only when
  complete: a crash never leaves a half cache, and an interrupted extraction resumes from its last
  recorded batch (or restarts cleanly when the partial folder does not match).

Cache key = checkpoint hash (what the handle runs: weight files, or the state dict's content for an
in-memory or derived model, `ModelHandle.checkpoint_hash`, so a model changed from its parent never
reads the parent's entry) + tokenizer + dataset key + pooling + stack + dtype + a fingerprint of the words
themselves (so a reused dataset key with different sentences can never return stale vectors).
`dtype` is how the vectors are stored; the precision the forward computed in (fp32 or bf16,
`ModelHandle.compute_dtype`) is part of the model fingerprint and recorded in meta.json.

Storage in half precision (`dtype="float16"` or `"bfloat16"`, a probe's `cache_dtype: fp16 | bf16`)
halves the disk and every read of the cache. float16 keeps 10 mantissa bits but overflows above
65,504 (a Llama-style model's massive activations reach ~10^4, close to it); bfloat16 keeps the
float32 range with 7 mantissa bits. numpy has no bfloat16, so those caches hold the raw 16-bit
patterns and `Activations.layers` is a `Bfloat16Array` that widens whatever is indexed to float32
(exact: a bfloat16 is the top half of a float32).

Concerns:
- the activations and how they are stored (layer-major memmaps, bf16 as uint16 bit patterns):
  `Activations`, `Bfloat16Array`, `float32_to_bfloat16`, `bfloat16_to_float32`
- the cache key, everything that changes the numbers: `sentences_fingerprint`, `cache_key`,
  `model_fingerprint`, `cache_path`
- extraction into the cache (batches, the writer thread, resume): `extract`, `resolve_stack`
- the cache's housekeeping (`bertology cache`): `CacheEntry`, `cache_entries`, `parse_size`,
  `prune_cache`
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import os
import re
import shutil
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from workbench.errors import CheckpointError, ConfigError, WorkbenchError
from workbench.store.identity import backend_tokenizer_hash
from workbench.io import atomic_write_json
from workbench.paths import cache_root
from workbench.progress import progress as progress_bar

POOLINGS = ("first", "mean", "last")
DTYPES = ("float32", "float16", "bfloat16")
CACHE_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}  # a probe's `cache_dtype:` -> storage
FORMAT_VERSION = 1
_LAYERS_FILE = "layers.npy"
_OFFSETS_FILE = "sentence_offsets.npy"
_META_FILE = "meta.json"
_PROGRESS_FILE = "progress.json"


@dataclass
class Activations:
    """Cached word representations of every layer of one stack.

    `layers[l, sentence_offsets[s]:sentence_offsets[s+1]]` are the words of sentence `s` at layer `l`.
    `stats` holds what the handle counted while extracting (windowed sentences, empty sentences,
    words mapped to no subword, ...): probes copy it into their run manifest.
    """

    layers: np.ndarray  # memmap [L+1, N_words, H], float32 or float16 (bfloat16: a Bfloat16Array over one)
    sentence_offsets: np.ndarray  # int64 [S+1]
    stats: dict[str, int]
    path: Path
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | Path) -> "Activations":
        path = Path(path)
        try:
            meta = json.loads((path / _META_FILE).read_text(encoding="utf-8"))
            layers = np.load(path / _LAYERS_FILE, mmap_mode="r")
            if meta.get("dtype") == "bfloat16":
                layers = Bfloat16Array(layers)
            offsets = np.load(path / _OFFSETS_FILE)
        except (OSError, ValueError) as e:
            raise WorkbenchError(f"{path}: unreadable activation cache ({e}); delete the folder to re-extract") from e
        expected = tuple(meta["shape"])
        if layers.shape != expected or offsets.shape != (meta["num_sentences"] + 1,) or offsets[-1] != expected[1]:
            raise WorkbenchError(
                f"{path}: activation cache does not match its meta.json (layers {layers.shape}, "
                f"expected {expected}); delete the folder to re-extract"
            )
        _mark_used(path)
        return cls(layers=layers, sentence_offsets=offsets, stats=dict(meta.get("stats", {})), path=path, meta=meta)

    @property
    def num_layers(self) -> int:
        """Number of hidden-state entries (L+1: embeddings + L blocks)."""
        return int(self.layers.shape[0])

    @property
    def num_words(self) -> int:
        return int(self.layers.shape[1])

    @property
    def num_sentences(self) -> int:
        return int(len(self.sentence_offsets) - 1)

    @property
    def hidden_size(self) -> int:
        return int(self.layers.shape[2])

    def sentence(self, i: int) -> np.ndarray:
        """`[L+1, n_words, H]` view of sentence `i`."""
        return self.layers[:, self.sentence_offsets[i] : self.sentence_offsets[i + 1]]

    def sentence_ids(self) -> np.ndarray:
        """int64 [N_words]: the sentence index of every word (for bootstrapping over sentences)."""
        return np.repeat(np.arange(self.num_sentences, dtype=np.int64), np.diff(self.sentence_offsets))

    def word_index(self, sentence_indices: Sequence[int] | np.ndarray) -> np.ndarray:
        """int64 word positions of the given sentences, in the given order."""
        idx = np.asarray(sentence_indices, dtype=np.int64)
        starts, ends = self.sentence_offsets[idx], self.sentence_offsets[idx + 1]
        if len(idx) == 0:
            return np.zeros(0, dtype=np.int64)
        lengths = ends - starts
        # vectorised concatenation of ranges [start, end)
        base = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        return base + np.arange(int(lengths.sum()), dtype=np.int64)


class Bfloat16Array:
    """A read-only `[L, N, H]` view of bfloat16 values kept as their uint16 bit patterns (numpy has no
    bfloat16): indexing works as on the underlying array and returns float32 (the bits shifted into
    the top half of a float32, exact), so readers see an ordinary float array of `shape`."""

    dtype = np.dtype(np.float32)

    def __init__(self, raw: np.ndarray):
        if raw.dtype != np.uint16:
            raise WorkbenchError(f"bfloat16 storage must be uint16 bit patterns, got {raw.dtype}")
        self.raw = raw

    shape = property(lambda self: self.raw.shape)
    ndim = property(lambda self: self.raw.ndim)
    nbytes = property(lambda self: self.raw.nbytes)

    def __len__(self) -> int:
        return len(self.raw)

    def __getitem__(self, key) -> np.ndarray:
        return bfloat16_to_float32(np.asarray(self.raw[key]))

    def __array__(self, dtype=None, copy=None):
        out = self[...]
        return out if dtype is None else out.astype(dtype, copy=False)


def float32_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even as torch rounds (NaN kept NaN)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    nan = np.isnan(x)
    if nan.any():
        rounded = np.where(nan, np.uint32(0x7FC0), rounded)
    return rounded.astype(np.uint16)


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _storage(dtype: str) -> np.dtype:
    """The numpy dtype a cache of `dtype` is written in (bfloat16: its uint16 bit patterns)."""
    return np.dtype(np.uint16) if dtype == "bfloat16" else np.dtype(dtype)


FLOAT16_MAX = float(np.finfo(np.float16).max)


def _to_storage(x: np.ndarray, dtype: str) -> np.ndarray:
    """One layer's rows in the storage dtype; float16 refuses values it cannot hold (they would turn
    into inf and poison every probe): a massive activation beyond 65,504 asks for bfloat16."""
    if dtype == "bfloat16":
        return float32_to_bfloat16(x)
    if dtype == "float16":
        peak = float(np.abs(x).max()) if x.size else 0.0
        if not peak <= FLOAT16_MAX:
            raise ConfigError(f"an activation of magnitude {peak:.4g} does not fit float16 (max {FLOAT16_MAX:.0f}); "
                              "store the cache in bf16 (cache_dtype: bf16) or fp32")
    return np.ascontiguousarray(x, dtype=dtype)


def sentences_fingerprint(sentences: Sequence[Sequence[str]]) -> str:
    """sha256 over the words and sentence boundaries (part of the cache key)."""
    h = hashlib.sha256()
    for words in sentences:
        h.update("\x1f".join(words).encode("utf-8"))
        h.update(b"\x1e")
    return h.hexdigest()


def cache_key(checkpoint_hash: str, dataset_key: str, pooling: str, stack: str, dtype: str, fingerprint: str) -> str:
    """Folder name of one cache entry: readable prefix + digest of everything that changes the numbers."""
    digest = hashlib.sha256(
        json.dumps([FORMAT_VERSION, checkpoint_hash, dataset_key, pooling, stack, dtype, fingerprint]).encode()
    ).hexdigest()[:20]
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", dataset_key).strip("._")[:60] or "data"
    return f"{slug}-{pooling}-{stack}-{dtype}-{digest}"


def model_fingerprint(handle) -> str:
    """The checkpoint's weight hash plus its tokenizer's, its window length and the precision its
    forward computes in: the same weights read through another tokenizer, in other windows or in
    bf16 (`ModelHandle.compute_dtype`) give other vectors, so all belong in the cache key. (fp32 adds
    nothing, so the keys of caches extracted before the precision choice existed still hold.)"""
    backend = getattr(getattr(handle, "tokenizer", None), "backend_tokenizer", None)
    # ELMo read through its characters (open vocabulary) differs from the older [UNK] reading
    chars = "+chars" if getattr(handle, "reads_characters", False) else ""
    window = f"+window{handle.max_length}" if getattr(handle, "max_length", None) else ""
    compute = getattr(handle, "compute_dtype", "fp32")
    precision = "" if compute == "fp32" else f"+compute-{compute}"
    # a causal LM read behind its start token (`ModelHandle.causal_start`) gives other vectors than
    # the older reading without one (entries made before it existed have no such part)
    start = getattr(handle, "causal_start", None)
    window += f"+start{start}" if start is not None else ""
    if backend is None:
        return handle.checkpoint_hash + chars + window + precision
    return handle.checkpoint_hash + "+" + backend_tokenizer_hash(backend) + chars + window + precision


def _activations_dir(cache_dir: str | Path | None) -> Path:
    """The activation cache folder: `cache_dir`, else `cache_root()/activations`."""
    return Path(cache_dir) if cache_dir is not None else cache_root() / "activations"


def cache_path(handle, sentences, dataset_key, pooling="first", stack=None, dtype="float32", cache_dir=None) -> Path:
    """Where `extract` keeps (or would keep) these activations."""
    stack = resolve_stack(handle, stack)
    root = _activations_dir(cache_dir)
    return root / cache_key(model_fingerprint(handle), dataset_key, pooling, stack, dtype, sentences_fingerprint(sentences))


def _write_remaining(handle, sentences: list[list[str]], partial: Path, plan: dict, chunks: list, done: int,
                     stats: dict, lengths: np.ndarray, offsets: np.ndarray, progress: bool,
                     checkpoint_every_s: float) -> None:
    """Run the batches `chunks[done:]` through `handle` and pwrite their states into the partial
    layers file, saving the resume record every `checkpoint_every_s` seconds; `stats` (the handle's
    counters) is updated in place.

    Kept apart from `extract` (which plans the file, resumes and publishes it) because this is the
    part that overlaps I/O with the forward pass: a writer thread, one batch in flight, and the
    ordering data-then-record that makes an interrupted run fall back to a consistent state.
    The sizes and settings come from `plan` (shape, dataset_key, pooling, stack, dtype, batch_size).
    """
    n_layers, n_words, hidden = plan["shape"]
    dataset_key, pooling, stack, dtype = plan["dataset_key"], plan["pooling"], plan["stack"], plan["dtype"]
    batch_size = plan["batch_size"]
    data_offset = _npy_data_offset(partial / _LAYERS_FILE)
    itemsize = _storage(dtype).itemsize
    layer_stride = n_words * hidden * itemsize

    fd = os.open(partial / _LAYERS_FILE, os.O_RDWR)
    try:
        bar = progress_bar(
            total=n_words,
            initial=int(sum(lengths[c].sum() for c in chunks[:done])),
            unit="word",
            desc=f"activations {dataset_key}",
            disable=not progress,
            leave=False,
        )
        last_save = time.monotonic()
        # Writes overlap the next batch's forward: a writer thread converts and pwrite()s
        # batch k while the main thread runs batch k+1 (both release the GIL). At most one
        # batch is in flight, so memory stays flat; a write error surfaces at the next wait.
        writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="activations-writer")
        trim_heap = _HeapTrimmer()
        pending = None

        def write_batch(items, housekeeping: bool):
            for si, arr in items:
                start = data_offset + int(offsets[si]) * hidden * itemsize
                for layer in range(n_layers):  # each layer's rows are contiguous (no copy for float32)
                    block = _to_storage(arr[layer], dtype)
                    _pwrite_all(fd, memoryview(block).cast("B"), start + layer * layer_stride)
            if housekeeping:  # off the forward pass' thread: flush written pages
                os.fdatasync(fd)
            trim_heap()  # off the forward pass' thread: return freed heap once RSS has grown

        # One generator over every remaining sentence, in batch order: the handle tokenises
        # the next batch while this one runs. It yields a batch's sentences only after it has
        # run the batch, so the handle's stats are diffed per batch for the resume record.
        remaining = [int(i) for c in chunks[done:] for i in c]
        states_iter = handle.word_states([sentences[i] for i in remaining], pooling=pooling, stack=stack,
                                         batch_size=batch_size, chunk_size=batch_size)
        try:
            for ci in range(done, len(chunks)):
                chunk = chunks[ci]
                before = Counter(handle.stats)
                states = itertools.islice(states_iter, len(chunk))
                items = []
                for si, arr in zip(chunk, states):
                    arr = np.asarray(arr)
                    if arr.shape != (n_layers, lengths[si], hidden):
                        raise CheckpointError(
                            f"{getattr(handle, 'path', None) or 'model handle'}: word_states returned shape "
                            f"{arr.shape} for sentence {si} of {dataset_key!r}, expected {(n_layers, int(lengths[si]), hidden)}"
                        )
                    items.append((si, arr))
                if len(items) != len(chunk):
                    raise CheckpointError(
                        f"{getattr(handle, 'path', None) or 'model handle'}: word_states yielded {len(items)} arrays "
                        f"for {len(chunk)} sentences"
                    )
                if pending is not None:
                    pending.result()
                pending = writer.submit(write_batch, [(si, a) for si, a in items if lengths[si] > 0], ci % 8 == 7)
                del items, states
                for k, v in (Counter(handle.stats) - before).items():
                    stats[k] = stats.get(k, 0) + int(v)
                bar.update(int(lengths[chunk].sum()))
                if time.monotonic() - last_save >= checkpoint_every_s and ci + 1 < len(chunks):
                    pending.result()  # every batch up to ci is written
                    os.fsync(fd)  # data first, then the record that says it is there
                    atomic_write_json(partial / _PROGRESS_FILE, {"plan": plan, "chunks_done": ci + 1, "stats": stats})
                    last_save = time.monotonic()
            if pending is not None:
                pending.result()
        finally:
            states_iter.close()
            writer.shutdown(wait=True)
        bar.close()
        os.fsync(fd)
    finally:
        os.close(fd)


def extract(
    handle,
    sentences: Sequence[Sequence[str]],
    dataset_key: str,
    pooling: str = "first",
    stack: str | None = None,
    batch_size: int = 32,
    cache_dir: str | Path | None = None,
    dtype: str = "float32",
    progress: bool = True,
    checkpoint_every_s: float = 30.0,
) -> Activations:
    """All-layer word representations of `sentences` from `handle`, cached on disk.

    `handle` is a `workbench.running.models.ModelHandle` (or anything with its `word_states`,
    `checkpoint_hash`, `num_layers`, `hidden_size`, `stacks` and `stats`). `cache_dir` defaults to
    `cache_root()/activations`. The partial result is made durable every `checkpoint_every_s`
    seconds, which is how far an interrupted extraction can fall back.
    """
    if pooling not in POOLINGS:
        raise ConfigError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if batch_size < 1:
        raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
    sentences = [list(s) for s in sentences]
    for i, words in enumerate(sentences):
        for w in words:
            if not isinstance(w, str):
                raise ConfigError(f"sentence {i} of {dataset_key!r}: words must be str, got {type(w).__name__}")
    stack = resolve_stack(handle, stack)
    final = cache_path(handle, sentences, dataset_key, pooling, stack, dtype, cache_dir)
    root, name = final.parent, final.name
    if (final / _META_FILE).is_file():
        return Activations.load(final)

    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{name}.lock"):
        if (final / _META_FILE).is_file():  # another process finished it while we waited
            return Activations.load(final)
        n_layers = int(handle.num_layers[stack]) + 1
        hidden = int(handle.hidden_size)
        lengths = np.fromiter((len(s) for s in sentences), dtype=np.int64, count=len(sentences))
        offsets = np.zeros(len(sentences) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        n_words = int(offsets[-1])
        # longest first: the largest batch runs first (fails fast on memory) and the bar is honest
        order = np.argsort(-lengths, kind="stable")
        chunks = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
        plan = {
            "format_version": FORMAT_VERSION,
            "key": name,
            "checkpoint_hash": handle.checkpoint_hash,
            "dataset_key": dataset_key,
            "pooling": pooling,
            "stack": stack,
            "dtype": dtype,
            "compute_dtype": getattr(handle, "compute_dtype", "fp32"),  # the forward's precision (storage: dtype)
            "fingerprint": sentences_fingerprint(sentences),
            "shape": [n_layers, n_words, hidden],
            "num_sentences": len(sentences),
            "batch_size": batch_size,
        }
        partial = root / f".{name}.partial"
        done, stats = _resume_state(partial, plan)
        if done == 0:
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            # creates the .npy header and a sparse file of the final size; no pages stay resident
            mm = np.lib.format.open_memmap(partial / _LAYERS_FILE, mode="w+", dtype=_storage(dtype), shape=(n_layers, n_words, hidden))
            del mm
            atomic_write_json(partial / _PROGRESS_FILE, {"plan": plan, "chunks_done": 0, "stats": {}})
        _write_remaining(handle, sentences, partial, plan, chunks, done, stats, lengths, offsets,
                         progress, checkpoint_every_s)

        np.save(partial / _OFFSETS_FILE, offsets)
        meta = dict(plan, stats=stats, family=getattr(handle, "family", None), created=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        atomic_write_json(partial / _META_FILE, meta)
        (partial / _PROGRESS_FILE).unlink()
        if final.exists():  # stale folder without meta.json (cannot be produced by this code)
            shutil.rmtree(final)
        os.replace(partial, final)
    limit = os.environ.get(MAX_SIZE_ENV)
    if limit:
        prune_cache(parse_size(limit), cache_dir=root, keep=[final])
    return Activations.load(final)


# --------------------------------------------------------------------------- cache maintenance
# Entries are never evicted by extraction itself: the cache grows with every checkpoint x data set
# probed (a sweep over 11 checkpoints of 2 models fills tens of GB). `prune_cache` deletes the least
# recently used entries down to a size, or those unused for a while; `bertology cache prune` is its
# command line, and `$BERTOLOGY_ACTIVATION_CACHE_MAX` (e.g. "40G") makes every extraction prune to it.

_USED_FILE = "last_used"
MAX_SIZE_ENV = "BERTOLOGY_ACTIVATION_CACHE_MAX"


@dataclass
class CacheEntry:
    path: Path
    bytes: int
    last_used: float  # POSIX time: the last `Activations.load` (or the creation)
    dataset_key: str
    checkpoint_hash: str
    partial: bool  # an unfinished (or crashed) extraction


def _mark_used(path: Path) -> None:
    """Record a use (LRU order for pruning); a read-only cache simply keeps its old stamp."""
    try:
        (path / _USED_FILE).touch()
    except OSError:
        pass


def _folder_bytes(path: Path) -> int:
    """Disk blocks actually used (the layers file is sparse until written)."""
    total = 0
    for f in path.rglob("*"):
        try:
            st = f.lstat()
        except OSError:
            continue
        if f.is_file():
            total += st.st_blocks * 512
    return total


def cache_entries(cache_dir: str | Path | None = None) -> list[CacheEntry]:
    """Every entry of the activation cache (complete and partial), least recently used first."""
    root = _activations_dir(cache_dir)
    if not root.is_dir():
        return []
    out = []
    for path in root.iterdir():
        if not path.is_dir():
            continue
        partial = path.name.startswith(".") and path.name.endswith(".partial")
        meta_file = path / (_PROGRESS_FILE if partial else _META_FILE)
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            meta = meta.get("plan", meta) if partial else meta
        except (OSError, ValueError):
            meta = {}
        stamp = next((p.stat().st_mtime for p in (path / _USED_FILE, meta_file, path) if p.exists()), 0.0)
        out.append(CacheEntry(path, _folder_bytes(path), stamp, str(meta.get("dataset_key", "?")),
                              str(meta.get("checkpoint_hash", "?")), partial))
    return sorted(out, key=lambda e: e.last_used)


def parse_size(text: str) -> int:
    """'40G', '500M', '1.5T' or a plain number of bytes -> bytes."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)i?B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise ConfigError(f"cannot read size {text!r} (e.g. 40G, 500M, 1.5T)")
    return int(float(m.group(1)) * 1024 ** "_KMGT".index(m.group(2).upper() or "_"))


def prune_cache(max_bytes: int | None = None, older_than_s: float | None = None, cache_dir: str | Path | None = None,
                dry_run: bool = False, keep: Sequence[Path] = ()) -> list[CacheEntry]:
    """Delete cache entries: every entry unused for `older_than_s` seconds, then the least recently
    used until the total is at most `max_bytes`. An entry another process is extracting (its lock
    is held) is skipped; so are `keep` paths. Returns what was (or, with `dry_run`, would be) removed."""
    root = _activations_dir(cache_dir)
    entries = cache_entries(root)
    total = sum(e.bytes for e in entries)
    keep = {Path(k).resolve() for k in keep}
    now = time.time()
    removed = []
    for e in entries:  # least recently used first
        stale = older_than_s is not None and now - e.last_used > older_than_s
        over = max_bytes is not None and total > max_bytes
        if not (stale or over) or e.path.resolve() in keep:
            continue
        name = e.path.name[1 : -len(".partial")] if e.partial else e.path.name
        lock = root / f".{name}.lock"
        with open(lock, "a+") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # being written right now
            try:
                if not dry_run:
                    shutil.rmtree(e.path, ignore_errors=True)
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        removed.append(e)  # (the empty lock file stays: unlinking it could let two writers in)
        total -= e.bytes
    return removed


def resolve_stack(handle, stack: str | None) -> str:
    stacks = tuple(handle.stacks)
    if stack is None:
        return stacks[0]
    if stack not in stacks:
        raise ConfigError(f"stack {stack!r} not in this model's stacks {stacks}")
    return stack


def _resume_state(partial: Path, plan: dict) -> tuple[int, dict[str, int]]:
    """(chunks already written, stats so far) of a matching partial extraction, else (0, {})."""
    try:
        progress = json.loads((partial / _PROGRESS_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0, {}
    if progress.get("plan") != plan or not (partial / _LAYERS_FILE).is_file():
        return 0, {}
    return int(progress.get("chunks_done", 0)), {k: int(v) for k, v in progress.get("stats", {}).items()}


def _npy_data_offset(path: Path) -> int:
    mm = np.load(path, mmap_mode="r")
    offset = int(mm.offset)
    del mm
    return offset


def _load_malloc_trim():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to do
        return None


_MALLOC_TRIM = _load_malloc_trim()


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _resident_bytes() -> int | None:
    """This process' resident set size now (Linux /proc/self/statm), None where unreadable."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return None


class _HeapTrimmer:
    """Give freed heap memory back to the OS (glibc), at most every `min_interval` calls and only once
    resident memory has grown by `slack_bytes` over its reference (the RSS read at the first call,
    and at the first call after each trim). The writer thread calls it once per batch.

    Batches of varying size leave the heap fragmented once glibc's dynamic mmap threshold has risen,
    and RSS creeps upward (+129 MB from 50k to 204k words in `bench_extraction.py` with no trim).
    Trimming every 8th batch regardless kept RSS flat (+62 MB) but returned pages that the next
    forward pass faulted straight back in: on the benchmark's 1,500 sentences, 5x the page faults
    and +0.15 s of system time on a 4 s extraction, a third of extraction's overhead over the bare
    forward, for an RSS that was not growing. The worst case here is that schedule.
    """

    def __init__(self, slack_bytes: int = 32 << 20, min_interval: int = 8):
        self.slack, self.min_interval = slack_bytes, min_interval
        self.reference: int | None = None
        self.calls_since_trim = 0
        self.trims = 0

    def __call__(self) -> None:
        if _MALLOC_TRIM is None:
            return
        self.calls_since_trim += 1
        now = _resident_bytes()
        if now is None:
            return
        if self.reference is None:
            self.reference = now
        elif now > self.reference + self.slack and self.calls_since_trim >= self.min_interval:
            _MALLOC_TRIM(0)
            self.trims += 1
            self.reference, self.calls_since_trim = None, 0


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of a contiguous buffer at `offset` (no intermediate bytes copy)."""
    view = data
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive advisory lock, so two processes never write the same cache entry."""
    with open(path, "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
