"""One executor layer: a list of independent units, run in this process, in local processes, through
submitit's local executor or on a Slurm cluster, results in unit order.

Every driver's independent pieces of work go through `run_units`: the experiment runner's probe
runs (`app.experiments`), the prune sweep's seeds and retrainings (`workbench.drivers.prune_sweep`), the
PEFT sweep's methods (`workbench.drivers.peft_sweep`), the fine-tuning seeds (`workbench.drivers.finetune`), the
distillation points (`workbench.drivers.distill`) and students (`workbench.drivers.distill_pretraining`). A unit is
a picklable callable, a `(function, kwargs)` pair or a `Unit` (function, args, kwargs, name); it
must not depend on another unit of the same list (a driver that has dependent stages calls
`run_units` once per stage) and should write what it makes itself (a folder, a `point.json`), so
that a rerun after a crash finds the finished ones.

Where units run (`ExecutorOptions.executor`, `--executor`; `--jobs N`):

| executor | jobs | what happens |
|---|---|---|
| local | 1 (default) | one after the other in this process, exceptions as they are |
| local | N > 1 | N spawned processes (`concurrent.futures`, a clean torch in each, `threads` torch threads each) |
| submitit-local | N (default: all) | one submitit job per unit on this machine, at most N in flight |
| slurm | N (default: all) | one submitit job per unit on the cluster (`slurm_partition`, `timeout_min`, `slurm`: further submitit parameters), at most N in flight |

submitit (Facebook Research's job launcher) pickles each call with cloudpickle into `folder` and
runs it in a fresh process, the same function the other executors call, so a unit's result does
not depend on the executor (parallel units run with one torch thread each; float sums over one
thread can differ in the last bits from a multi-threaded run, so a driver's tests compare a
parallel run with an in-process one at `threads: 1`).

On Slurm a unit's end is known from its result file, and otherwise from the scheduler's queue
(`squeue -t all`): a job that left the running states without a result (cancelled with `scancel`,
killed by the scheduler, timed out, lost with its node) is a failed unit, reported with its Slurm
state and log. submitit itself asks `sacct`, which needs Slurm's accounting (slurmdbd); without it
submitit never sees such a job end and would wait forever, so the executor does not rely on it. A
rerun of the same command resumes: each driver's units skip what they already wrote. `--slurm-partition`
is checked against `sinfo` before any work.

A failed unit stops the rest (pending units are cancelled) and is named: in this process the
exception propagates unchanged with a note naming the unit; from a worker a `WorkbenchError` (bad
input: exit 2) comes back as the same class with the unit's name in front of its message, any
other failure as `UnitError` naming the unit and the worker's exception.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError, StoppedFromOutside, WorkbenchError

EXECUTORS = ("local", "submitit-local", "slurm")
DEFAULT_TIMEOUT_MIN = 240  # what each submitit job may run (the experiment runner's and distill's default)
# Slurm job states in which a job may still write its result (squeue's long names); any other state
# without a result file is the end of the job (CANCELLED, FAILED, TIMEOUT, NODE_FAIL, OUT_OF_MEMORY,
# PREEMPTED, BOOT_FAIL, DEADLINE, COMPLETED before the result appeared).
SLURM_LIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                               "REQUEUE_FED", "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                               "RESV_DEL_HOLD"})
QUEUE_POLL_S = 5.0      # how often the queue is asked about jobs without a result
RESULT_GRACE_S = 10.0   # how long an ended job's result file may lag its state (a shared file system)


class UnitError(RuntimeError):
    """A unit failed in a worker (a local process or a submitit job); `unit` is its name."""

    def __init__(self, unit: str, message: str):
        super().__init__(message)
        self.unit = unit


class JobEndedError(UnitError, StoppedFromOutside):
    """The scheduler ended a unit's job (cancelled, timed out, killed) before it wrote a result."""


@dataclass(frozen=True)
class Unit:
    """One independent piece of work: `fn(*args, **kwargs)`, named `name` in progress and errors."""

    fn: Callable[..., Any]
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    name: str | None = None

    def label(self, index: int) -> str:
        return self.name or f"#{index} {getattr(self.fn, '__qualname__', repr(self.fn))}"


