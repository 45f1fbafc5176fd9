"""Only per-unit rows are stored; every statistic over seeds is computed when rows are read, through
`workbench.store.aggregate.aggregate` (issue 41, item 4): the prune sweep (per seed; mean, 95%
t-interval, sd and `wins` at read time) and the cloze learning curve (per fine-tuning seed; mean, sd,
max and the weighted score at read time). Each read-time number is checked against the value the
old code stored, computed here independently (numpy, scipy.stats.t); a store that still holds old
aggregated rows is read without counting them as one more seed."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from workbench.store.aggregate import aggregate, per_unit, stored_aggregates
from workbench.store.results import ResultsError, ResultsStore, validate_rows

# ------------------------------------------------------------------------------------ prune sweep
# planted points: accuracies per seed (full model, imp, random, quantize); measured sparsity per seed
ACC = {("full", 0.0): (0.80, 0.86, 0.83), ("imp", 0.5): (0.82, 0.78, 0.81), ("random", 0.5): (0.60, 0.64, 0.58),
       ("quantize", 8.0): (0.79, 0.85, 0.84), ("imp", 0.7): (0.83, 0.84, 0.86)}
MEASURED = {("imp", 0.5): (0.49, 0.5, 0.51), ("random", 0.5): (0.5, 0.5, 0.52), ("imp", 0.7): (0.7, 0.69, 0.71)}


def _points(seeds=(0, 1, 2)) -> list[dict]:
    out = []
    for (method, amount), accs in ACC.items():
        for s in seeds:
            p = {"method": method, "seed": s, "amount": amount, "parameters": 100, "nonzero_parameters": 90,
                 "dev": {"accuracy": accs[s] - 0.02, "n": 50}, "test": {"accuracy": accs[s], "n": 60}}
            if (method, amount) in MEASURED:
                p["sparsity_measured"] = MEASURED[(method, amount)][s]
            if method == "quantize":
                p["bits"] = 8
            out.append(p)
    return out


def _old_aggregate_rows(points, run_name="sw") -> list[dict]:
    """The seed-less rows the sweep stored before issue 41, their numbers computed independently
    (numpy for mean and sd, scipy.stats.t for the 95% interval)."""
    rows = []
    full = {s: np.array([p[s]["accuracy"] for p in points if p["method"] == "full"]) for s in ("dev", "test")}
    for method, amount in ACC:
        ps = [p for p in points if (p["method"], p["amount"]) == (method, amount)]
        for split in ("dev", "test"):
            x = np.array([p[split]["accuracy"] for p in ps])
            lo, hi = stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
            extra = {"amount": amount, "over": "seeds", "interval": "t, 95%", "sd": float(x.std(ddof=1)),
                     "seeds": len(x), "sparsity_measured": float(np.mean([p.get("sparsity_measured", 0.0) for p in ps])),
                     "sweep": run_name}
            common = {"family": "bert", "probe": "prune", "task": "sp", "model": method, "split": split}
            rows.append({**common, "metric": "accuracy", "value": float(x.mean()), "n": len(x), "ci_low": lo,
                         "ci_high": hi, "extra": extra})
            if method in ("imp", "random"):
                f = full[split]
                rows.append({**common, "metric": "wins", "value": float(x.mean() >= f.mean() - f.std(ddof=1)),
                             "n": len(x), "extra": {**extra, "full_mean": float(f.mean()), "full_sd": float(f.std(ddof=1))}})
    return rows


def test_the_sweep_writes_per_seed_rows_only_and_the_store_refuses_an_aggregate_row(tmp_path):
    from workbench.drivers.prune_rows import build_rows

    rows = build_rows(_points(), "sp", "bert", "sw")
    assert len(rows) == len(ACC) * 3 * 2
    assert all(r["seed"] is not None and not (isinstance(r["seed"], float) and math.isnan(r["seed"])) for r in rows)
    assert {r["metric"] for r in rows} == {"accuracy"}
    validate_rows(rows)
    # an aggregated row, as the old sweep wrote it, no longer fits the declared rows: refused when written
    store = ResultsStore(tmp_path)
    with store.start_run("prune", {}) as w:
        with pytest.raises(ResultsError, match=r"producer 'prune'.*undeclared key '(over|interval|sd|seeds)'"):
            w.add(_old_aggregate_rows(_points())[:1])
        w.add(rows)


def test_read_time_summary_equals_the_rows_the_sweep_used_to_store():
    from workbench.drivers.prune_rows import build_rows, over_seeds

    points = _points()
    rows = validate_rows(build_rows(points, "sp", "bert", "sw"))
    old = pd.DataFrame(_old_aggregate_rows(points))
    for split in ("dev", "test"):
        got = over_seeds(rows, split)
        want = old[(old["metric"] == "accuracy") & (old["split"] == split)]
        assert got["model"].tolist() == want["model"].tolist()  # the sweep's order of methods and amounts
        assert got["amount"].tolist() == [e["amount"] for e in want["extra"]]
        for col, ref in (("value", want["value"]), ("ci_low", want["ci_low"]), ("ci_high", want["ci_high"]),
                         ("sd", [e["sd"] for e in want["extra"]]),
                         ("sparsity_measured", [e["sparsity_measured"] for e in want["extra"]])):
            assert got[col].astype(float).tolist() == pytest.approx(list(ref), rel=1e-12, abs=1e-15), col
        assert got["seeds"].tolist() == [e["seeds"] for e in want["extra"]]
        wins = over_seeds(rows, split, "wins")
        want_w = old[(old["metric"] == "wins") & (old["split"] == split)]
        assert wins[["model", "value"]].values.tolist() == want_w[["model", "value"]].values.tolist()
        assert wins["full_mean"].tolist() == pytest.approx([e["full_mean"] for e in want_w["extra"]], rel=1e-12)
    # the planted outcome: imp wins at both amounts, random does not (test split)
    assert over_seeds(rows, "test", "wins")["value"].tolist() == [1.0, 0.0, 1.0]


def test_one_full_seed_gives_no_wins_and_one_seed_no_interval():
    from workbench.drivers.prune_rows import build_rows, over_seeds

    rows = validate_rows(build_rows(_points(seeds=(0,)), "sp", "bert", "sw"))
    assert over_seeds(rows, "test", "wins").empty  # no sd over one seed (the old sweep wrote no wins row)
    acc = over_seeds(rows, "test")
    assert acc["seeds"].tolist() == [1] * len(ACC)
    assert acc["ci_low"].isna().all() and acc["sd"].isna().all()


def _old_format_table(old_rows) -> str:
    """What the sweep printed before issue 41 (its table read the stored seed-less rows), rebuilt
    from the independently computed rows of `_old_aggregate_rows` by the diagnostics script's
    `old_table` (experiments/diagnostics/read_time_aggregates.py, which checks real stores)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "diagnostics"))
    from read_time_aggregates import old_table

    return old_table(pd.DataFrame(old_rows))


