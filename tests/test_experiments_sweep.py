"""Batch experiments: a sweep (2 checkpoints x 2 poolings x 2 seeds of the syntax probe) expands into
keyed runs, runs with --jobs 2, survives kill -9 and finishes on the rerun without redoing completed
runs, and goes through submitit's local executor by the same code path."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from app.experiments import load_experiment, plan_runs, run_experiment
from workbench.errors import ConfigError
from workbench.store.results import ResultsStore

REPO = Path(__file__).parent.parent
PROBE_SETTINGS = {"tasks": ["upos"], "max_train_sentences": 60, "max_eval_sentences": 30, "baselines": ["majority"],
                  "mdl_tasks": [], "scalar_mix_tasks": [], "n_boot": 20}


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, tokenizers):
    from tests.conftest import tiny_bert

    out = []
    for seed in (0, 1):
        folder = tmp_path_factory.mktemp("ckpts") / f"tiny-{seed}"
        tiny_bert(tokenizers["bert"], seed=seed, hidden=32, layers=2).save_pretrained(folder)
        tokenizers["bert"].save_pretrained(folder)
        (folder / "manifest.json").write_text(json.dumps({"family": "bert", "step": 5, "seed": seed}))
        out.append(str(folder))
    return out


def _sweep_file(tmp_path, checkpoints, name="sweep") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "checkpoints": checkpoints, "runs_per": "checkpoint",
                                    "probe": {"syntax": PROBE_SETTINGS},
                                    "sweep": {"pooling": ["first", "mean"], "syntax.seed": [0, 1]}}))
    return path


def _experiment_runs(store, name):
    runs = store.runs()
    return runs[runs["name"].str.startswith(f"{name}:")]


def test_sweep_plan_is_a_keyed_grid(tmp_path, two_checkpoints):
    plan = plan_runs(load_experiment(_sweep_file(tmp_path, two_checkpoints)))
    assert len(plan) == 8 and len({job["key"] for job in plan}) == 8
    assert {(job["checkpoints"][0], job["settings"]["pooling"], job["settings"]["seed"]) for job in plan} == {
        (c, p, s) for c in two_checkpoints for p in ("first", "mean") for s in (0, 1)}
    again = plan_runs(load_experiment(_sweep_file(tmp_path, two_checkpoints)))
    assert [j["key"] for j in again] == [j["key"] for j in plan]  # same config -> same keys


def test_probe_code_version_joins_the_run_key(tmp_path, two_checkpoints, monkeypatch):
    """Stored runs of an older probe version are not taken for the current one's: a version above 1
    changes every key; at version 1 the key is the hash of probe, checkpoints and settings alone."""
    import hashlib

    from probes import syntax

    path = _sweep_file(tmp_path, two_checkpoints)
    assert syntax.PROBE.version == 6  # 2: the structural probe's learning-rate decay; 3: its factor 0.1; 4: issue 42's fit; 5, 6: issue 49
    current = [job["key"] for job in plan_runs(load_experiment(path))]
    monkeypatch.setattr(syntax.PROBE, "version", 1)
    plan = plan_runs(load_experiment(path))
    assert set(current).isdisjoint(job["key"] for job in plan)
    job = plan[0]
    material = json.dumps(["syntax", job["checkpoints"], job["settings"]], sort_keys=True, default=str)
    assert job["key"] == hashlib.sha256(material.encode()).hexdigest()[:16]


def test_bad_sweeps_fail_before_any_work(tmp_path, two_checkpoints):
    path = tmp_path / "bad.yaml"
    for sweep, message in (({"pooling": ["first", "middle"]}, "pooling must be first, mean or last"),
                           ({"syntax.seeed": [0]}, r"unknown key\(s\) \['seeed'\]"),
                           ({"seed": []}, "non-empty lists")):
        path.write_text(yaml.safe_dump({"checkpoints": two_checkpoints, "probe": {"syntax": PROBE_SETTINGS},
                                        "sweep": sweep}))
        with pytest.raises(ConfigError, match=message):
            load_experiment(path)


@pytest.mark.slow
def test_sweep_with_two_jobs_survives_kill_9(tmp_path, two_checkpoints):
    path = _sweep_file(tmp_path, two_checkpoints, name="sweep-syntax-pooling")  # the shipped figure's prefix
    runs_root = tmp_path / "runs"
    env = dict(os.environ, BERTOLOGY_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "run", str(path), "--jobs", "2", "--runs-root",
                             str(runs_root)], cwd=REPO, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    store = ResultsStore(runs_root)
    # wait for the first finished run, then kill everything (no deadline: the wait ends when a run
    # finishes or the sweep exits; pytest-timeout stops a hang)
    while _experiment_runs(store, "sweep-syntax-pooling").empty:
        assert proc.poll() is None, "the sweep ended before it could be killed"
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _experiment_runs(store, "sweep-syntax-pooling")
    assert 1 <= len(before) < 8
    assert run_experiment(path, jobs=2, runs_root=str(runs_root)) == 0
    after = _experiment_runs(store, "sweep-syntax-pooling")
    assert len(after) == 8 and after["name"].is_unique
    assert set(before["run_id"]) <= set(after["run_id"])  # completed runs were kept, not redone
    rows = store.read(after["run_id"].iloc[-1])
    acc = rows[(rows["metric"] == "accuracy")]
    assert len(acc) == 3 and acc["value"].between(0, 1).all()
    # a third invocation has nothing left to do
    assert run_experiment(path, jobs=2, runs_root=str(runs_root)) == 0
    assert len(_experiment_runs(store, "sweep-syntax-pooling")) == 8
    # and the sweep's figure rebuilds: one curve per checkpoint and pooling, the two seeds averaged
    from app.figures import render

    fig = render("sweep_pooling", store, tmp_path / "figure", formats=("html",))
    data = pd.read_csv(fig.folder / "data.csv")
    assert set(data["model"]) == {f"tiny-{s} | pooling={p}" for s in (0, 1) for p in ("first", "mean")}
    assert len(fig.manifest["run_ids"]) == 8 and len(data[data["kind"] == "model"]) == 4 * 3


@pytest.mark.slow
def test_submitit_local_executor_same_code_path(tmp_path, two_checkpoints, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({"name": "viasubmitit", "checkpoints": two_checkpoints, "runs_per": "checkpoint",
                                    "probe": {"syntax": PROBE_SETTINGS}}))
    runs_root = tmp_path / "runs"
    assert run_experiment(path, executor="submitit-local", runs_root=str(runs_root)) == 0
    store = ResultsStore(runs_root)
    runs = _experiment_runs(store, "viasubmitit")
    assert len(runs) == 2
    models = {m for rid in runs["run_id"] for m in store.read(rid)["model"]}
    assert models == {"tiny-0", "tiny-1"}
    assert list((runs_root / "submitit" / "viasubmitit").glob("*_result.pkl"))  # submitit really ran them
