"""benchmarks/bench_real_probe.py (issue 42, item 1) on a tiny random BERT: the record's fields and values.

No real model here: the benchmark's numbers on MPNet / SmolLM2 are in docs/benchmarks.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def _check_phase_times(t: dict) -> None:
    assert set(t) == {"wall_s", "cpu_s"}
    assert t["wall_s"] > 0 and t["cpu_s"] >= 0


@pytest.fixture(scope="module")
def record(tiny_checkpoint, tmp_path_factory):
    from bench_real_probe import measure

    return measure(str(tiny_checkpoint), sentences=24, eval_sentences=12, trees=20,
                   work_dir=tmp_path_factory.mktemp("bench-real-probe"), reference=True)


def test_measure_records_times_ratios_memory_and_accuracies(record):
    rec = record
    n_states = rec["num_hidden_states"]
    assert n_states == 3 and rec["hidden_size"] == 32  # 2 blocks + embeddings
    assert rec["layers"] == [0, 1, 2]
    assert rec["sentences"] == {"upos_train": 24, "upos_fit": 22, "upos_stop": 2, "eval": 12, "structural_pool": 24}
    ext = rec["extraction"]
    for key in ("train", "eval", "structural_pool"):
        _check_phase_times(ext[key])
    # the UPOS features are the train sample + eval; the structural ones its pool + the same eval
    for k in ("wall_s", "cpu_s"):
        assert ext["upos"][k] == pytest.approx(ext["train"][k] + ext["eval"][k])
        assert ext["structural"][k] == pytest.approx(ext["structural_pool"][k] + ext["eval"][k])

    upos = rec["upos"]
    _check_phase_times(upos["fit"])
    assert upos["ratio_wall"] == pytest.approx(upos["fit"]["wall_s"] / ext["upos"]["wall_s"])
    assert upos["ratio_cpu"] == pytest.approx(upos["fit"]["cpu_s"] / ext["upos"]["cpu_s"])
    assert len(upos["accuracy"]) == n_states and all(0 <= a <= 1 for a in upos["accuracy"])
    assert max(upos["accuracy"]) > 0.2  # UPOS from word vectors beats chance (17 tags) even in a random model
    assert upos["feature_bytes"] == n_states * upos["train_words"] * 32 * 4
    assert upos["train_words"] == ext["words"]["train"] - upos["stop_words"]
    # the workbench default: "auto" resolves to full-batch L-BFGS below 20k training words, early stopping on
    assert upos["config"]["kind"] == "linear" and upos["config"]["optimizer"] == "lbfgs"
    assert upos["config"]["early_stopping"] is True and upos["steps"] >= 1
    mem = upos["memory"]
    assert mem["rss_peak"] >= mem["rss_before"] > 0 and mem["samples"] >= 1
    assert upos["anon_increase_over_features"] == pytest.approx(
        (mem["anon_peak"] - mem["anon_before"]) / upos["feature_bytes"])
    ref = upos["reference"]  # L-BFGS to convergence on the same split: the gap per layer, in points
    assert len(ref["accuracy"]) == n_states and ref["steps"] >= 1
    gap = (np.asarray(ref["accuracy"]) - np.asarray(upos["accuracy"])) * 100
    np.testing.assert_allclose(ref["below_reference_points"], gap, atol=1e-9)
    assert ref["worst_below_points"] == pytest.approx(gap.max())

    sd = rec["structural_distance"]
    _check_phase_times(sd["fit"])
    assert sd["trees"] == 20 and sd["stop_trees"] == 2  # pool of ceil(20 / 0.9) + 1 = 24: 22 fit, capped to 20
    assert sd["ratio_wall"] == pytest.approx(sd["fit"]["wall_s"] / ext["structural"]["wall_s"])
    assert sd["ratio_cpu"] == pytest.approx(sd["fit"]["cpu_s"] / ext["structural"]["cpu_s"])
    assert len(sd["uuas"]) == n_states and all(0 <= u <= 1 for u in sd["uuas"])
    assert 0 < sd["right_branching_uuas"] <= 1
    assert sd["feature_bytes"] == n_states * sd["train_words"] * 32 * 4
    json.dumps(rec)  # the record is plain JSON


def test_report_rows_show_the_ratios_against_the_targets(record):
    import report

    rows = report._rows({"benchmark": "bench_real_probe", "models": {"some/tiny-bert": record}})
    assert [r[4] for r in rows] == ["<= 1x", "<= 2x", "<= 1.5x"]
    assert all(r[0].startswith("real probe tiny-bert: ") for r in rows)
    assert rows[0][3] == f"{record['upos']['ratio_wall']:.2f}x"
    assert rows[1][3] == f"{record['structural_distance']['ratio_wall']:.2f}x"
    mem = record["upos"]["memory"]
    assert rows[2][3] == f"{(mem['rss_peak'] - mem['rss_before']) / record['upos']['feature_bytes']:.2f}x"
    # each row kind keeps its own key in the table (the text before the first comma)
    assert len({r[0].split(",")[0].split("(")[0] for r in rows}) == 3


def test_cli_layer_subset_writes_a_record(tiny_checkpoint, tmp_path):
    import bench_real_probe

    out = tmp_path / "rec.json"
    bench_real_probe.main(["--models", str(tiny_checkpoint), "--sentences", "12", "--eval-sentences", "6",
                           "--trees", "8", "--threads", "1", "--layers", "2", "--work-dir", str(tmp_path),
                           "--json", str(out)])
    rec = json.loads(out.read_text())
    assert rec["benchmark"] == "bench_real_probe" and rec["threads"] == 1 and "machine" in rec
    m = rec["models"][str(tiny_checkpoint)]
    assert m["layers"] == [2]
    assert len(m["upos"]["accuracy"]) == 1 and len(m["structural_distance"]["uuas"]) == 1
    assert m["upos"]["feature_bytes"] == m["upos"]["train_words"] * 32 * 4
    assert np.isfinite(m["structural_distance"]["ratio_wall"])
    assert not any(p.name.startswith("bench_real_probe-") for p in tmp_path.iterdir())  # temporary cache removed


@pytest.mark.parametrize("argv, message", [
    (["--sentences", "0"], "--sentences must be >= 1"),
    (["--trees", "-3"], "--trees must be >= 1"),
    (["--layers", "a,b"], "--layers must be comma-separated"),
    (["--layers", "-1"], "--layers must be comma-separated"),
])  # fmt: skip
def test_bad_options_exit_2_before_any_work(argv, message, capsys):
    import bench_real_probe

    with pytest.raises(SystemExit) as e:
        bench_real_probe.main(["--models", "no/such-model", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_layer_out_of_range_exits_2_before_extraction(tiny_checkpoint, tmp_path, capsys):
    import bench_real_probe

    with pytest.raises(SystemExit) as e:
        bench_real_probe.main(["--models", str(tiny_checkpoint), "--layers", "0,3", "--sentences", "4",
                               "--eval-sentences", "2", "--trees", "2", "--work-dir", str(tmp_path)])
    assert e.value.code == 2
    assert "--layers [3] outside 0..2" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing extracted (the temporary cache is gone)