def test_the_printed_table_keeps_its_numbers_and_ignores_old_aggregate_rows():
    from workbench.drivers.prune_rows import build_rows, format_table

    points = _points()
    rows, old = build_rows(points, "sp", "bert", "sw"), _old_aggregate_rows(points)
    printed = format_table(rows)
    assert printed == _old_format_table(old)
    assert "imp                    0.5    0.500    0.8033  0.0208   yes" in printed.splitlines()
    # a frame that still holds the old seed-less rows (an older run read back) prints the same table
    assert format_table(rows + old) == printed
    # as the store gives them back: extra as JSON text
    stored = pd.DataFrame(rows + old).assign(extra=lambda d: d["extra"].map(json.dumps))
    assert format_table(stored) == printed


def test_the_compression_page_skips_old_aggregate_rows_instead_of_counting_them(tmp_path):
    from app.page_modules import prune as page
    from workbench.drivers.prune_rows import build_rows

    points = _points()
    store = ResultsStore(tmp_path)
    with store.start_run("prune", {"new": True}, name="new") as w:
        w.add(build_rows(points, "sp", "bert", "new"))
    new_rows = store.query(probe="prune")
    # an old run: per-seed rows and the seed-less rows beside them (written as the old code did,
    # unchecked: the old declaration is gone)
    old_rows = validate_rows(build_rows(points, "sp", "bert", "old")).assign(run_id="old-run")
    old_agg = pd.DataFrame(_old_aggregate_rows(points, "old")).assign(
        run_id="old-run", seed=np.nan, extra=lambda d: d["extra"].map(json.dumps))
    both = pd.concat([new_rows, old_rows, old_agg], ignore_index=True)
    assert stored_aggregates(both).sum() == len(old_agg)
    fresh = page._aggregates(new_rows, "test").drop(columns="run_id")
    for run_id, g in page._aggregates(both, "test").groupby("run_id", sort=False):
        g = g.drop(columns="run_id").reset_index(drop=True)
        assert g["seeds"].tolist() == [3] * len(ACC)  # three seeds, not four
        pd.testing.assert_frame_equal(g, fresh.reset_index(drop=True), check_dtype=False)
    sparsity = page.prune_vs_sparsity(both, "t", {"split": "test"}).data
    imp = sparsity[(sparsity["model"] == "imp") & (sparsity["run_id"] == "old-run")].sort_values("x")
    x = np.array(ACC[("imp", 0.5)])
    assert imp["value"].iloc[0] == pytest.approx(x.mean()) and imp["high"].iloc[0] == pytest.approx(
        x.mean() + x.std(ddof=1))