@dataclass(frozen=True)
class ExecutorOptions:
    """Where a driver's units run (module docstring); `validate` before any work."""

    executor: str = "local"
    jobs: int | None = None            # local: processes (None = 1: this process); submitit: most jobs in flight (None: all)
    folder: str | None = None          # submitit's job files (pickles, logs); the driver gives its own default
    timeout_min: int = DEFAULT_TIMEOUT_MIN
    slurm_partition: str | None = None
    slurm: dict = field(default_factory=dict)  # further submitit parameters: cpus_per_task, mem_gb, gpus_per_node, slurm_*
    threads: int | None = 1            # torch threads in each worker (None: torch's default)
    progress: bool = True

    def validate(self) -> "ExecutorOptions":
        """Raise ConfigError (one line, before any work) for a bad executor, jobs or timeout."""
        if self.executor not in EXECUTORS:
            raise ConfigError(f"--executor must be one of {', '.join(EXECUTORS)}, got {self.executor!r}")
        if self.jobs is not None and (isinstance(self.jobs, bool) or not isinstance(self.jobs, int) or self.jobs < 1):
            raise ConfigError(f"--jobs must be >= 1, got {self.jobs}")
        if not isinstance(self.timeout_min, int) or self.timeout_min < 1:
            raise ConfigError(f"--timeout-min must be >= 1, got {self.timeout_min}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"executor threads must be >= 1, got {self.threads}")
        if not isinstance(self.slurm, dict):
            raise ConfigError(f"slurm: expected a mapping of submitit parameters, got {self.slurm!r}")
        return self

    @property
    def in_process(self) -> bool:
        """True when units run one after the other in this process (local, one job)."""
        return self.executor == "local" and (self.jobs or 1) == 1

    def runs_in_process(self, n_units: int) -> bool:
        """True when `run_units` runs these many units in this process (one job, or one local unit:
        no process is spawned for a single unit)."""
        return self.in_process or (self.executor == "local" and n_units < 2)

    def submitit_parameters(self) -> dict:
        params: dict[str, Any] = {"timeout_min": int(self.slurm.get("timeout_min", self.timeout_min))}
        if self.slurm_partition:
            params["slurm_partition"] = self.slurm_partition
        params.update({k: v for k, v in self.slurm.items() if k != "timeout_min"})
        return params


def executor_options(executor: str = "local", jobs: int | None = None, **kw) -> ExecutorOptions:
    """Validated `ExecutorOptions` (ConfigError for bad input)."""
    return ExecutorOptions(executor=executor, jobs=jobs, **kw).validate()


def resolve_options(executor: "str | ExecutorOptions | None" = "local", jobs: int | None = None,
                    **defaults: Any) -> ExecutorOptions:
    """The drivers' entry points take `executor` as a name (with `jobs`, as before this layer) or as
    `ExecutorOptions`; either way validated here, before any work. `defaults` (e.g. `folder`) fill
    what the options leave unset."""
    if isinstance(executor, ExecutorOptions):
        options = executor if jobs is None else dataclasses.replace(executor, jobs=jobs)
        fill = {k: v for k, v in defaults.items() if getattr(options, k) is None}
        return dataclasses.replace(options, **fill).validate()
    return ExecutorOptions(executor=executor or "local", jobs=jobs, **defaults).validate()


def add_executor_arguments(parser: argparse.ArgumentParser, what: str = "units") -> None:
    """The executor flags every driver's subcommand has: --executor, --jobs, --slurm-partition, --timeout-min."""
    parser.add_argument("--jobs", type=int, default=None,
                        help=f"independent {what} at once: local processes, or submitit jobs in flight (default 1 "
                             f"locally, all with submitit)")
    parser.add_argument("--executor", default="local", choices=EXECUTORS,
                        help=f"where {what} execute: this process / local processes (--jobs), or one submitit job "
                             f"per unit on this machine or on Slurm (default local)")
    parser.add_argument("--slurm-partition", default=None, help="Slurm partition (--executor slurm)")
    parser.add_argument("--timeout-min", type=int, default=DEFAULT_TIMEOUT_MIN,
                        help=f"minutes each submitit job may run (default {DEFAULT_TIMEOUT_MIN})")
    parser.add_argument("--slurm-param", action="append", default=[], metavar="KEY=VALUE",
                        help="a further submitit parameter for each job, repeatable (--executor slurm): "
                             "cpus_per_task=4, mem_gb=16, gpus_per_node=1, slurm_account=NAME, slurm_qos=NAME")


def parse_slurm_params(pairs: Sequence[str]) -> dict[str, Any]:
    """`--slurm-param KEY=VALUE` pairs as submitit parameters (a number where the value is one)."""
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"--slurm-param expects KEY=VALUE (e.g. cpus_per_task=4), got {pair!r}")
        value = value.strip()
        params[key.strip()] = int(value) if value.isdigit() else value
    return params


