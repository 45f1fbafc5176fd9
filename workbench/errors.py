"""Error types: each names the file (and line, where there is one) that caused it."""

from __future__ import annotations

from pathlib import Path


class WorkbenchError(Exception):
    """Base class; the CLI turns these into a one-line message and exit code 2."""


class DataRootError(WorkbenchError):
    """The data root is missing, or a dataset is not where the data root says it should be."""


class DataFormatError(WorkbenchError):
    """Malformed input file. Message reads `path:line: what is wrong`."""

    def __init__(self, path: str | Path, line: int | None, message: str):
        self.path = str(path)
        self.line = line
        self.message = message
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


class CheckpointError(WorkbenchError):
    """A checkpoint folder is missing, corrupt, or does not match its tokenizer."""


class ConfigError(WorkbenchError):
    """A YAML config or CLI argument is invalid."""