# ------------------------------------------------------------------------------------ cloze learning curve
SIZES = (20, 10)  # the probe's order; the curve is drawn by size
CURVE = {(20, 0): 0.70, (20, 1): 0.80, (20, 2): 0.90, (10, 0): 0.50, (10, 1): 0.65, (10, 2): 0.55}


class _Handle:
    num_layers = {"encoder": 2}


class _Unit:
    """The few attributes of `probes.core.runner.Unit` the learning curve uses."""

    handle, stack, is_twin, model = _Handle(), "encoder", False, "m"

    def rows(self, task, metrics, **kw):
        from probes.core.rows import layer_rows

        return layer_rows(metrics, probe="cloze", task=task, model=self.model, family="bert", seed=None, step=None,
                          stack=self.stack, **kw)

    def log(self, _):
        pass


def _curve_rows(monkeypatch) -> pd.DataFrame:
    from probes.cloze import rows as cloze_rows
    from probes.cloze.settings import Settings

    calls = []

    def planted(scorer, sub, test, steps, lr, seed):
        s = seed % 1000
        calls.append((len(sub), s))
        return {"accuracy": CURVE[(len(sub), s)]}

    monkeypatch.setattr(cloze_rows, "finetune_mc", planted)
    settings = Settings(curve_sizes=SIZES, curve_seeds=3, curve_steps=4)
    data = {"train": list(range(40)), "test": list(range(25))}
    frames = cloze_rows._learning_curve(_Unit(), None, data, "age", settings)
    assert len(calls) == 6
    return validate_rows(pd.concat(frames, ignore_index=True))


def _old_curve_rows() -> pd.DataFrame:
    """The rows the cloze probe stored before issue 41: per size the mean, np.std (ddof 0) and max
    over seeds with the accuracies in extra, and the weighted score of the mean curve."""
    from probes.cloze.finetune import weighted_score

    rows, means = [], []
    for n in SIZES:
        accs = [CURVE[(n, s)] for s in range(3)]
        means.append(np.mean(accs))
        for metric, v in (("curve_acc_mean", np.mean(accs)), ("curve_acc_sd", np.std(accs)), ("curve_acc_max", max(accs))):
            rows.append({"model": "m", "family": "bert", "probe": "cloze", "task": "age", "split": "test", "layer": 2,
                         "stack": "encoder", "metric": metric, "value": float(v), "n": 25,
                         "extra": json.dumps({"train_size": n, "seeds": 3, "steps": 4, "accuracies": accs})})
    rows.append({"model": "m", "family": "bert", "probe": "cloze", "task": "age", "split": "test", "layer": 2,
                 "stack": "encoder", "metric": "weighted_score", "value": weighted_score(list(SIZES), means), "n": 25,
                 "extra": json.dumps({"train_sizes": list(SIZES)})})
    return pd.DataFrame(rows)


