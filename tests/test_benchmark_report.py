"""benchmarks/: the analytic FLOPs count behind MFU (hand computation) and the generated table of docs/benchmarks.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def test_flops_per_token_of_the_small_bert_by_hand():
    from bench_train import flops_per_token

    cfg = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=1024)
    f = flops_per_token(cfg, vocab=8000, seq_len=128, head_fraction=0.15)
    # per layer: QKV + output 4 d^2 MACs, FFN 2 d f MACs, QK^T and AV 2 s d MACs; 2 FLOPs per MAC, x3 fwd+bwd
    assert f["attention_qkv_out"] == 3 * 4 * 2 * 4 * 256**2
    assert f["ffn"] == 3 * 4 * 2 * 2 * 256 * 1024
    assert f["attention_scores_values"] == 3 * 4 * 2 * 2 * 128 * 256
    assert f["mlm_head"] == pytest.approx(3 * 0.15 * 2 * (256**2 + 256 * 8000))
    assert f["total"] == pytest.approx(22.36e6, rel=1e-3)  # the "~22 MFLOP per token"
    full = flops_per_token(cfg, vocab=8000, seq_len=128, head_fraction=1.0)
    assert full["total"] - f["total"] == pytest.approx(0.85 * f["mlm_head"] / 0.15)



def test_the_step_matmuls_are_the_products_the_flops_count_counts():
    """The shape ceiling times exactly the matmuls MFU counts: the same FLOPs per step."""
    import torch
    from bench_train import flops_per_token, step_matmul_ceiling, step_matmuls

    cfg = dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4, intermediate_size=64)
    for batch, seq, vocab in ((4, 16, 100), (3, 8, 57)):
        mms = step_matmuls(cfg, vocab, batch, seq, head_fraction=0.25)
        analytic = flops_per_token(cfg, vocab, seq, head_fraction=0.25)["total"] * batch * seq
        head_rows = round(0.25 * batch * seq)
        assert {m["name"]: m["shape"] for m in mms}["mlm head decoder"] == (head_rows, 32, vocab)
        timed = step_matmul_ceiling(mms, seconds_per_shape=0.01)
        # equal but for rounding the head's rows to whole positions
        assert timed["flops_per_step"] == pytest.approx(analytic, abs=3 * 2 * 32 * (32 + vocab))
        # the step's matmul time is each shape's time per call, counted as often as the step runs it
        assert timed["matmul_seconds_per_step"] == pytest.approx(sum(r["seconds_per_call"] * r["count"] for r in timed["shapes"]))
    assert step_matmul_ceiling(mms[:1], seconds_per_shape=0.01, dtype=torch.bfloat16)["dtype"] == "bfloat16"

def test_the_shape_ceiling_keeps_each_shapes_faster_measurement():
    """Before and after the run, shape by shape: a disturbed measurement of one shape does not drag the
    ceiling down, and the merged totals are the counted sums of the kept rows."""
    from bench_train import faster_ceiling

    def shape(name, seconds, count, flops_per_call):
        return {"name": name, "count": count, "flops_per_call": flops_per_call, "seconds_per_call": seconds,
                "flops_per_s": flops_per_call / seconds}

    def ceiling(rows):
        flops = sum(r["flops_per_call"] * r["count"] for r in rows)
        secs = sum(r["seconds_per_call"] * r["count"] for r in rows)
        return {"dtype": "float32", "threads": 2, "flops_per_step": flops, "matmul_seconds_per_step": secs,
                "flops_per_s": flops / secs, "shapes": rows}

    before = ceiling([shape("qkv", 0.002, 16, 1e9), shape("ffn", 0.010, 4, 4e9)])
    after = ceiling([shape("qkv", 0.004, 16, 1e9), shape("ffn", 0.008, 4, 4e9)])  # qkv disturbed after, ffn before
    merged = faster_ceiling(before, after)
    assert [r["seconds_per_call"] for r in merged["shapes"]] == [0.002, 0.008]
    assert merged["matmul_seconds_per_step"] == pytest.approx(16 * 0.002 + 4 * 0.008)
    assert merged["flops_per_step"] == pytest.approx(16 * 1e9 + 4 * 4e9)
    assert merged["flops_per_s"] == pytest.approx(32e9 / 0.064)
    assert merged["flops_per_s"] > max(before["flops_per_s"], after["flops_per_s"])
    assert merged["flops_per_s_before_after"] == [before["flops_per_s"], after["flops_per_s"]]



def test_paired_mfu_divides_each_window_by_the_peak_slices_beside_it():
    """A host that halves the VM's speed for a while halves a window's step rate and the slices around
    it alike: the paired ratio stays where it was, where one whole-run peak would read half or double."""
    from bench_train import paired_utilisation

    peaks = [300e9, 300e9, 150e9, 150e9, 300e9]  # slice, window, slice, ... (the host slows in the middle)
    rates = [150e9, 112.5e9, 75e9, 112.5e9]
    assert paired_utilisation(rates, peaks) == pytest.approx([0.5, 0.5, 0.5, 0.5])
    assert [r / max(peaks) for r in rates] == pytest.approx([0.5, 0.375, 0.25, 0.375])  # what one peak would say
    with pytest.raises(ValueError, match="one peak slice more than windows"):
        paired_utilisation(rates, peaks[:-1])



def test_paired_step_mfu_steps_both_models_window_by_window(tmp_path, monkeypatch):
    """The paired measurement on a tiny BERT: one MFU per window, each its window's FLOP rate over the
    mean of the slices beside it, and the speed ratio the two models' tokens/s in the same window."""
    import torch
    from bench_train import _hf_model, _packed_batches, flops_per_token, step_setup, paired_step_mfu, paired_utilisation

    from tests.training_helpers import tiny_config
    from workbench.families import get_family
    from workbench.drivers.train import prepare_data

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    cfg = tiny_config("bert", 4, tmp_path / "out", corpus={"sources": ["inaugural"], "max_documents": 12,
                                                            "heldout_fraction": 0.2, "seed": 0},
                      tokenizer={"vocab_size": 400}, max_len=32, batch_size=4,
                      **{"eval.batches": 0, "checkpoints.log_spaced": False})
    data = prepare_data(cfg, get_family("bert"))
    family, batches = step_setup(cfg, data, 1 + 3 * 2)
    model_cfg, vocab = get_family("bert").model_config(cfg.preset, cfg.model), len(data.tokenizer)
    hf_model, collator = _hf_model(cfg, data.tokenizer, "bert")
    hf_batches = _packed_batches(cfg, data, collator, 7)
    f_ours = flops_per_token(model_cfg, vocab, 32, 0.15)["total"]
    f_hf = flops_per_token(model_cfg, vocab, 32, 1.0)["total"]
    before = [p.detach().clone() for p in hf_model.parameters()]
    r = paired_step_mfu(cfg, data, family, batches, f_ours, 2, slice_seconds=0.05, n=256,
                        hf_packed=(hf_model, hf_batches, f_hf))
    assert len(r["mfu_windows"]) == 3 and len(r["peak_slices_flops_per_s"]) == 4
    assert r["mfu_windows"] == pytest.approx(paired_utilisation(r["step_flops_per_s_windows"], r["peak_slices_flops_per_s"]))
    assert r["mfu_median"] == pytest.approx(sorted(r["mfu_windows"])[1]) and 0 < r["mfu_median"]
    expected = [(o / f_ours) / (h / f_hf) for o, h in zip(r["step_flops_per_s_windows"], r["hf_packed_step_flops_per_s_windows"])]
    assert r["ratio_vs_hf_packed_step_windows"] == pytest.approx(expected)
    assert any(not torch.equal(a, p) for a, p in zip(before, hf_model.parameters()))  # the baseline really trained


