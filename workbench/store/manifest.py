"""Run manifests: everything needed to say exactly what produced a result.

A manifest records the config, seeds, the data files and checkpoints read (each with its
sha256), the versions of the packages that compute the numbers, the git commit of the workbench
(and whether the working tree had uncommitted changes), the Python version, the host and the
start/end times in UTC. The results store writes one beside every run's rows; training and the
corpus builder can use the same helpers for their own manifests.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from workbench.errors import CheckpointError, DataRootError
from workbench.store.identity import checkpoint_hash, file_sha256
from workbench.io import sha256_files
from workbench.paths import REPO_ROOT, data_root

# Distribution names (as pip knows them) whose versions can change a number in a results table.
DEFAULT_PACKAGES = (
    "torch",
    "transformers",
    "tokenizers",
    "safetensors",
    "numpy",
    "scipy",
    "pandas",
    "pyarrow",
    "scikit-learn",
    "nltk",
    "bertology-workbench",
)


def utc_now_iso() -> str:
    """The current time in UTC as ISO 8601 with microseconds, e.g. 2026-11-21T15:30:12.123456+00:00."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds")


def package_versions(names: Iterable[str] = DEFAULT_PACKAGES) -> dict[str, str | None]:
    """Installed version of each distribution (None when not installed).

    Reads package metadata instead of importing, so recording torch's version costs no import.
    """
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_state(repo: str | Path = REPO_ROOT) -> dict[str, Any] | None:
    """`{"commit": sha, "dirty": bool}` of the checkout at `repo`, or None outside a git checkout.

    `dirty` counts changes to tracked files only (untracked scratch files do not change what the
    code computes). A checkout whose top level is not `repo` (e.g. the package installed inside
    some unrelated repository) counts as no checkout, so a manifest never names a wrong commit.
    """
    repo = Path(repo).resolve()

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    top = git("rev-parse", "--show-toplevel")
    if top is None or Path(top).resolve() != repo:
        return None
    commit = git("rev-parse", "HEAD")
    if commit is None:  # a fresh repository without commits
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def data_file_record(path: str | Path) -> dict[str, Any]:
    """`{"path", "data_relpath", "bytes", "sha256"}` of one input file.

    `data_relpath` is the path relative to the data root when the file lies under it, so a
    manifest stays meaningful on a machine whose data root is elsewhere.
    """
    p = Path(path).expanduser().resolve()
    if not p.is_file():
        raise DataRootError(f"data file {p} recorded in a run manifest does not exist")
    rel = None
    try:
        rel = str(p.relative_to(data_root(required=False)))
    except ValueError:
        pass
    return {"path": str(p), "data_relpath": rel, "bytes": p.stat().st_size, "sha256": file_sha256(p)}


def source_fingerprint(packages: Iterable[str] = ("workbench", "probes")) -> str:
    """sha256 over the Python source of the packages that compute the numbers.

    Unlike the git commit it also changes with uncommitted edits, so work saved by one version of
    the code (e.g. the finished pieces of an interrupted probe run) is never reused by another.
    """
    files = sorted(f for pkg in packages for f in (REPO_ROOT / pkg).rglob("*.py") if "__pycache__" not in f.parts)
    return sha256_files(files, root=REPO_ROOT)


def checkpoint_record(ckpt: Any) -> dict[str, Any]:
    """`{"path", "sha256"}` for one checkpoint given as

    - a path (folder or weights file): hashed here;
    - a mapping with "path" and optionally a precomputed "sha256" (other keys are kept);
    - a `(path, sha256)` pair;
    - a model handle (anything with `.path` and `.checkpoint_hash`), in-memory models included.
    """
    if isinstance(ckpt, (str, os.PathLike)):
        p = Path(ckpt).expanduser().resolve()
        return {"path": str(p), "sha256": checkpoint_hash(p)}
    if isinstance(ckpt, Mapping):
        rec = dict(ckpt)
        if rec.get("path") is None and rec.get("sha256") is None:
            raise CheckpointError(f"checkpoint record {rec!r} names neither a path nor a sha256")
        if rec.get("path") is not None:
            rec["path"] = str(Path(rec["path"]).expanduser().resolve())
        if rec.get("sha256") is None:
            rec["sha256"] = checkpoint_hash(rec["path"])
        return rec
    if isinstance(ckpt, tuple) and len(ckpt) == 2:
        path, digest = ckpt
        return checkpoint_record({"path": path, "sha256": digest})
    if hasattr(ckpt, "checkpoint_hash"):
        path = getattr(ckpt, "path", None)
        return {
            "path": None if path is None else str(Path(path).expanduser().resolve()),
            "sha256": ckpt.checkpoint_hash,
            "family": getattr(ckpt, "family", None),
        }
    raise CheckpointError(
        f"cannot record checkpoint {ckpt!r}: give a path, a (path, sha256) pair, a dict or a model handle"
    )


def environment() -> dict[str, Any]:
    """Python, platform, host and process: where a run happened."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "argv": list(sys.argv),
    }


def build_manifest(
    config: Mapping[str, Any],
    *,
    seeds: Iterable[int] | Mapping[str, int] = (),
    data_files: Iterable[str | Path] = (),
    checkpoints: Iterable[Any] = (),
    started: str | None = None,
    packages: Iterable[str] = DEFAULT_PACKAGES,
) -> dict[str, Any]:
    """The provenance part of a manifest (the caller adds its own fields, e.g. the finish time)."""
    # A mapping names each seed's role ({"probe": 0, "split": 1}); a plain sequence lists them.
    seeds = {str(k): int(v) for k, v in seeds.items()} if isinstance(seeds, Mapping) else [int(s) for s in seeds]
    return {
        "started": started or utc_now_iso(),
        "config": dict(config),
        "seeds": seeds,
        "data_files": [data_file_record(p) for p in data_files],
        "checkpoints": [checkpoint_record(c) for c in checkpoints],
        "packages": package_versions(packages),
        "git": git_state(),
        "environment": environment(),
    }