def test_cloze_stores_one_row_per_fine_tuning_seed(monkeypatch):
    rows = _curve_rows(monkeypatch)
    assert set(rows["metric"]) == {"curve_acc", "weighted_score"}  # no mean, sd or max row
    curve = rows[rows["metric"] == "curve_acc"]
    got = {(json.loads(e)["train_size"], json.loads(e)["curve_seed"]): v for e, v in zip(curve["extra"], curve["value"])}
    assert got == pytest.approx(CURVE)
    assert not stored_aggregates(rows).any()
    from workbench.store.rowschema import check_extra

    import probes.cloze  # noqa: F401  (declares the cloze rows)

    assert "undeclared key 'accuracies'" in check_extra("cloze", {"train_size": 10, "accuracies": [0.5]})


def test_cloze_curve_statistics_at_read_time_equal_the_old_stored_rows(monkeypatch):
    from probes.cloze.summary import curve_stats, weighted_scores, summary

    new, old = _curve_rows(monkeypatch), _old_curve_rows()
    for rows in (new, old):  # an old run's rows read as the seeds they summarise
        stats_ = curve_stats(rows)
        assert stats_["train_size"].tolist() == [10, 20]
        for _, r in stats_.iterrows():
            accs = np.array([CURVE[(r["train_size"], s)] for s in range(3)])
            assert [r["mean"], r["sd"], r["max"]] == pytest.approx([accs.mean(), np.std(accs), accs.max()], rel=1e-12)
            assert r["seeds"] == 3 and r["steps"] == 4 and r["accuracies"] == pytest.approx(list(accs))
        ws = weighted_scores(rows)
        assert ws["weighted_score"].item() == pytest.approx(old.loc[old["metric"] == "weighted_score", "value"].item(),
                                                            rel=1e-12)
    printed = summary(new).splitlines()[1]
    assert printed == summary(old).splitlines()[1]  # the printed weighted score
    assert printed.split()[-1] == f"{old.loc[old['metric'] == 'weighted_score', 'value'].item():.3f}"


def test_the_cloze_page_reads_old_and_new_runs_without_double_counting(monkeypatch):
    from app.page_modules import cloze as page

    new = _curve_rows(monkeypatch).assign(run_id="2026-02")
    old = _old_curve_rows().assign(run_id="2026-01", model="o")
    table = page.curve_table(pd.concat([old, new], ignore_index=True))
    assert table["model"].tolist() == ["o", "o", "m", "m"]
    for model in ("o", "m"):
        t = table[table["model"] == model]
        assert t["seeds"].tolist() == [3, 3]  # the old mean is not a fourth seed
        assert t["mean"].tolist() == pytest.approx([np.mean([CURVE[(n, s)] for s in range(3)]) for n in (10, 20)])
        assert t["sd"].tolist() == pytest.approx([np.std([CURVE[(n, s)] for s in range(3)]) for n in (10, 20)])
    ws = page.weighted_scores(pd.concat([old, new], ignore_index=True))
    assert ws["weighted_score"].tolist() == pytest.approx([old.loc[old["metric"] == "weighted_score", "value"].item()] * 2)
    # the same model in two runs: the newest run's curve only
    both = page.curve_table(pd.concat([old.assign(model="m"), new.assign(value=new["value"] - 0.1)], ignore_index=True))
    assert both["mean"].tolist() == pytest.approx([np.mean([CURVE[(n, s)] for s in range(3)]) - 0.1 for n in (10, 20)])


# ------------------------------------------------------------------------------------ the one statistic
def test_population_sd_and_the_t_interval_stays_on_the_sample_sd():
    df = pd.DataFrame({"g": ["a"] * 4, "seed": range(4), "value": [0.1, 0.4, 0.2, 0.5]})
    x = df["value"].to_numpy()
    pop = aggregate(df, by=["g"], interval="t", ddof=0).iloc[0]
    sample = aggregate(df, by=["g"], interval="t").iloc[0]
    assert pop["sd"] == pytest.approx(np.std(x)) and sample["sd"] == pytest.approx(np.std(x, ddof=1))
    lo, hi = stats.t.interval(0.95, 3, loc=x.mean(), scale=stats.sem(x))
    assert [pop["ci_low"], pop["ci_high"]] == pytest.approx([lo, hi]) == [sample["ci_low"], sample["ci_high"]]
    band = aggregate(df, by=["g"], interval="sd", ddof=0).iloc[0]
    assert band["ci_high"] - band["value"] == pytest.approx(np.std(x))
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="ddof must be 0 or 1"):
        aggregate(df, by=["g"], ddof=2)