def options_from_args(args: argparse.Namespace, folder: str | None = None,
                      progress: bool | None = None) -> ExecutorOptions:
    """`ExecutorOptions` from the flags `add_executor_arguments` adds (validated; `--quiet`: no bar)."""
    if progress is None:
        progress = not getattr(args, "quiet", False)
    options = executor_options(getattr(args, "executor", "local"), getattr(args, "jobs", None), folder=folder,
                               timeout_min=getattr(args, "timeout_min", DEFAULT_TIMEOUT_MIN),
                               slurm_partition=getattr(args, "slurm_partition", None), progress=progress,
                               slurm=parse_slurm_params(getattr(args, "slurm_param", None) or []))
    check_cluster(options)
    return options


def check_cluster(options: ExecutorOptions) -> None:
    """For `--executor slurm`: the Slurm commands are on PATH and the partition exists (`sinfo`), so a
    typo is one line and exit 2 before any work rather than a failed submission after the first stage."""
    if options.executor != "slurm":
        return
    missing = [cmd for cmd in ("sbatch", "squeue", "sinfo", "scancel") if shutil.which(cmd) is None]
    if missing:
        raise ConfigError(f"--executor slurm needs the Slurm commands on PATH; missing: {', '.join(missing)}")
    listed = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True)
    if listed.returncode != 0:
        raise ConfigError(f"--executor slurm: sinfo cannot reach the cluster: {listed.stderr.strip() or listed.returncode}")
    partitions = sorted({line.strip() for line in listed.stdout.splitlines() if line.strip()})
    if options.slurm_partition is not None and options.slurm_partition not in partitions:
        raise ConfigError(f"--slurm-partition {options.slurm_partition!r} is not a partition of this cluster "
                          f"(sinfo lists: {', '.join(partitions) or 'none'})")


def as_unit(item: Any) -> Unit:
    """A `Unit` from a Unit, a callable, a (function, kwargs) pair or a (function, args, kwargs) triple."""
    if isinstance(item, Unit):
        return item
    if callable(item):
        return Unit(item)
    if isinstance(item, tuple) and item and callable(item[0]):
        if len(item) == 2 and isinstance(item[1], dict):
            return Unit(item[0], kwargs=dict(item[1]))
        if len(item) == 2 and isinstance(item[1], tuple):
            return Unit(item[0], args=item[1])
        if len(item) == 3 and isinstance(item[1], tuple) and isinstance(item[2], dict):
            return Unit(item[0], args=item[1], kwargs=dict(item[2]))
    raise TypeError(f"not a unit (a callable, a (function, kwargs) pair or a Unit): {item!r}")


@dataclass(frozen=True)
class Raised:
    """What a worker returns for a unit that raised: the exception itself (when it pickles) and its
    traceback as text, so the parent raises the same error whatever carried it back."""

    error: BaseException
    traceback: str


def call_unit(fn: Callable[..., Any], args: tuple, kwargs: dict, threads: int | None) -> Any:
    """What a worker runs: `fn(*args, **kwargs)` with `threads` torch threads (module level: picklable);
    an exception comes back as `Raised`."""
    import pickle
    import traceback

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        text = traceback.format_exc()
        try:
            pickle.loads(pickle.dumps(e))
        except Exception:  # an exception that does not survive pickling: its class name and message
            e = RuntimeError(f"{type(e).__name__}: {e}")
        return Raised(e, text)


