"""Declared `extra` schemas checked at write time (workbench.store.rowschema) and the one seed statistic
(workbench.store.aggregate) behind the app's pages and figures (issue 41, item 4)."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from workbench.store.aggregate import aggregate, t_interval
from workbench.errors import ConfigError
from workbench.store.results import ResultsError, ResultsStore, validate_rows
from workbench.store.rowschema import RowSchema, check_extra, declared_producers


# ------------------------------------------------------------------------------------ schemas
def _row(probe: str, extra) -> dict:
    return {"probe": probe, "task": "t", "metric": "m", "value": 1.0, "extra": extra}


@pytest.fixture
def declared():
    """A producer declared for the test only, removed afterwards."""
    from workbench.store import rowschema

    RowSchema("test-producer", "per seed", required={"epoch": int}, optional={"note": str | None, "lr": float})
    RowSchema("test-producer", "over seeds", required={"over": str})
    yield "test-producer"
    rowschema._REGISTRY.pop("test-producer", None)


def test_undeclared_key_and_wrong_type_fail_at_write_time_naming_producer_and_key(declared, tmp_path):
    store = ResultsStore(tmp_path)
    with store.start_run("probe", {}) as w:
        w.add([_row(declared, {"epoch": 2, "note": None, "lr": 3})])  # an int is a JSON number
        w.add([_row(declared, {"over": "seeds"})])  # the other declared kind
        with pytest.raises(ResultsError, match=r"row 1 of producer 'test-producer'.*undeclared key 'epochs'"):
            w.add([_row(declared, {"epoch": 1}), _row(declared, {"epochs": 1})])
        with pytest.raises(ResultsError, match=r"key 'epoch' is string '2', declared integer"):
            w.add([_row(declared, '{"epoch": "2"}')])  # JSON text is checked too
        with pytest.raises(ResultsError, match=r"required key 'epoch' missing"):
            w.add([_row(declared, {"lr": 0.1})])
        with pytest.raises(ResultsError, match=r"key 'epoch' is boolean"):
            w.add(pd.DataFrame([_row(declared, {"epoch": True})]))
    assert len(store.read(w.run_id)) == 2  # the refused rows were not buffered


def test_types_follow_json(declared):
    assert check_extra(declared, {"epoch": 2.0}) is None  # stored JSON cannot tell 2 from 2.0
    assert "declared integer" in check_extra(declared, {"epoch": 2.5})
    assert check_extra(declared, {"epoch": 1, "lr": float("nan")}) is None
    assert check_extra("never-declared", {"anything": object()}) is None  # ad-hoc rows are not checked


def test_every_producer_declares_its_extra():
    import probes.align  # noqa: F401
    import probes.cloze  # noqa: F401
    import probes.coref  # noqa: F401
    import probes.extraction  # noqa: F401
    import probes.membership  # noqa: F401
    import workbench.drivers.peft_sweep  # noqa: F401
    import probes.syntax  # noqa: F401
    import workbench.drivers.prune_sweep  # noqa: F401
    import workbench.cost  # noqa: F401
    import workbench.drivers.distill_pretraining  # noqa: F401
    import workbench.drivers.finetune  # noqa: F401

    assert {"syntax", "align", "cloze", "coref", "extraction", "membership", "finetune", "prune", "distill",
            "peft", "cost"} <= set(declared_producers())


def test_driver_rows_pass_their_declarations():
    """The rows the drivers' row builders write today fit what they declare (no store needed)."""
    from workbench.drivers.prune_sweep import build_rows
    from workbench.drivers.distill import distill_rows

    points = [{"method": m, "seed": s, "amount": a, "sparsity": a, "parameters": 10, "prunable": 8,
               "nonzero_parameters": 9, "nonzero_prunable": 7, "sparsity_measured": a, "checkpoint": "/c",
               "dev": {"accuracy": 0.5 + 0.1 * s, "n": 10}, "test": {"accuracy": 0.6 + 0.1 * s, "n": 10}}
              for m, a in (("full", 0.0), ("imp", 0.5)) for s in (0, 1)]
    validate_rows(build_rows(points, "sentence_polarity", "bert", "sweep-a"))
    doc = {"point": {"depth": 2, "init": "teacher", "temperature": None, "alpha": 0.0},
           "seeds": {"0": {"test_accuracy": 0.7, "test_n": 10, "dev_accuracy": 0.6}},
           "parameters": 5, "file_bytes": 6, "latency_ms": 1.5}
    teacher = {"depth": 4, "test_accuracy": 0.8, "test_n": 10, "parameters": 10, "file_bytes": 12, "latency_ms": 3.0}
    validate_rows(distill_rows({"L2": doc}, teacher, "teach", "bert", "sentence_polarity"))
    bad = build_rows(points, "sentence_polarity", "bert", "sweep-a")
    bad[0]["extra"] = {**bad[0]["extra"], "amount": "half"}
    with pytest.raises(ResultsError, match=r"producer 'prune'.*key 'amount' is string"):
        validate_rows(bad)