def _record(path: Path, finished: str, ratio: float) -> None:
    path.write_text(json.dumps({
        "benchmark": "bench_probe_fit", "finished": finished, "threads": 1, "seeds": 5, "tasks": ["upos", "control"],
        "layers": 5, "train_words": 40005, "ours_one_seed_seconds": 3.0, "ours_one_seed_cpu_seconds": 2.5,
        "speedup_same_heads": ratio, "speedup_same_heads_cpu": ratio / 2, "ours_seconds": 20.0,
        "sklearn_seconds": 3.0 * ratio, "speedup": 3.0 * ratio / 20.0, "max_gap_pt": 0.24,
        "machine": {"model": "Test CPU", "cpus": 2, "flags": ["avx512f"], "loadavg_at_start": [1.5, 1, 1],
                    "loadavg_at_end": [2.25, 1, 1]},
    }))  # fmt: skip


def test_report_table_comes_from_the_newest_record_and_fills_the_readme(tmp_path):
    import report

    _record(tmp_path / "a.json", "2026-11-23T10:00:00+0000", 12.0)
    _record(tmp_path / "b.json", "2026-11-23T11:00:00+0000", 25.6)
    (tmp_path / "junk.json").write_text("{not json")
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\nbefore\n{report.START}\nold table\n{report.END}\nafter\n")
    text = report.main(["--results", str(tmp_path), "--readme", str(readme)])
    assert "25.6x" in text and "12.0x" not in text and "b.json" in text
    assert "| 1.5 -> 2.2 |" in text or "| 1.5 -> 2.3 |" in text  # load average at start and end
    assert "Test CPU, 2 cores (avx512f)" in text
    doc = readme.read_text()
    assert doc.startswith("# x\n\nbefore\n") and doc.endswith("after\n") and "old table" not in doc
    assert text in doc
    every = report.main(["--results", str(tmp_path), "--all"])
    assert "12.0x" in every and "25.6x" in every


