"""The one executor layer (workbench/drivers/executor.py): units run in this process, in spawned local
processes (`--jobs N`) and as submitit jobs (submitit's local executor: the code path a Slurm
cluster takes) give their results in unit order; a failing unit is named; bad options are one
ConfigError before any work; and 8 processes writing runs to one results store at once lose
nothing, the catalog they leave equal to one rebuilt from the run folders (`bertology runs reindex`).

The units are plain functions of this module (picklable by reference; no torch import in the
workers: `threads=None`), so a test costs process start-ups, not computation."""

from __future__ import annotations

import os
import sqlite3

import pytest

from workbench.errors import ConfigError
from workbench.drivers.executor import ExecutorOptions, Unit, UnitError, add_executor_arguments, options_from_args, run_units


def square_after(x: int, delay: float = 0.0) -> tuple[int, int]:
    """x squared and the process id: units finishing out of order must still come back in order."""
    import time

    time.sleep(delay)
    return x * x, os.getpid()


def fail_on(x: int) -> int:
    if x == 2:
        raise ValueError(f"planted failure at {x}")
    if x == 3:
        raise ConfigError(f"planted bad input at {x}")
    return x


def test_in_process_runs_in_order_in_this_process():
    out = run_units([(square_after, {"x": i}) for i in range(4)], ExecutorOptions(progress=False))
    assert [v for v, _ in out] == [0, 1, 4, 9]
    assert {pid for _, pid in out} == {os.getpid()}


@pytest.mark.slow
def test_local_jobs_run_in_other_processes_and_keep_unit_order():
    """Unit 0 sleeps longest, so it finishes last; the results still come back in unit order."""
    units = [Unit(square_after, (i, 0.2 * (3 - i))) for i in range(4)]
    out = run_units(units, ExecutorOptions(jobs=2, threads=None, progress=False))
    assert [v for v, _ in out] == [0, 1, 4, 9]
    pids = {pid for _, pid in out}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2


@pytest.mark.slow
def test_submitit_local_jobs_keep_order_and_name_a_failed_unit(tmp_path):
    """Four submitit jobs, at most two in flight, results in order, job files in the given folder;
    a failing job is a UnitError naming the unit and the worker's exception."""
    options = ExecutorOptions(executor="submitit-local", jobs=2, threads=None, progress=False, folder=str(tmp_path / "sub"))
    out = run_units([Unit(square_after, (i, 0.3 if i == 0 else 0.0), name=f"sq{i}") for i in range(4)], options)
    assert [v for v, _ in out] == [0, 1, 4, 9]
    assert os.getpid() not in {pid for _, pid in out}
    assert len(list((tmp_path / "sub").glob("*_result.pkl"))) == 4
    with pytest.raises(UnitError, match=r"unit two failed.*ValueError: planted failure at 2") as e:
        run_units([Unit(fail_on, (i,), name=["zero", "one", "two"][i]) for i in range(3)], options)
    assert e.value.unit == "two"


def test_in_process_failure_propagates_unchanged_with_the_unit_named():
    with pytest.raises(ValueError, match="planted failure at 2") as e:
        run_units([Unit(fail_on, (i,), name=f"point {i}") for i in range(4)], ExecutorOptions(progress=False))
    assert any("point 2" in note for note in e.value.__notes__)


@pytest.mark.slow
def test_a_worker_failure_names_the_unit_and_bad_input_stays_a_config_error():
    options = ExecutorOptions(jobs=2, threads=None, progress=False)
    with pytest.raises(UnitError, match=r"unit u2 failed: ValueError: planted failure at 2"):
        run_units([Unit(fail_on, (i,), name=f"u{i}") for i in (0, 2)], options)
    with pytest.raises(ConfigError, match=r"^u3: planted bad input at 3$"):  # exit 2 at the command line
        run_units([Unit(fail_on, (i,), name=f"u{i}") for i in (0, 3)], options)