# ------------------------------------------------------------------------------------ aggregate
FRAME = pd.DataFrame({
    "model": ["a", "a", "a", "b", "b", "c", "a"],
    "task": ["t"] * 6 + ["u"],
    "seed": [0, 1, 2, 0, 1, 0, 0],
    "value": [0.50, 0.70, 0.90, 0.20, 0.45, 0.30, 0.10],
})


def test_t_interval_matches_scipy():
    out = aggregate(FRAME, over="seed", by=["model", "task"], interval="t", level=0.9)
    a = out[(out["model"] == "a") & (out["task"] == "t")].iloc[0]
    x = np.array([0.5, 0.7, 0.9])
    lo, hi = stats.t.interval(0.9, len(x) - 1, loc=x.mean(), scale=stats.sem(x))
    assert (a["value"], a["ci_low"], a["ci_high"]) == pytest.approx((x.mean(), lo, hi), rel=1e-12)
    assert a["sd"] == pytest.approx(x.std(ddof=1)) and a["count"] == 3
    one = out[out["model"] == "c"].iloc[0]
    assert one["count"] == 1 and math.isnan(one["ci_low"]) and math.isnan(one["sd"])
    assert t_interval(x, 0.9) == pytest.approx((x.mean(), lo, hi), rel=1e-12)


def test_minmax_sd_and_order():
    mm = aggregate(FRAME, by=["model", "task"], interval="minmax")
    assert list(zip(mm["model"], mm["task"])) == [("a", "t"), ("b", "t"), ("c", "t"), ("a", "u")]  # first appearance
    assert mm[["ci_low", "ci_high"]].iloc[1].tolist() == [0.20, 0.45]
    sd = aggregate(FRAME, by=["model", "task"], interval="sd")
    b = np.array([0.20, 0.45])
    assert sd[["ci_low", "ci_high"]].iloc[1].tolist() == pytest.approx([b.mean() - b.std(ddof=1), b.mean() + b.std(ddof=1)])
    default = aggregate(FRAME)  # default grouping: the key columns present, less `over`
    assert len(default) == 4
    with pytest.raises(ConfigError, match="unknown interval 'bootstrap'"):
        aggregate(FRAME, interval="bootstrap")
    with pytest.raises(ConfigError, match=r"no column\(s\) \['layer'\]"):
        aggregate(FRAME, by=["layer"])