def test_per_unit_drops_what_older_runs_stored_as_statistics():
    rows = pd.DataFrame([
        {"model": "m", "seed": 0, "metric": "accuracy", "value": 0.5, "extra": "{}"},
        {"model": "m", "seed": None, "metric": "accuracy", "value": 0.55, "extra": '{"over": "seeds"}'},
        {"model": "majority", "seed": None, "metric": "accuracy", "value": 0.4, "extra": '{"label": "pos"}'},
        {"model": "m", "seed": None, "metric": "curve_acc_mean", "value": 0.6, "extra": "{}"},
        {"model": "m", "seed": 1, "metric": "accuracy", "value": 0.6, "extra": {"over": "kept: a per-seed row"}},
    ])
    assert stored_aggregates(rows).tolist() == [False, True, False, True, False]
    assert per_unit(rows)["value"].tolist() == [0.5, 0.4, 0.6]
    seeded = rows[rows["seed"].notna()]  # nothing seed-less to look at
    assert not stored_aggregates(seeded).any() and per_unit(seeded)["value"].tolist() == [0.5, 0.6]
    assert per_unit(rows.drop(columns="extra"))["value"].tolist() == [0.5, 0.55, 0.4, 0.6]  # no extra: by metric only


# ------------------------------------------------------------------------------------ pages and tables
def test_surviving_heads_share_and_scalar_mix_means():
    from app.views.layer_curves import scalar_mix_means
    from app.views.prune_heads import surviving_heads

    kept = {0: [1, 0, 1, 1], 1: [1, 1, 0, 1], 2: [1, 0, 0, 1]}  # seed -> heads (layer 1: 0, 1; layer 2: 0, 1)
    rows = pd.DataFrame([{"model": "heads", "task": "sp", "metric": "head_kept", "seed": s, "layer": 1 + h // 2,
                          "value": float(v), "extra": json.dumps({"order": "good", "head": h % 2})}
                         for s, vs in kept.items() for h, v in enumerate(vs)])
    table = surviving_heads(rows)
    want = np.mean(np.array(list(kept.values()), float), axis=0)
    assert table["kept"].tolist() == pytest.approx(want.tolist()) and set(table["seeds"]) == {3}
    # two selected runs of one sweep hold every seed twice: the same share, still 3 seeds
    twice = surviving_heads(pd.concat([rows, rows.assign(run_id="second")], ignore_index=True))
    assert twice["kept"].tolist() == pytest.approx(want.tolist()) and set(twice["seeds"]) == {3}
    mix = pd.DataFrame([{"model": m, "seed": s, "metric": "scalar_mix_weight", "layer": l, "value": 0.1 * l + 0.05 * s}
                        for m in ("b", "a") for s in (0, 1) for l in (1, 0)]
                       + [{"model": m, "seed": s, "metric": "centre_of_gravity", "layer": None, "value": 1.0 + s}
                          for m in ("b", "a") for s in (0, 1)])
    weights, cog = scalar_mix_means(mix)
    assert weights["model"].tolist() == ["b", "b", "a", "a"]
    assert weights["value"].tolist() == pytest.approx([0.125, 0.025, 0.125, 0.025])
    assert cog.to_dict() == pytest.approx({"a": 1.5, "b": 1.5}) and list(cog.index) == ["a", "b"]


def test_run_comparison_does_not_average_an_old_stored_mean_in():
    from app.views.runs import compare_rows

    keys = {"model": "m", "task": "sp", "metric": "accuracy", "split": "test", "stack": None, "layer": None}
    a = pd.DataFrame([{**keys, "seed": 0, "value": 0.5, "extra": "{}"}, {**keys, "seed": 1, "value": 0.7, "extra": "{}"},
                      {**keys, "seed": None, "value": 0.9, "extra": '{"over": "seeds"}'}])  # a planted wrong "mean"
    b = a.assign(value=[0.6, 0.8, 0.0])
    out = compare_rows(a, b).iloc[0]
    assert [out["value_a"], out["value_b"], out["diff"]] == pytest.approx([0.6, 0.7, 0.1])