@pytest.mark.parametrize("kw, message", [
    ({"jobs": 0}, "--jobs must be >= 1, got 0"),
    ({"executor": "cluster"}, "--executor must be one of local, submitit-local, slurm, got 'cluster'"),
    ({"timeout_min": 0}, "--timeout-min must be >= 1, got 0"),
])
def test_bad_options_are_config_errors_before_any_unit_runs(kw, message):
    ran = []
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_units([lambda: ran.append(1)], ExecutorOptions(**kw))
    assert ran == []


def test_command_line_flags_give_the_options(monkeypatch):
    """The flags' parsing (the partition's check against a real cluster: tests/test_slurm_cluster.py)."""
    import argparse

    monkeypatch.setattr("workbench.drivers.executor.check_cluster", lambda options: None)

    p = argparse.ArgumentParser()
    add_executor_arguments(p)
    opts = options_from_args(p.parse_args(["--executor", "slurm", "--jobs", "8", "--slurm-partition", "gpu",
                                           "--timeout-min", "30"]))
    assert (opts.executor, opts.jobs, opts.slurm_partition, opts.timeout_min) == ("slurm", 8, "gpu", 30)
    assert opts.submitit_parameters() == {"timeout_min": 30, "slurm_partition": "gpu"}
    opts = options_from_args(p.parse_args(["--executor", "slurm", "--slurm-param", "cpus_per_task=4",
                                           "--slurm-param", "slurm_qos=short"]))
    assert opts.submitit_parameters() == {"timeout_min": 240, "cpus_per_task": 4, "slurm_qos": "short"}
    with pytest.raises(ConfigError, match=r"--slurm-param expects KEY=VALUE .*got 'cpus_per_task'"):
        options_from_args(p.parse_args(["--executor", "slurm", "--slurm-param", "cpus_per_task"]))
    assert options_from_args(p.parse_args([])).in_process


# ------------------------------------------------------------------------- concurrent writers
def write_runs(root: str, writer: int, n_runs: int) -> list[str]:
    """Runs of one writer process: each with rows naming the writer and the run (a value to check)."""
    from workbench.store.results import ResultsStore

    store = ResultsStore(root)
    ids = []
    for r in range(n_runs):
        with store.start_run("probe", {"writer": writer, "run": r}, name=f"w{writer}-r{r}") as run:
            run.add([{"probe": "writers", "task": f"w{writer}", "metric": "value", "model": f"m{writer}",
                      "seed": r, "layer": layer, "value": 1000.0 * writer + 10 * r + layer} for layer in range(5)])
            ids.append(run.run_id)
    return ids


def _catalog(root) -> list[tuple]:
    """The catalog table itself (not `runs()`, which repairs it from the folders first)."""
    con = sqlite3.connect(root / "catalog.sqlite")
    try:
        return sorted(con.execute("SELECT * FROM runs").fetchall())
    finally:
        con.close()


@pytest.mark.slow
def test_eight_concurrent_writers_lose_nothing_and_the_catalog_equals_a_reindex(tmp_path):
    from workbench.store.results import ResultsStore

    root = tmp_path / "runs"
    ResultsStore(root)  # the catalog exists before the writers race to register
    n_writers, n_runs = 8, 3
    ids = run_units([Unit(write_runs, (str(root), w, n_runs), name=f"writer {w}") for w in range(n_writers)],
                    ExecutorOptions(jobs=n_writers, threads=None, progress=False))
    assert len({i for batch in ids for i in batch}) == n_writers * n_runs
    written = _catalog(root)
    assert sorted(r[0] for r in written) == sorted(i for batch in ids for i in batch)  # every run registered
    store = ResultsStore(root)
    for w, batch in enumerate(ids):
        for r, run_id in enumerate(batch):
            rows = store.read(run_id)
            assert rows["value"].tolist() == [1000.0 * w + 10 * r + layer for layer in range(5)]
            assert store.manifest(run_id)["config"] == {"writer": w, "run": r}
    assert store.reindex() == n_writers * n_runs
    assert _catalog(root) == written