# ------------------------------------------------------------------------------------ pages keep their numbers
def test_finetune_epoch_curve_and_score_table_keep_their_numbers():
    from app.page_modules import finetune as page

    rows = []
    for seed, vals in ((0, [0.5, 0.6]), (1, [0.55, 0.8]), (2, [0.4, 0.7])):
        for epoch, v in enumerate(vals):
            rows.append({"model": "m", "family": "bert", "probe": "finetune", "task": "sp", "seed": seed, "split": "dev",
                         "metric": "accuracy_epoch", "value": v, "extra": {"epoch": epoch}})
        rows.append({"model": "m", "family": "bert", "probe": "finetune", "task": "sp", "seed": seed, "split": "test",
                     "metric": "accuracy", "value": vals[-1] - 0.05, "n": 20, "extra": {}})
    df = pd.DataFrame(rows)
    curve = page.epoch_curve(df, "accuracy")
    e1 = np.array([0.6, 0.8, 0.7])
    assert curve["epoch"].tolist() == [0, 1]
    assert curve.iloc[1][["mean", "low", "high", "sd", "seeds"]].tolist() == pytest.approx(
        [e1.mean(), 0.6, 0.8, e1.std(ddof=1), 3])
    # a run without the stored seed-less row: the same Student-t interval, computed at read time
    table = page.score_table(df, "accuracy")
    mean, lo, hi = t_interval(e1 - 0.05)
    assert table.iloc[0][["score", "ci_low", "ci_high", "seeds"]].tolist() == pytest.approx([mean, lo, hi, 3])
    stored = pd.concat([df, pd.DataFrame([{"model": "m", "family": "bert", "probe": "finetune", "task": "sp",
                                           "split": "test", "metric": "accuracy", "value": 0.123, "n": 3,
                                           "ci_low": 0.1, "ci_high": 0.2, "seed": None}])], ignore_index=True)
    # an older run's stored seed-less mean is not read: the statistic comes from the seeds (issue 41)
    assert page.score_table(stored, "accuracy").iloc[0][["score", "ci_low", "ci_high", "seeds"]].tolist() == \
        pytest.approx([mean, lo, hi, 3])


def test_prune_page_reads_the_seeds_and_skips_an_older_runs_seedless_rows():
    """The sweep stores per-seed rows only (issue 41); the page's numbers come from them, and the
    seed-less rows an older run stored beside them change nothing (planted wrong here: 0.0)."""
    from app.page_modules import prune as page
    from workbench.drivers.prune_sweep import build_rows

    points = [{"method": m, "seed": s, "amount": a, "sparsity_measured": a, "nonzero_parameters": 9,
               "dev": {"accuracy": v, "n": 10}, "test": {"accuracy": v + 0.01, "n": 10}}
              for m, a, vs in (("full", 0.0, (0.80, 0.84, 0.83)), ("imp", 0.5, (0.82, 0.79, 0.81)),
                               ("random", 0.5, (0.60, 0.62, 0.58)))
              for s, v in enumerate(vs)]
    rows = validate_rows(build_rows(points, "sp", "bert", "sw"))
    assert rows["seed"].notna().all()
    old = pd.DataFrame([{"model": m, "family": "bert", "probe": "prune", "task": "sp", "split": "test", "metric": metric,
                         "value": 0.0, "seed": None, "extra": json.dumps({"amount": a, "over": "seeds", "sd": 0.0})}
                        for m, a in (("full", 0.0), ("imp", 0.5), ("random", 0.5)) for metric in ("accuracy", "wins")])
    derived = page._aggregates(rows, "test")
    with_old = page._aggregates(pd.concat([rows, old], ignore_index=True), "test")
    pd.testing.assert_frame_equal(with_old, derived)
    x = np.array([0.82, 0.79, 0.81]) + 0.01
    imp = derived[derived["model"] == "imp"].iloc[0]
    assert [imp["value"], imp["sd"], imp["seeds"]] == pytest.approx([x.mean(), x.std(ddof=1), 3])
    assert [imp["ci_low"], imp["ci_high"]] == pytest.approx(stats.t.interval(0.95, 2, loc=x.mean(), scale=stats.sem(x)))
    wins = page._aggregates(pd.concat([rows, old], ignore_index=True), "test", "wins")
    assert wins["value"].tolist() == [1.0, 0.0]  # imp within one sd of full, random not


