"""One way to say how far a job has got and to tell the user something: progress and logging.

Before this module the workbench reported four ways: tqdm bars in sixteen modules, `tqdm.write`,
`print` and callbacks, and no `logging`. A bar written to a file (a Slurm log, `2> run.log`, a CI
log) is a stream of carriage-return frames: thousands of redraws on one "line" that a pager shows
as one unreadable line and `grep` cannot use. So:

- `progress(...)` draws a tqdm bar only when its stream (stderr) is a terminal, or in a Jupyter
  kernel (`in_notebook`: tqdm's notebook widget where ipywidgets is installed, else its text bar,
  whose carriage returns Jupyter redraws in place; the kernel's stderr is no terminal and a cell's
  output is no log file). Anywhere else it
  writes a plain line at most every `interval` seconds through `logging`,
  `desc: 40/200 step (20%) 12 s elapsed, ~49 s left, loss=2.310`, and a last "done" line when it
  wrote any; a job shorter than one interval writes nothing. No carriage return reaches a file.
- Messages go through `get_logger(__name__)`: loggers under the one `bertology` namespace, with one
  handler that writes to the stderr of the moment (pytest's capture, a redirected stream). On a
  terminal a message is written with `tqdm.write`, so it does not tear a live bar; elsewhere each
  line carries a timestamp, which is what a log file needs. Warnings read `warning: ...`.
  A command's results (tables, JSON, run ids) are not messages: they stay `print`s on stdout.
- One quiet switch (`set_quiet`, `bertology --quiet`, or `BERTOLOGY_QUIET=1`) turns off every
  progress bar and line and every info message; warnings and errors still show. It lives in the
  environment so that worker processes (spawned local jobs, submitit) inherit it.

The handler is attached when this module is imported (only to the `bertology` namespace, never to
the root logger), so a message a driver used to `print` still shows when the library is called
from Python; a host application that wants its own handling removes it or sets
`logging.getLogger("bertology").propagate`/handlers as it likes. The CLI calls `configure_logging`
once, before the command runs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Callable, Iterable, Iterator

NAMESPACE = "bertology"
QUIET_ENV = "BERTOLOGY_QUIET"
DEFAULT_INTERVAL = 30.0  # seconds between two plain progress lines (a log file, not a terminal)


# --------------------------------------------------------------------------- quiet switch
def is_quiet() -> bool:
    """Whether progress and info messages are off (`set_quiet`, `--quiet` or `BERTOLOGY_QUIET=1`)."""
    return os.environ.get(QUIET_ENV, "").strip().lower() not in ("", "0", "false", "no")


def set_quiet(quiet: bool) -> None:
    """Turn progress and info messages off (or back on) here and in worker processes started later.

    The switch is an environment variable: a spawned process re-imports this module with it set."""
    if quiet:
        os.environ[QUIET_ENV] = "1"
    else:
        os.environ.pop(QUIET_ENV, None)
    _root().setLevel(logging.WARNING if quiet else _level)


# --------------------------------------------------------------------------- logging
def get_logger(name: str) -> logging.Logger:
    """The logger of a module: `get_logger(__name__)` gives `bertology.<module>`, under the one
    handler and level this module configures."""
    return logging.getLogger(name if name == NAMESPACE or name.startswith(NAMESPACE + ".") else f"{NAMESPACE}.{name}")


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell), where progress draws a
    notebook bar instead of log lines. Only asks IPython when it is already imported: a plain
    script never pays for the import."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except AttributeError:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def stream_is_terminal(stream=None) -> bool:
    """Whether `stream` (default: the current stderr) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class MessageFormatter(logging.Formatter):
    """`message` on a terminal; `YYYY-mm-dd HH:MM:SS message` elsewhere (a log file wants the time).
    Warnings and errors read `warning: message` / `error: message`, the workbench's usual words."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text = f"{text}\n{self.formatException(record.exc_info)}"
        if record.levelno >= logging.WARNING:
            text = f"{'warning' if record.levelno == logging.WARNING else 'error'}: {text}"
        if not stream_is_terminal():
            text = f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(record.created))} {text}"
        return text


class StderrHandler(logging.Handler):
    """Writes to `sys.stderr` as it is when the record comes (not when the handler was made), so
    pytest's capture and a redirected stderr see the messages; through `tqdm.write` on a terminal,
    which lifts a live bar above the message instead of overwriting it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            stream = sys.stderr
            if stream_is_terminal(stream):
                from tqdm import tqdm

                tqdm.write(text, file=stream)
            else:
                stream.write(text + "\n")
                stream.flush()
        except Exception:  # logging's own policy: a broken stream never breaks the job
            self.handleError(record)


_level = logging.INFO


def _root() -> logging.Logger:
    return logging.getLogger(NAMESPACE)


def _install() -> None:
    """Attach the one handler to the `bertology` logger (once, however often this is called)."""
    root = _root()
    if not any(isinstance(h, StderrHandler) for h in root.handlers):
        handler = StderrHandler()
        handler.setFormatter(MessageFormatter())
        root.addHandler(handler)
    root.setLevel(logging.WARNING if is_quiet() else _level)