def test_a_gpu_record_is_its_own_row_and_never_replaces_the_cpu_figure(tmp_path):
    """A newer GPU extraction record must not take the place of the CPU one (the table of docs/benchmarks.md is per
    device): both rows stay, the GPU one labelled with its device and machine."""
    import report

    speed = lambda ours: {"tokens_per_s": {c: {"ours": ours, "bare": 1000.0, "naive": 10.0} for c in ("wall", "cpu")},  # noqa: E731
                          "overhead_vs_bare": {"wall": ours / 1000.0 - 1, "cpu": ours / 1000.0 - 1},
                          "speedup_vs_naive": {"wall": ours / 10.0, "cpu": ours / 10.0}}
    machine = {"model": "Test CPU", "cpus": 2, "flags": [], "loadavg_at_start": [1, 1, 1], "loadavg_at_end": [1, 1, 1]}
    (tmp_path / "cpu.json").write_text(json.dumps({"benchmark": "bench_extraction", "finished": "2026-11-25T10:00:00+0000",
                                                   "device": "cpu", "speed": speed(960.0), "machine": machine}))
    (tmp_path / "gpu.json").write_text(json.dumps({"benchmark": "bench_extraction", "finished": "2026-11-26T10:00:00+0000",
                                                   "device": "cuda", "speed": speed(500.0), "machine": machine}))
    text = report.main(["--results", str(tmp_path)])
    assert "-4.0%" in text and "-50.0%" in text  # both overheads: the CPU row was not replaced
    assert "[cuda] extraction overhead" in text and "GPU cuda (host CPU Test CPU" in text
    paired = {"benchmark": "bench_extraction", "speed": {**speed(1202.0), "overhead_vs_bare_paired_median": {"wall": 0.076, "cpu": 0.127}}}
    assert report._rows(paired)[1][3] == "+20.2% best vs best, +12.7% median of repetitions"


def test_training_rows_show_the_shape_ceiling_and_bf16_when_the_record_has_them():
    import report

    base = {"benchmark": "bench_train", "preset": "small", "batch_size": 32, "max_len": 128,
            "ours_tokens_per_s": 5000.0, "hf_padded_tokens_per_s": 1000.0, "hf_packed_tokens_per_s": 3000.0,
            "ratio_vs_padded": 5.0, "ratio_vs_packed": 1.667, "matmul_peak_flops_per_s": 300e9,
            "flops_per_token": {"ours": {"total": 22.3e6}}, "mfu_ours": 0.372, "mfu_hf_packed": 0.223}
    assert len(report._rows(base)) == 3  # an older record: no ceiling, no bf16 rows
    rows = report._rows({**base, "step_matmul_ceiling": {"flops_per_s": 240e9}, "step_matmul_ceiling_vs_peak": 0.8,
                         "mfu_ours_vs_step_matmul_ceiling": 0.468, "ours_bf16_tokens_per_s": 8000.0,
                         "ratio_bf16_vs_fp32": 1.6, "bf16_matmul_peak_flops_per_s": 750e9, "mfu_ours_bf16": 0.238,
                         "mfu_ours_bf16_vs_fp32_peak": 0.595})
    bf16_speed, bf16_mfu, ceiling = rows[3:]
    assert "(240 GFLOP/s, 80% of the 2048^2 peak)" in ceiling[0] and ceiling[1] == "47%"
    assert bf16_speed[1:4] == ("8,000", "5,000", "1.60x")
    assert "bf16 matmul peak 750 GFLOP/s; of the fp32 peak: 60%" in bf16_mfu[0] and bf16_mfu[1] == "24%"
    paired = report._rows({**base, "paired_step_mfu": {"mfu_median": 0.523, "mfu_quartiles": [0.51, 0.547],
                                                       "mfu_windows": [0.5] * 8}})[3]
    assert "each of 8 windows (median; quartiles 51% - 55%)" in paired[0] and paired[1] == "52%" and paired[4] == ">= 60%"
    with_hf = report._rows({**base, "paired_step_mfu": {"mfu_median": 0.523, "mfu_quartiles": [0.51, 0.547],
                                                        "mfu_windows": [0.5] * 8, "ratio_vs_hf_packed_step_median": 1.734,
                                                        "ratio_vs_hf_packed_step_quartiles": [1.6, 1.81]}})
    assert len(with_hf) == 5 and "quartiles 1.60x - 1.81x" in with_hf[4][0] and with_hf[4][3:] == ("1.73x", ">= 1.5x")