def test_layer_curve_band_is_the_minmax_aggregate():
    from app.data import aggregate_seeds

    rows = validate_rows([{"model": "m", "probe": "syntax", "task": "upos", "split": "test", "stack": "encoder",
                           "layer": layer, "metric": "accuracy", "seed": seed, "value": 0.1 * layer + 0.01 * seed,
                           "ci_low": 0.0, "ci_high": 1.0}
                          for layer in range(3) for seed in range(3)])
    out = aggregate_seeds(rows)
    assert out["value"].tolist() == pytest.approx([0.01, 0.11, 0.21])
    assert out["ci_low"].astype(float).tolist() == pytest.approx([0.0, 0.1, 0.2])
    assert out["ci_high"].astype(float).tolist() == pytest.approx([0.02, 0.12, 0.22])
    assert out["n_seeds"].tolist() == [3, 3, 3]


def test_distill_and_peft_tables_keep_their_numbers():
    from app.page_modules import distill, peft

    rows = pd.DataFrame([{"model": "s", "probe": "distill", "task": "sp", "split": "test", "metric": "accuracy",
                          "seed": i, "value": v, "extra": '{"role": "student"}'} for i, v in enumerate((0.7, 0.9, 0.8))])
    line = distill.tradeoff_table(rows).iloc[0]
    assert [line["accuracy"], line["accuracy_min"], line["accuracy_max"], line["seeds"]] == pytest.approx([0.8, 0.7, 0.9, 3])
    acc = pd.DataFrame([{"model": "m", "probe": "peft", "task": "sp", "split": "test", "metric": "accuracy", "seed": i,
                         "value": v, "extra": f'{{"method": "lora", "trainable": 10, "total_parameters": 100}}'}
                        for i, v in enumerate((0.6, 0.65))])
    t = peft.method_table(acc).iloc[0]
    assert [t["accuracy"], t["min"], t["max"], t["seeds"]] == pytest.approx([0.625, 0.6, 0.65, 2])


def test_finetune_table_prints_the_same_mean_and_interval_from_per_seed_rows():
    """Fine-tuning runs store per-seed rows only (issue 41); the printed table derives the mean and
    t-interval that older runs stored as a seed-less row, to the same digits."""
    from workbench.drivers.finetune import format_table, t_interval

    seeded = [{"model": "m", "probe": "finetune", "task": "sp", "split": s, "metric": "accuracy", "seed": i,
               "value": v + (0.01 if s == "dev" else 0.0)} for s in ("dev", "test") for i, v in enumerate((0.71, 0.74, 0.80))]
    stored = []
    for s in ("dev", "test"):
        mean, lo, hi = t_interval([r["value"] for r in seeded if r["split"] == s])
        stored.append({"model": "m", "probe": "finetune", "task": "sp", "split": s, "metric": "accuracy", "seed": None,
                       "value": mean, "ci_low": lo, "ci_high": hi})
    new, old = format_table(seeded), format_table(seeded + stored)
    assert new == old and "[0.6" in new  # the interval is printed, not left blank


def test_training_heatmap_is_the_mean_over_seeds_per_step_and_layer():
    from app.figures import training_heatmap

    rows = validate_rows([{"model": "m", "probe": "syntax", "task": "upos", "split": "test", "layer": layer,
                           "metric": "accuracy", "seed": seed, "step": step, "value": 0.1 * layer + 0.01 * seed + step / 1e4}
                          for step in (100, 10) for layer in (1, 0) for seed in (0, 1, 2)])
    drawn = training_heatmap(rows, "t", {"task": "upos"})
    z = np.asarray(drawn.figure.data[0].z, dtype=float)
    expected = rows.assign(value=rows["value"].astype(float)).pivot_table(index="step", columns="layer", values="value",
                                                                          aggfunc="mean").sort_index().to_numpy()
    assert z == pytest.approx(expected, rel=1e-12) and z.shape == (2, 2)
    assert list(drawn.figure.data[0].y) == ["10", "100"] and list(drawn.figure.data[0].x) == ["0", "1"]