def configure_logging(quiet: bool | None = None, level: int | str | None = None) -> None:
    """Set up messages and progress once for a command: the quiet switch, the message level (INFO
    by default; `quiet` raises it to WARNING). Off a terminal, or when quiet, the Hugging Face
    libraries' own bars are turned off too (they would put carriage returns in the log), unless
    the user chose with `HF_HUB_DISABLE_PROGRESS_BARS`."""
    global _level
    if level is not None:
        _level = logging.getLevelName(level.upper()) if isinstance(level, str) else int(level)
        if not isinstance(_level, int):
            raise ValueError(f"unknown logging level {level!r}")
    _install()
    if quiet is not None:
        set_quiet(quiet)
    if is_quiet() or not stream_is_terminal():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


_install()


# --------------------------------------------------------------------------- progress
def _duration(seconds: float) -> str:
    """A duration a reader takes in at a glance: 4.2 s, 49 s, 12.5 min, 3.1 h."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


class SilentProgress:
    """What `progress` returns when nothing is to be shown: tqdm's interface, doing nothing."""

    def __init__(self, iterable: Iterable | None = None, total: int | None = None, initial: int = 0):
        self.iterable, self.total, self.n = iterable, total, initial

    def __iter__(self) -> Iterator:
        for item in self.iterable if self.iterable is not None else ():
            yield item
            self.n += 1

    def __len__(self) -> int:
        return self.total if self.total is not None else len(self.iterable)  # type: ignore[arg-type]

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        pass

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


class LineProgress(SilentProgress):
    """Progress as plain log lines, at most one every `interval` seconds of `clock` (tests pass a
    fake clock), then a "done" line at `close` when any line was written and `leave` is set."""

    def __init__(self, iterable: Iterable | None, total: int | None, desc: str, unit: str, initial: int,
                 leave: bool, interval: float, clock: Callable[[], float]):
        super().__init__(iterable, total, initial)
        self.desc, self.unit, self.leave, self.interval, self.clock = desc, unit, leave, interval, clock
        self.start = self.last = clock()
        self.initial = initial
        self.postfix = ""
        self.lines = 0
        self.closed = False
        self.log = get_logger("progress")

    def __iter__(self) -> Iterator:
        try:
            for item in self.iterable if self.iterable is not None else ():
                yield item
                self.update(1)
        finally:
            self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if now - self.last >= self.interval:
            self.last = now
            self.lines += 1
            self.log.info(self.line(now))

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = "".join(f", {k}={v}" for k, v in items.items())

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def line(self, now: float, done: bool = False) -> str:
        """`desc: 40/200 step (20%) 12 s elapsed, ~49 s left, loss=2.310` (no total: `desc: 40 step, 12 s elapsed`)."""
        elapsed = now - self.start
        head = f"{self.desc}: " if self.desc else ""
        if done:
            count = f"{self.n}/{self.total} {self.unit}" if self.total else f"{self.n} {self.unit}"
            return f"{head}{count} done in {_duration(elapsed)}{self.postfix}"
        if not self.total:
            return f"{head}{self.n} {self.unit}, {_duration(elapsed)} elapsed{self.postfix}"
        rate = (self.n - self.initial) / elapsed if elapsed > 0 else 0.0
        left = f", ~{_duration((self.total - self.n) / rate)} left" if rate > 0 and self.n < self.total else ""
        return (f"{head}{self.n}/{self.total} {self.unit} ({100 * self.n / self.total:.0f}%) "
                f"{_duration(elapsed)} elapsed{left}{self.postfix}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.lines and self.leave:
            self.log.info(self.line(self.clock(), done=True))


def progress(iterable: Iterable | None = None, total: int | None = None, desc: str = "", unit: str = "it",
             initial: int = 0, leave: bool = True, disable: bool = False, interval: float | None = None,
             stream=None, clock: Callable[[], float] = time.monotonic, **tqdm_kwargs: Any):
    """A progress bar on a terminal, plain periodic lines elsewhere, nothing when quiet.

    Called like `tqdm` (wrap an iterable, or `update(n)` a `total`; `set_postfix`, `close`, a
    context manager); `disable` is the caller's own switch (a config's `progress: false`). `stream`
    is where a bar would go (default stderr); when it is not a terminal the lines go through the
    `bertology.progress` logger every `interval` seconds (default 30), timed by `clock`. Other
    keyword arguments go to tqdm (a terminal only)."""
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    if disable or is_quiet():
        return SilentProgress(iterable, total, initial)
    stream = sys.stderr if stream is None else stream
    if in_notebook():
        return notebook_bar(iterable, total=total, desc=desc or None, unit=unit, initial=initial, leave=leave,
                            **tqdm_kwargs)
    if stream_is_terminal(stream):
        from tqdm import tqdm

        tqdm_kwargs.setdefault("dynamic_ncols", True)
        return tqdm(iterable, total=total, desc=desc or None, unit=unit, initial=initial, leave=leave, file=stream,
                    **tqdm_kwargs)
    return LineProgress(iterable, total, desc, unit, initial, leave,
                        DEFAULT_INTERVAL if interval is None else float(interval), clock)


def notebook_bar(iterable: Iterable | None = None, **kwargs: Any):
    """tqdm's notebook widget (`tqdm.notebook`), or its text bar on the kernel's stderr when
    ipywidgets is not installed (the widget needs it; Jupyter redraws the text bar in place)."""
    from tqdm import tqdm
    from tqdm.notebook import tqdm as widget_bar

    try:
        return widget_bar(iterable, **kwargs)
    except ImportError:  # "IProgress not found": no ipywidgets
        return tqdm(iterable, file=sys.stderr, **kwargs)