def run_units(units: Sequence[Any], options: ExecutorOptions | None = None, desc: str = "units") -> list[Any]:
    """Run every unit where `options` say (module docstring); their return values in unit order."""
    options = (options or ExecutorOptions()).validate()
    todo = [as_unit(u) for u in units]
    if not todo:
        return []
    if options.runs_in_process(len(todo)):
        return _in_process(todo, options, desc)
    if options.executor == "local":
        return _in_processes(todo, options, desc)
    return _with_submitit(todo, options, desc)


def _bar(total: int, options: ExecutorOptions, desc: str):
    """Units done out of all (`workbench.progress`: a bar on a terminal, plain lines in a log file)."""
    from workbench.progress import progress

    return progress(total=total, desc=desc, unit="unit", disable=not options.progress or total < 2)


def _in_process(todo: list[Unit], options: ExecutorOptions, desc: str) -> list[Any]:
    out = []
    with _bar(len(todo), options, desc) as bar:
        for i, unit in enumerate(todo):
            try:
                out.append(unit.fn(*unit.args, **unit.kwargs))
            except Exception as e:
                e.add_note(f"(in {desc} unit {unit.label(i)})")
                raise
            bar.update()
    return out


def _failed(unit: str, error: BaseException) -> Exception:
    """The error the parent raises for a unit that failed in a worker (module docstring)."""
    if isinstance(error, WorkbenchError):
        try:
            return type(error)(f"{unit}: {error}")
        except TypeError:  # an error class with another constructor
            pass
    return UnitError(unit, f"unit {unit} failed: {type(error).__name__}: {error}")


