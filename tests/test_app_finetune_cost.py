"""The fine-tuning and cost pages (app/page_modules/finetune.py, app/page_modules/cost.py): their tables and plots
show exactly the stored rows (seed means, ranges, t-intervals, lineage totals, score vs FLOPs), and
both pages render headless (AppTest) on a store holding such runs."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from app.page_modules.cost import best_scores, checkpoints_under, cost_table, cost_wide, score_vs_flops
from app.page_modules.finetune import epoch_curve, finetune_curves, finetune_test, split_summary, score_table
from workbench.drivers.finetune import t_interval
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore

APP = str(REPO_ROOT / "app" / "streamlit_app.py")
DEV = {0: [0.60, 0.70, 0.72], 1: [0.58, 0.74, 0.71], 2: [0.62, 0.69, 0.75]}   # seed -> dev score per epoch
TEST = {0: 0.70, 1: 0.73, 2: 0.69}


def planted_finetune_rows(metric="span_f1", task="conll2002_es"):
    rows = []
    common = {"model": "m", "family": "bert", "probe": "finetune", "task": task}
    for seed, curve in DEV.items():
        for e, v in enumerate(curve, 1):
            rows.append({**common, "seed": seed, "step": 10 * e, "split": "dev", "metric": f"{metric}_epoch",
                         "value": v, "n": 50, "extra": {"epoch": e}})
        rows.append({**common, "seed": seed, "step": 30, "split": "test", "metric": metric, "value": TEST[seed], "n": 40,
                     "extra": {}})
        rows.append({**common, "seed": seed, "step": 30, "split": "dev", "metric": metric, "value": max(DEV[seed]),
                     "n": 50, "extra": {}})
    for split, values in (("test", list(TEST.values())), ("dev", [max(v) for v in DEV.values()])):
        mean, lo, hi = t_interval(values)
        rows.append({**common, "split": split, "metric": metric, "value": mean, "n": 3, "ci_low": lo, "ci_high": hi,
                     "extra": {"over": "seeds"}})
    for split in ("dev", "test"):
        rows.append({"model": "majority", "family": "baseline", "probe": "finetune", "task": task, "split": split,
                     "metric": metric, "value": 0.0, "n": 40, "extra": {}})
        rows.append({"model": "word_majority", "family": "baseline", "probe": "finetune", "task": task, "split": split,
                     "metric": metric, "value": 0.35, "n": 40, "extra": {}})
    return rows


def as_rows(records):
    df = pd.DataFrame(records)
    df["extra"] = [json.dumps(e) for e in df["extra"]]
    for c in ("seed", "layer", "ci_low", "ci_high", "step"):
        if c not in df:
            df[c] = np.nan
    return df


def test_epoch_curve_is_the_seed_mean_and_range():
    curve = epoch_curve(as_rows(planted_finetune_rows()), "span_f1")
    arr = np.array(list(DEV.values()))
    assert curve["epoch"].tolist() == [1, 2, 3]
    assert np.allclose(curve["mean"], arr.mean(0))
    assert np.allclose(curve["low"], arr.min(0)) and np.allclose(curve["high"], arr.max(0))
    assert np.allclose(curve["sd"], arr.std(0, ddof=1)) and curve["seeds"].tolist() == [3, 3, 3]


def test_the_score_table_has_the_t_interval_and_the_baselines():
    table = score_table(as_rows(planted_finetune_rows()), "span_f1").set_index("model")
    x = np.array(list(TEST.values()))
    half = stats.t.ppf(0.975, 2) * x.std(ddof=1) / np.sqrt(3)
    assert table.loc["m", "score"] == pytest.approx(x.mean())
    assert table.loc["m", "ci_low"] == pytest.approx(x.mean() - half)
    assert table.loc["m", "ci_high"] == pytest.approx(x.mean() + half)
    assert table.loc["m", "seeds"] == 3 and table.loc["m", "per_seed"] == "0.7000, 0.7300, 0.6900"
    assert table.loc["word_majority", "kind"] == "baseline" and table.loc["word_majority", "score"] == 0.35


def test_finetune_plots_draw_the_table_values():
    rows = as_rows(planted_finetune_rows())
    curves = finetune_curves(rows, "t", {})
    model = curves.data[curves.data["kind"] == "model"]
    assert np.allclose(model["mean"], np.array(list(DEV.values())).mean(0))
    assert set(curves.data.loc[curves.data["kind"] == "baseline", "model"]) == {"majority", "word_majority"}
    test = finetune_test(rows, "t", {})
    assert test.data.set_index("model").loc["m", "score"] == pytest.approx(np.mean(list(TEST.values())))
    acc = finetune_test(as_rows(planted_finetune_rows("accuracy", "sentence_polarity")), "t", {})
    assert acc.figure.layout.yaxis.title.text == "test accuracy"


def test_split_summary_reads_the_manifest_note():
    manifest = {"notes": {"splits": {"split_seed": 0, "ids": {"train": ["a", "b", "c"], "dev": ["d"], "test": []}}}}
    s = split_summary(manifest).set_index("split")
    assert s.loc["train", "examples"] == 3 and s.loc["train", "first ids"] == "a, b, c"
    assert s.loc["test", "examples"] == 0
    assert split_summary(None).empty


def planted_cost_rows():
    """Two checkpoints of one run (step 0 at 0 FLOPs, step 10) and a fine-tuned child of step 10."""
    out = []

    def add(model, own, total, lineage, step):
        extra = {"hardware": "cpu: test", "energy_source": "estimated: test", "lineage": lineage, "known": True}
        for split, part in (("own", own), ("total", total)):
            for k, v in zip(("flops", "device_hours", "energy_kwh", "co2e_kg"), part):
                out.append({"model": model, "family": "bert", "probe": "cost", "task": "training_cost", "split": split,
                            "metric": k, "value": v, "step": step, "extra": extra})

    add("r/seed-0/step-0000000", (0, 0, 0, 0), (0, 0, 0, 0), [], 0)
    add("r/seed-0/step-0000010", (1e9, 0.01, 0.002, 0.001), (1e9, 0.01, 0.002, 0.001), [], 10)
    add("ft/seed-0/best", (2e8, 0.005, 0.001, 0.0004), (1.2e9, 0.015, 0.003, 0.0014), ["r/seed-0/step-0000010"], 5)
    return out


def test_cost_table_reproduces_the_stored_totals():
    rows = as_rows(planted_cost_rows()).assign(run_id="r1")
    wide = cost_wide(rows).set_index("model")
    assert wide.loc["ft/seed-0/best", "total_flops"] == pytest.approx(1.2e9)
    assert wide.loc["ft/seed-0/best", "own_flops"] == pytest.approx(2e8)
    assert wide.loc["ft/seed-0/best", "lineage"] == "r/seed-0/step-0000010"
    drawn = cost_table(rows, "t", {"part": "total"})
    cells = drawn.figure.data[0].cells.values
    assert list(cells[0]) == ["r/seed-0/step-0000000", "r/seed-0/step-0000010", "ft/seed-0/best"]
    assert list(cells[2]) == ["0", "1e+09", "1.2e+09"]


def test_score_vs_flops_joins_by_checkpoint_and_takes_the_best_layer():
    probe = []
    for model, accs in (("r/seed-0/step-0000000", [0.3, 0.35]), ("r/seed-0/step-0000010", [0.6, 0.8])):
        for layer, a in enumerate(accs):
            probe.append({"model": model, "family": "bert", "probe": "syntax", "task": "upos", "split": "test",
                          "metric": "accuracy", "value": a, "layer": layer, "extra": {}})
    probe.append({"model": "majority", "family": "baseline", "probe": "syntax", "task": "upos", "split": "test",
                  "metric": "accuracy", "value": 0.9, "extra": {"baseline": "majority"}})
    rows = as_rows(planted_cost_rows() + probe).assign(run_id="r1")
    best = best_scores(rows, "upos", "accuracy").set_index("model")
    assert best.loc["r/seed-0/step-0000010", "score"] == 0.8 and best.loc["r/seed-0/step-0000010", "layer"] == 1
    drawn = score_vs_flops(rows, "t", {"task": "upos", "metric": "accuracy"})
    d = drawn.data.set_index("model")
    assert d.loc["r/seed-0/step-0000010", "total_flops"] == 1e9 and d.loc["r/seed-0/step-0000000", "score"] == 0.35
    assert "majority" not in d.index
    x = list(drawn.figure.data[0].x)
    assert x == [1e8, 1e9]  # step 0 (0 FLOPs) drawn a decade left of the smallest cost


def test_score_vs_flops_draws_the_measure_asked_for():
    """Kaplan et al.'s 6ND (issue 49) is drawn when asked, and the axis says which measure it is."""
    from workbench.errors import ConfigError

    kaplan = []
    for r in planted_cost_rows():
        if r["metric"] == "flops":  # a 6ND figure half the full count, planted
            kaplan.append({**r, "metric": "kaplan_flops", "value": r["value"] / 2})
    probe = [{"model": "r/seed-0/step-0000010", "family": "bert", "probe": "syntax", "task": "upos", "split": "test",
              "metric": "accuracy", "value": 0.8, "layer": 1, "extra": {}}]
    rows = as_rows(planted_cost_rows() + kaplan + probe).assign(run_id="r1")
    full = score_vs_flops(rows, "t", {"task": "upos", "metric": "accuracy"})
    six = score_vs_flops(rows, "t", {"task": "upos", "metric": "accuracy", "flops": "kaplan_flops"})
    assert full.data.set_index("model").loc["r/seed-0/step-0000010", "total_flops"] == 1e9
    assert six.data.set_index("model").loc["r/seed-0/step-0000010", "total_flops"] == 5e8
    assert "full count" in full.figure.layout.xaxis.title.text and "6ND" in six.figure.layout.xaxis.title.text
    assert list(cost_table(rows, "t", {"part": "total"}).figure.data[0].cells.values[3]) == ["0", "5e+08", "6e+08"]
    with pytest.raises(ConfigError, match="option flops"):
        score_vs_flops(rows, "t", {"task": "upos", "metric": "accuracy", "flops": "6nd"})


def test_checkpoints_under_finds_steps_and_best_folders(tmp_path):
    for p in ("train/a/seed-0/step-0000001", "finetune/b/seed-1/best", "finetune/b/seed-1/resume"):
        (tmp_path / p).mkdir(parents=True)
        (tmp_path / p / "config.json").write_text("{}")
    found = [str(p.relative_to(tmp_path)) for p in checkpoints_under(tmp_path)]
    assert found == ["train/a/seed-0/step-0000001", "finetune/b/seed-1/best"]


@pytest.mark.slow
def test_pages_render_headless(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    store = ResultsStore(tmp_path / "runs")
    with store.start_run("finetune", {"task": "conll2002_es"}, name="ner") as run:
        run.add(planted_finetune_rows())
        run.note("splits", {"split_seed": 0, "ids": {"train": ["x1", "x2"], "dev": ["d1"], "test": ["t1"]}})
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "finetune"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("span_f1" in c.value for c in at.caption)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "cost"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert any("No checkpoints" in i.value for i in at.info)
