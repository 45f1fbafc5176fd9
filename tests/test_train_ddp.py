"""DDP on CPU: two gloo processes (torchrun) train the tiny GPT with the same GLOBAL batch as one
process and produce the same loss curve and weights, up to float32 summation order.

Tolerance: |Δloss| / loss < 1e-5 per step and |Δw| < 1e-4. With dropout off both runs compute the
same mathematical quantity (the global batch's mean loss: every packed block has the same number
of tokens, so averaging the two ranks' means equals the single process's mean); they differ only
in the order of float32 additions (per-rank means, the gloo all-reduce of gradients), i.e. a few
ulps (~1e-7 relative) per operation. Adam divides by sqrt(v), so for rarely seen embedding rows
(gradients near zero) such ulp differences move the update by a visible fraction; over 12 steps
at lr 3e-3 (updates up to ~0.04 per weight) that stays far below 1e-4. Measured: 1.2e-7
relative loss difference per step at most, 2.8e-5 largest weight difference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

STEPS = 12
RECIPE = f"""
corpus: {{sources: [inaugural, state_union], max_documents: 40, heldout_fraction: 0.2}}
tokenizer: {{vocab_size: 800}}
batch_size: 8
lr: 3.0e-3
warmup: 0.1
steps: {STEPS}
eval: {{batches: 0}}
progress: false
"""  # both checks: the same data and schedule, dropout off

CONFIG = """
name: ddp
family: gpt
preset: tiny
model: {resid_pdrop: 0.0, embd_pdrop: 0.0, attn_pdrop: 0.0}
max_len: 64
""" + RECIPE

BERT_NO_NSP = """
name: ddp_bert
family: bert
preset: tiny
model: {hidden_dropout_prob: 0.0, attention_probs_dropout_prob: 0.0}
objective: {nsp: false, masking: static}
max_len: 32
""" + RECIPE


def _one_and_two_ranks(tmp_path, monkeypatch, config: str):
    """(log, weights) of the config trained in one process and under torchrun with 2 gloo ranks."""
    cfg = tmp_path / "ddp.yaml"
    cfg.write_text(config)
    cache = tmp_path / "cache"
    monkeypatch.setenv("BERTOLOGY_CACHE", str(cache))

    # One process, global batch 8 (in-process; this also builds the shared corpus/tokenizer cache).
    from workbench.drivers.train import train_from_config

    torch.set_num_threads(1)
    (one,) = train_from_config(cfg, {"output_dir": str(tmp_path / "one")})

    # Two processes under torchrun, gloo backend, 4 sequences each.
    env = {**os.environ, "BERTOLOGY_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "workbench.drivers.train", str(cfg), "--output-dir", str(tmp_path / "two")]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    two = tmp_path / "two" / "seed-0" / f"step-{STEPS:07d}"
    manifest = json.loads((two / "manifest.json").read_text())
    assert manifest["world_size"] == 2

    log1 = [json.loads(x) for x in (one.parent / "log.jsonl").read_text().splitlines()][1:]
    log2 = [json.loads(x) for x in (two.parent / "log.jsonl").read_text().splitlines()][1:]
    assert [r["step"] for r in log2] == list(range(1, STEPS + 1))
    assert [r["tokens"] for r in log1] == [r["tokens"] for r in log2]  # global token counts
    w0 = load_file(one.parent / "step-0000000" / "model.safetensors")
    _assert_trained(log1, w0, load_file(one / "model.safetensors"))
    return (log1, load_file(one / "model.safetensors")), (log2, load_file(two / "model.safetensors"))


WEIGHT_TOLERANCE = 1e-4  # |Δw| allowed between the two runs (module docstring)


def _assert_trained(log: list[dict], w0: dict, w: dict) -> None:
    """The runs agreeing means something only if training moved the weights far beyond the
    tolerance they must agree within. Adam moves a weight whose gradient keeps its sign by about the
    learning rate per step (m / sqrt(v) ~ ±1: Kingma & Ba 2015, sec. 2.1), so the largest move over
    the run is about the sum of the logged learning rates; half of that is asserted, and at least
    100x the tolerance. The loss must go down too (by any amount)."""
    moved = max(float((w[k] - w0[k]).abs().max()) for k in w0)
    lr_sum = sum(r["lr"] for r in log)
    print(f"largest weight move {moved:.3g}, sum of learning rates {lr_sum:.3g}")
    assert moved > max(0.5 * lr_sum, 100 * WEIGHT_TOLERANCE), (moved, lr_sum)
    assert log[-1]["loss"] < log[0]["loss"]


@pytest.mark.slow
def test_two_gloo_ranks_match_one_process(tmp_path, monkeypatch):
    (log1, w1), (log2, w2) = _one_and_two_ranks(tmp_path, monkeypatch, CONFIG)
    rel = [abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(log1, log2)]
    print(f"max relative loss difference per step: {max(rel):.2e}")
    assert max(rel) < 1e-5, rel
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    print(f"max absolute weight difference: {diff:.2e}")
    assert diff < WEIGHT_TOLERANCE, diff


@pytest.mark.slow
def test_bert_without_nsp_under_ddp_matches_one_process(tmp_path, monkeypatch):
    """`objective.nsp: false` leaves BERT's pooler and NSP head without gradients; the loop freezes
    them, so DDP runs (it used to stop: parameters that did not receive gradients) and matches one
    process. Static masks (a function of each sequence's ids) make both runs mask alike."""
    (log1, w1), (log2, w2) = _one_and_two_ranks(tmp_path, monkeypatch, BERT_NO_NSP)
    assert all("nsp" not in r for r in log1 + log2)
    rel = [abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(log1, log2)]
    print(f"BERT without NSP: max relative loss difference per step: {max(rel):.2e}")
    assert max(rel) < 1e-5, rel
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    print(f"BERT without NSP: max absolute weight difference: {diff:.2e}")
    assert diff < WEIGHT_TOLERANCE, diff
    frozen = [k for k in w1 if k.startswith(("bert.pooler.", "cls.seq_relationship."))]
    assert len(frozen) == 4
    for k in frozen:  # never trained: identical in both runs
        assert torch.equal(w1[k], w2[k]), k
