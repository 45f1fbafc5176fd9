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


class StoppedFromOutside(Exception):
    """Work stopped by something outside the workbench (a scheduler cancelled or killed a job): not
    bad input and not a bug. What finished is kept and the same command resumes; the CLI says so in
    one line and exits 1."""


def cli_errors(command, prog: str = "bertology") -> int:
    """Run a command-line entry point with the one error policy of every command.

    A WorkbenchError (bad input: missing or corrupt file, bad setting) becomes one line on stderr,
    `PROG: error: MESSAGE`, and exit status 2; so does a full disk (activation caches and
    checkpoints grow large), naming the file being written; work stopped from outside (a cancelled
    Slurm job) is one line and exit 1; Ctrl-C says that progress is kept and exits 130; anything else
    is a bug and keeps its traceback (exit 1).
    """
    import errno
    import sys

    try:
        return int(command() or 0)
    except WorkbenchError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except StoppedFromOutside as err:
        print(f"{prog}: error: {err} (what finished is kept; run the same command to resume)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{prog}: interrupted (progress so far is kept; run the same command to resume)", file=sys.stderr)
        return 130
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        where = f" writing {err.filename}" if err.filename else ""
        print(f"{prog}: error: no space left on the device{where}; free some (runs/cache can be deleted: it is "
              "rebuilt on demand) and run the same command to resume", file=sys.stderr)
        return 2


def yaml_problem(err: Exception) -> str:
    """A YAML parse error in one line: what is wrong and where (PyYAML's own message spans lines)."""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    mark = getattr(err, "problem_mark", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else problem
