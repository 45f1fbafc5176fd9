"""The executor's Slurm path on a real single-node cluster (tests/slurm_cluster.py; `.ci/run`
installs Debian's slurm-wlm and munge): units run as sbatch jobs and come back in order, a failed
unit is named, a job cancelled with `scancel` is a failed unit rather than a wait without end (this
cluster has no accounting, as many do not: submitit alone never sees such a job end), a cancelled
sweep resumes with nothing lost, and a bad partition is one line and exit 2 before any work.
The drivers' sweeps on this cluster, row for row against their in-process runs, are in
tests/test_drivers.py and tests/test_distill.py beside their submitit-local twins."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest
import yaml

from tests.test_executor import fail_on, square_after
from workbench.drivers.executor import ExecutorOptions, Unit, UnitError, run_units
from workbench.errors import ConfigError

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def slurm_options(cluster, tmp_path, **kw) -> ExecutorOptions:
    return ExecutorOptions(executor="slurm", slurm_partition=cluster.partition, threads=None, progress=False,
                           folder=str(tmp_path / "jobs"), timeout_min=10, **kw)


def test_units_run_as_slurm_jobs_in_unit_order_with_the_parameters_given(slurm_cluster, tmp_path):
    """Four jobs, two in flight; a further parameter (`--slurm-param slurm_comment=...`) reaches sbatch
    under the name submitit gives it (the scheduler shows the comment on every job)."""
    comment = f"bertology-{tmp_path.name}"
    out = run_units([Unit(square_after, (i, 0.5 if i == 0 else 0.0), name=f"sq{i}") for i in range(4)],
                    slurm_options(slurm_cluster, tmp_path, jobs=2, slurm={"slurm_comment": comment,
                                                                          "cpus_per_task": 1}))
    assert [v for v, _ in out] == [0, 1, 4, 9]
    assert len(list((tmp_path / "jobs").glob("*_result.pkl"))) == 4  # sbatch ran each one
    jobs = [line.split() for line in slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%T %k").splitlines()]
    assert len([state for state, *rest in jobs if rest == [comment]]) == 4  # (some may still be finishing)


def test_a_failed_slurm_job_is_named_and_bad_input_keeps_its_class(slurm_cluster, tmp_path):
    with pytest.raises(UnitError, match=r"unit u2 failed: ValueError: planted failure at 2"):
        run_units([Unit(fail_on, (i,), name=f"u{i}") for i in (0, 2)], slurm_options(slurm_cluster, tmp_path))
    with pytest.raises(ConfigError, match=r"^u3: planted bad input at 3$"):
        run_units([Unit(fail_on, (3,), name="u3")], slurm_options(slurm_cluster, tmp_path))


def cancel_when_running(cluster, after: int = 0, timeout_s: float = 120.0) -> threading.Thread:
    """A thread that `scancel`s the first job seen RUNNING once `after` jobs have been seen before it."""
    def watch():
        seen: list[str] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in cluster.run("squeue", "-h", "-t", "all", "-o", "%i %T").splitlines():
                job_id, state = line.split()
                if job_id not in seen:
                    seen.append(job_id)
                if state == "RUNNING" and seen.index(job_id) >= after:
                    cluster.run("scancel", job_id)
                    return
            time.sleep(0.2)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.timeout(180)
def test_a_job_cancelled_with_scancel_is_a_failed_unit_not_an_endless_wait(slurm_cluster, tmp_path):
    before = len(slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%i").split())
    watcher = cancel_when_running(slurm_cluster, after=before)
    start = time.monotonic()
    with pytest.raises(UnitError, match=r"unit sleeper failed: Slurm job \d+ ended CANCELLED without a result"):
        run_units([Unit(square_after, (1, 120.0), name="sleeper")], slurm_options(slurm_cluster, tmp_path))
    watcher.join(5)
    assert time.monotonic() - start < 90  # the job would have slept 120 s


def test_a_partition_the_cluster_lacks_is_one_line_and_exit_2_before_any_work(slurm_cluster, tmp_path,
                                                                                tiny_checkpoint, capsys):
    from app.cli import main

    config = tmp_path / "ft.yaml"
    config.write_text(yaml.safe_dump({"checkpoint": str(tiny_checkpoint), "task": "sentence_polarity", "seeds": [0],
                                      "epochs": 1, "max_train_examples": 16, "max_eval_examples": 16}))
    out = tmp_path / "out"
    code = main(["finetune", str(config), "--output-dir", str(out), "--executor", "slurm",
                 "--slurm-partition", "nosuch"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "'nosuch' is not a partition of this cluster (sinfo lists: debug)" in err[0]
    assert not out.exists() and not (tmp_path / "jobs").exists()


@pytest.mark.timeout(600)
def test_a_sweep_cancelled_mid_way_reports_it_and_its_rerun_resumes_with_nothing_lost(
        slurm_cluster, tiny_checkpoint, tmp_path, monkeypatch, capsys, one_thread):
    """Three fine-tuning seeds, one job at a time: the second job is cancelled while it runs. The
    command fails naming that seed; the rerun keeps the finished seed (its result untouched) and
    writes the rows of an uncancelled in-process run, value for value."""
    from app.cli import main
    from tests.test_drivers import same_rows, tiny_finetune_sweep
    from workbench.store.results import ResultsStore

    path, seq = tiny_finetune_sweep(tiny_checkpoint, tmp_path, [0, 1, 2], "tiny-ft-cancel")
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    command = ["finetune", str(path), "--output-dir", str(tmp_path / "par"), "--executor", "slurm",
               "--slurm-partition", slurm_cluster.partition, "--jobs", "1"]
    before = len(slurm_cluster.run("squeue", "-h", "-t", "all", "-o", "%i").split())
    watcher = cancel_when_running(slurm_cluster, after=before + 1, timeout_s=300)
    assert main(command) == 1
    watcher.join(5)
    err = capsys.readouterr().err.strip().splitlines()
    assert "unit seed 1 failed: Slurm job" in err[-1] and "ended CANCELLED" in err[-1]
    assert "run the same command to resume" in err[-1]
    first = tmp_path / "par" / "seed-0" / "result.json"
    assert first.is_file() and not (tmp_path / "par" / "seed-1" / "result.json").exists()
    stamp = first.stat().st_mtime_ns
    assert main(command) == 0
    assert first.stat().st_mtime_ns == stamp  # the finished seed was not trained again
    store = ResultsStore(tmp_path / "runs")
    par = store.read(store.runs(name="tiny-ft-cancel")["run_id"].iloc[-1])
    same_rows(par, ResultsStore(tmp_path / "store-seq").read(seq.run_id), drop_extra=("checkpoint",))
