"""Atomic writes and file hashing: the only way the workbench puts bytes on disk; and the one
reader of YAML files (`read_yaml`).

Every write goes to a temporary file in the destination folder and is renamed into place, so
a reader (or a crash) never sees half a file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj) -> Path:
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path`; rename it to `path` only if the block succeeds.

    For libraries that insist on writing to a filename themselves (pyarrow, safetensors).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; it becomes `path` only if the block succeeds.

    An existing `path` is replaced. A crash leaves only a hidden `.name.*.tmp` folder behind,
    which readers ignore.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old-{os.getpid()}")
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: str | Path, chunk_size: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_size):
            h.update(chunk)
    return h.hexdigest()


def sha256_files(paths: list[str | Path], root: str | Path | None = None) -> str:
    """One hash over several files (names relative to `root` included), e.g. a checkpoint's weights."""
    h = hashlib.sha256()
    for p in sorted(Path(p) for p in paths):
        name = str(p.relative_to(root)) if root is not None else p.name
        h.update(name.encode())
        h.update(sha256_file(p).encode())
    return h.hexdigest()


def read_yaml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """The mapping at the top of the YAML file `path` (an empty file is `{}`).

    Every YAML file the workbench reads (training, fine-tuning, probe, experiment, figure and
    shadow-set configs) comes through here, so every one fails the same way: a ConfigError that
    names the file, and for a syntax error the line (`path:LINE: not valid YAML: ... at line L,
    column C`, from PyYAML's problem_mark); a list or a scalar at the top level is refused.
    `what` names the kind of file in the message for a missing one ("config file does not exist").
    """
    import yaml

    from workbench.errors import ConfigError, yaml_problem

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: {what} does not exist")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: cannot read the {what} ({err})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(f"{where}: not valid YAML: {yaml_problem(err)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data
