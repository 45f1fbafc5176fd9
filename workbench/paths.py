"""Where things live: the data root, the runs root and the activation cache.

Each is an environment variable with a sensible default, so tests, CI and users can point the
workbench elsewhere without editing code.
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.errors import DataRootError

REPO_ROOT = Path(__file__).resolve().parent.parent
DATA_ENV = "BERTOLOGY_DATA"
RUNS_ENV = "BERTOLOGY_RUNS"
CACHE_ENV = "BERTOLOGY_CACHE"


def data_root(required: bool = True) -> Path:
    """`$BERTOLOGY_DATA`, else `../shared/data` beside the repository when it exists."""
    env = os.environ.get(DATA_ENV)
    if env:
        root = Path(env).expanduser().resolve()
    else:
        root = (REPO_ROOT.parent / "shared" / "data").resolve()
    if required and not root.is_dir():
        raise DataRootError(
            f"data root {root} does not exist: set ${DATA_ENV} to a folder holding the data sets "
            f"(or run `bertology data fetch --from MIRROR`)"
        )
    return root


def data_path(*parts: str) -> Path:
    """A file or folder under the data root, with a clear error when it is missing."""
    path = data_root().joinpath(*parts)
    if not path.exists():
        raise DataRootError(f"{path} is missing from the data root ({data_root()}); run `bertology data verify`")
    return path


def runs_root() -> Path:
    """`$BERTOLOGY_RUNS`, else `./runs` in the current directory."""
    return Path(os.environ.get(RUNS_ENV, "runs")).expanduser().resolve()


def cache_root() -> Path:
    """`$BERTOLOGY_CACHE`, else `<runs root>/cache` (activations, tokenised corpora)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser().resolve() if env else runs_root() / "cache"