def _in_processes(todo: list[Unit], options: ExecutorOptions, desc: str) -> list[Any]:
    """The units in `jobs` spawned local processes (a clean torch in each), one progress bar."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    results: dict[int, Any] = {}
    pool = ProcessPoolExecutor(max_workers=min(options.jobs or 1, len(todo)),
                               mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(call_unit, u.fn, u.args, u.kwargs, options.threads): i for i, u in enumerate(todo)}
        with _bar(len(todo), options, desc) as bar:
            for fut in as_completed(futures):
                i = futures[fut]
                error = fut.exception()
                value = None if error is not None else fut.result()
                if isinstance(value, Raised):
                    error = value.error
                if error is not None:
                    pool.shutdown(wait=True, cancel_futures=True)
                    raise _failed(todo[i].label(i), error) from error
                results[i] = value
                bar.update()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return [results[i] for i in range(len(todo))]


def _with_submitit(todo: list[Unit], options: ExecutorOptions, desc: str) -> list[Any]:
    """One submitit job per unit (submitit's local executor or Slurm), at most `jobs` in flight; job
    files under `options.folder` (default ./submitit)."""
    import submitit

    check_cluster(options)
    folder = options.folder or "submitit"
    ex = submitit.AutoExecutor(folder=str(folder), cluster="local" if options.executor == "submitit-local" else "slurm")
    queue_watch = SlurmQueueWatch() if options.executor == "slurm" else None
    ex.update_parameters(**options.submitit_parameters())
    cap = options.jobs or len(todo)
    results: dict[int, Any] = {}
    running: dict[int, Any] = {}
    queue = list(range(len(todo)))
    with _bar(len(todo), options, desc) as bar:
        try:
            while queue or running:
                while queue and len(running) < cap:
                    i = queue.pop(0)
                    u = todo[i]
                    running[i] = ex.submit(call_unit, u.fn, u.args, u.kwargs, options.threads)
                finished = [i for i, job in running.items() if job.done()]
                if not finished and queue_watch is not None:
                    for i, state in queue_watch.ended_without_result(running).items():
                        raise JobEndedError(todo[i].label(i), f"unit {todo[i].label(i)} failed: Slurm job "
                                        f"{running[i].job_id} ended {state} without a result "
                                        f"(log: {running[i].paths.stderr})")
                if not finished:
                    time.sleep(0.2)
                    continue
                for i in finished:
                    job = running.pop(i)
                    try:
                        value = job.result()
                    except Exception as e:  # the job died (killed, timed out): submitit's error carries its log
                        raise _submitit_failure(todo[i].label(i), e) from e
                    if isinstance(value, Raised):
                        raise _failed(todo[i].label(i), value.error) from value.error
                    results[i] = value
                    bar.update()
        finally:
            for job in running.values():
                try:
                    job.cancel(check=False)
                except Exception:  # a job that ended meanwhile
                    pass
    return [results[i] for i in range(len(todo))]


class SlurmQueueWatch:
    """Which running submitit jobs Slurm has ended without a result file (module docstring): asked of
    `squeue -t all` at most every `QUEUE_POLL_S`, an ended job given `RESULT_GRACE_S` for its result."""

    def __init__(self):
        self.last_poll = 0.0
        self.ended_at: dict[str, float] = {}

    def ended_without_result(self, running: dict[int, Any]) -> dict[int, str]:
        now = time.monotonic()
        if now - self.last_poll < QUEUE_POLL_S:
            return {}
        self.last_poll = now
        out = {}
        for i, job in running.items():
            state = slurm_job_state(job.job_id)
            if state is None or state in SLURM_LIVE_STATES or job.done():
                continue
            first_seen = self.ended_at.setdefault(job.job_id, now)
            if now - first_seen >= RESULT_GRACE_S:
                out[i] = state
        return out


def slurm_job_state(job_id: str) -> str | None:
    """The job's state as the controller knows it (`squeue -t all` lists ended jobs for its MinJobAge);
    "LOST" for a job id it no longer knows, None when the queue cannot be read now (try later)."""
    done = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%T", "-j", str(job_id)], capture_output=True, text=True)
    if done.returncode != 0:
        return "LOST" if "Invalid job id" in done.stderr else None
    states = done.stdout.split()
    return states[0] if states else "LOST"


def _submitit_failure(unit: str, error: Exception) -> Exception:
    """A submitit job that ended without a result (killed, timed out, out of memory): submitit's
    error as one line, with where its logs are."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip() and not set(line.strip()) <= {"-"}]
    return UnitError(unit, f"unit {unit} failed (submitit job): {' | '.join(lines[:1] + lines[-2:])}")


@dataclass(frozen=True)
class UnitPlan:
    """A driver's independent units as the executor runs them (`DriverSpec.units` returns one,
    `run_plan` runs it). `units(parallel)` builds the unit list: `parallel=False` when they run one
    after the other in this process (the driver's config as it is, its progress bars, state shared
    between units), `parallel=True` when each runs in a fresh process or a submitit job (a worker
    config: `replace_threads`, what a fresh process can open). `count` says how many there will be
    (the executor decides from it). submitit's job files go to `<home>/submitit[/<name>]` unless the
    options name a folder. `state` is what the driver's `collect` needs afterwards (the prepared run)."""

    units: Callable[[bool], Sequence[Any]]
    count: int
    home: Any                      # a folder (str or Path): the sweep folder, or the runs root with `name`
    name: str | None = None
    desc: str = "units"
    state: Any = None

    def job_folder(self) -> str:
        folder = Path(self.home) / "submitit"
        return str(folder / self.name if self.name else folder)


def run_plan(plan: UnitPlan, options: "ExecutorOptions | None" = None) -> list[Any]:
    """The one place every driver's branch lives (before, each driver copied it): the job folder's
    default, then the units built for this process or for workers (`UnitPlan`), run by `run_units`;
    their results in unit order."""
    options = (options or ExecutorOptions()).validate()
    if options.folder is None:
        options = dataclasses.replace(options, folder=plan.job_folder())
    parallel = not options.runs_in_process(plan.count)
    units = list(plan.units(parallel))
    return run_units(units, options, desc=plan.desc) if units else []


def run_driver_units(units: Callable[[bool], Sequence[Any]], count: int, options: "ExecutorOptions | None",
                     home, name: str | None = None, desc: str = "units") -> list[Any]:
    """`run_plan` of the plan these arguments make (a driver that runs its units inside its own `run`)."""
    return run_plan(UnitPlan(units, count, home, name, desc), options)


def replace_threads(config, threads_field: str = "threads", progress_field: str | None = "progress"):
    """A dataclass config for a parallel unit: one torch thread unless it sets its own, and no progress
    bars (several would interleave). The in-process path keeps the config as it is."""
    changes: dict[str, Any] = {}
    if getattr(config, threads_field, None) is None:
        changes[threads_field] = 1
    if progress_field is not None and hasattr(config, progress_field):
        changes[progress_field] = False
    return dataclasses.replace(config, **changes)