def test_finetune_score_table_reads_the_seeds_not_an_old_stored_mean():
    from app.page_modules import finetune as page

    seeded = [{"model": "m", "family": "bert", "probe": "finetune", "task": "sp", "seed": i, "split": "test",
               "metric": "accuracy", "value": v, "n": 20, "ci_low": None, "ci_high": None, "extra": "{}"}
              for i, v in enumerate((0.7, 0.75, 0.8))]
    old = {**seeded[0], "seed": None, "value": 0.1, "ci_low": 0.0, "ci_high": 0.2, "extra": '{"over": "seeds"}'}
    base = {**seeded[0], "model": "majority", "family": "baseline", "seed": None, "value": 0.5, "extra": "{}"}
    table = page.score_table(pd.DataFrame([*seeded, old, base]), "accuracy").set_index("model")
    x = np.array([0.7, 0.75, 0.8])
    lo, hi = stats.t.interval(0.95, 2, loc=x.mean(), scale=stats.sem(x))
    assert table.loc["m", ["score", "ci_low", "ci_high", "seeds"]].tolist() == pytest.approx([x.mean(), lo, hi, 3])
    assert table.loc["majority", "score"] == 0.5


def test_distill_table_prints_means_over_seeds():
    from workbench.drivers.distill import distill_rows, format_table

    doc = {"point": {"depth": 2, "init": "teacher", "temperature": 2.0, "alpha": 0.5},
           "seeds": {"0": {"test_accuracy": 0.70, "test_n": 10, "dev_accuracy": 0.6},
                     "1": {"test_accuracy": 0.76, "test_n": 10, "dev_accuracy": 0.6}},
           "parameters": 5, "file_bytes": 6, "latency_ms": 1.5}
    teacher = {"depth": 4, "test_accuracy": 0.8, "test_n": 10, "parameters": 10, "file_bytes": 12, "latency_ms": 3.0}
    lines = format_table(distill_rows({"L2": doc}, teacher, "teach", "bert", "sp")).splitlines()
    assert lines[1].split()[1:] == ["0.8000", "100.0", "10", "3.0", "1"]
    assert lines[2].split()[1:] == [f"{0.73:.4f}", f"{100 * 0.73 / 0.8:.1f}", "5", "1.5", "2"]


def test_peft_cka_table_is_the_mean_over_seeds():
    from app.page_modules.peft import cka_table

    rows = pd.DataFrame([{"model": "m", "seed": s, "metric": "cka_to_start", "layer": layer,
                          "value": 0.1 * layer + 0.02 * s + (0.5 if m == "full" else 0.0),
                          "extra": json.dumps({"method": m})}
                         for m in ("lora", "full") for s in (0, 1, 2) for layer in (1, 0)])
    table = cka_table(rows)
    assert list(table.columns) == ["layer", "full", "lora"] and table["layer"].tolist() == [0, 1]
    assert table["lora"].tolist() == pytest.approx([0.02, 0.12]) and table["full"].tolist() == pytest.approx([0.52, 0.62])


def test_peft_method_table_joins_counts_by_method_not_by_position():
    """A row without a method (an older or foreign row) sorts first in `aggregate`'s groups: the
    parameter counts must still land on their own method."""
    from app.page_modules.peft import method_table

    rows = [{"model": "x", "probe": "peft", "task": "sp", "split": "test", "metric": "accuracy", "seed": s,
             "value": v + (0.1 if m == "full" else 0.0),
             "extra": json.dumps({"method": m, "trainable": n, "total_parameters": 1000})}
            for m, n in (("lora", 10), ("full", 100)) for s, v in ((0, 0.6), (1, 0.7))]
    rows.insert(0, {"model": "x", "probe": "peft", "task": "sp", "split": "test", "metric": "accuracy", "seed": 0,
                    "value": 0.1, "extra": json.dumps({"trainable": 5, "total_parameters": 1000})})
    table = method_table(pd.DataFrame(rows)).set_index("method")
    assert table.loc["full", "trainable"] == 100 and table.loc["lora", "trainable"] == 10
    assert table.loc["full", "accuracy"] == pytest.approx(0.75) and table.loc["lora", "share_of_model"] == pytest.approx(0.01)
    assert list(table.index) == ["full", "lora"] and set(table["seeds"]) == {2}
