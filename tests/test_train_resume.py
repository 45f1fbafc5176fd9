"""Exact resume: a run killed with SIGKILL mid-way and started again with the same config ends with
weights equal BIT FOR BIT to an uninterrupted run's (CPU, dropout on, so the restored RNG matters),
also when it is killed during a sequence-length warm-up (the length is a function of the step)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from workbench.drivers.train import checkpoint_steps, list_checkpoints

STEPS = 24
CONFIG = f"""
name: resume
family: gpt
preset: tiny
model: {{n_layer: 1, n_embd: 32, n_head: 2}}   # dropout stays at GPT-2's 0.1
corpus: {{sources: [inaugural], max_documents: 30, heldout_fraction: 0.2}}
tokenizer: {{vocab_size: 500}}
max_len: 32
batch_size: 4
grad_accum: 2
lr: 3.0e-3
warmup: 0.2
steps: {STEPS}
checkpoints: {{log_spaced: true, every: 6}}
eval: {{batches: 1}}
progress: false
"""


def _train(cfg: Path, out: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "workbench.drivers.train", str(cfg), "--output-dir", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


@pytest.fixture()
def setup(tmp_path):
    cfg = tmp_path / "resume.yaml"
    cfg.write_text(CONFIG)
    env = {**os.environ, "BERTOLOGY_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return cfg, env, tmp_path


# 8 + 24 t / 16 floored to multiples of 8: lengths 8 (t < 6), 16 (t < 11), 24 (t < 16), then 32;
# the kill at the step-8 checkpoint falls inside the warm-up.
WARMUP = "seq_len_warmup: {start: 8, steps: 16}\n"


@pytest.mark.slow
@pytest.mark.parametrize("warmup", ["", WARMUP], ids=["plain", "seq_len_warmup"])
def test_sigkill_then_resume_is_bit_identical(setup, warmup):
    cfg, env, tmp = setup
    cfg.write_text(CONFIG + warmup)
    # Reference: uninterrupted (also builds the shared corpus/tokenizer cache).
    ref = _train(cfg, tmp / "ref", env)
    assert ref.wait(timeout=300) == 0, ref.stdout.read()
    ref_final = tmp / "ref" / "seed-0" / f"step-{STEPS:07d}"

    # Interrupted: SIGKILL as soon as the step-8 checkpoint exists (mid-run), then start again.
    run = tmp / "run" / "seed-0"
    proc = _train(cfg, tmp / "run", env)
    while not (run / "step-0000008" / "manifest.json").exists():  # no deadline: ends when the run does
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    killed_at = [s for s, _ in list_checkpoints(run)]
    assert killed_at[-1] < STEPS, "killed too late: the run had already finished"
    resumed_from = max(s for s, p in list_checkpoints(run) if (p / "trainer_state" / "state.pt").exists())
    assert resumed_from >= 8

    again = _train(cfg, tmp / "run", env)
    assert again.wait(timeout=300) == 0, again.stdout.read()

    a = load_file(ref_final / "model.safetensors")
    b = load_file(run / f"step-{STEPS:07d}" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].equal(b[k]), f"{k} differs after resume from step {resumed_from}"
    # Same optimizer state too, and the same per-step losses (logged as exact floats).
    ref_log = [json.loads(x) for x in (tmp / "ref" / "seed-0" / "log.jsonl").read_text().splitlines()]
    run_log = [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in run_log] == list(range(STEPS + 1))
    strip = lambda log: [{k: v for k, v in r.items() if k != "elapsed"} for r in log]  # noqa: E731
    assert strip(run_log) == strip(ref_log)
    if warmup:  # the resumed part trained the schedule's lengths: 4 x length tokens per micro-step
        assert [r["seq_len"] for r in run_log[1:]] == [8] * 6 + [16] * 5 + [24] * 5 + [32] * 8
        assert [b["tokens"] - a["tokens"] for a, b in zip(run_log, run_log[1:])] == [2 * 4 * r["seq_len"] for r in run_log[1:]]
    assert [s for s, _ in list_checkpoints(run)] == checkpoint_steps(STEPS, every=6)
    # Only the latest checkpoint keeps the trainer state.
    assert [s for s, p in list_checkpoints(run) if (p / "trainer_state").exists()] == [STEPS]


def test_changed_config_refuses_to_resume(setup, monkeypatch):
    from workbench.errors import ConfigError
    from workbench.drivers.train import train_from_config

    cfg, env, tmp = setup
    monkeypatch.setenv("BERTOLOGY_CACHE", env["BERTOLOGY_CACHE"])
    out = tmp / "out"
    train_from_config(cfg, {"steps": 2, "output_dir": str(out), "eval.batches": 0})
    with pytest.raises(ConfigError, match=r"resume\.yaml: output folder .* holds a run of a different config"):
        train_from_config(cfg, {"steps": 2, "lr": 1e-3, "output_dir": str(out), "eval.batches": 0})


def test_copied_runs_folder_resolves_its_corpus_manifest(setup, monkeypatch):
    """Checkpoint manifests name the corpus manifest relative to the runs root (plus its sha256), so a
    runs folder copied elsewhere (here: the original removed) still finds its membership ground truth."""
    import shutil

    from workbench.data.corpus import resolve_corpus_manifest
    from workbench.errors import CheckpointError
    from workbench.drivers.train import train_from_config

    cfg, _, tmp = setup
    runs = tmp / "machine-a" / "runs"
    monkeypatch.delenv("BERTOLOGY_CACHE", raising=False)  # corpus cache under the runs root
    monkeypatch.setenv("BERTOLOGY_RUNS", str(runs))
    (final,) = train_from_config(cfg, {"steps": 2, "eval.batches": 0})
    record = json.loads((final / "manifest.json").read_text())["corpus"]
    assert record["manifest"].startswith("cache/corpus/") and record["manifest"].endswith("/manifest.json")
    assert str(tmp) not in json.dumps(record)  # nothing machine-specific
    assert resolve_corpus_manifest(final, record) == runs / record["manifest"]

    moved = tmp / "machine-b" / "elsewhere" / "runs"
    shutil.copytree(runs, moved)
    shutil.rmtree(runs)
    copied = moved / final.relative_to(runs)
    # found above the checkpoint without any configuration, and under a runs root that points there
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp / "unrelated"))
    assert resolve_corpus_manifest(copied, record) == moved / record["manifest"]
    assert resolve_corpus_manifest(copied, record, runs_root=moved) == moved / record["manifest"]
    corpus = json.loads((moved / record["manifest"]).read_text())
    assert corpus["doc_ids"]["train"]  # the membership ground truth itself
    # a changed corpus manifest, or none at all, is a clear error
    (moved / record["manifest"]).write_text(json.dumps({**corpus, "seed": 99}))
    with pytest.raises(CheckpointError, match="does not match the recorded sha256"):
        resolve_corpus_manifest(copied, record)
    shutil.rmtree(moved / "cache")
    with pytest.raises(CheckpointError, match="not found"):
        resolve_corpus_manifest(copied, record)
