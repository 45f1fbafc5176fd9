"""The `--full` reproduction rows (app/reproduce/rows_full.py: lottery tickets, head pruning,
distillation, PEFT, the structural probe on every tree for SmolLM2, membership inference): registered with their expected
times, their statistics and measure functions on planted driver results, and their `--quick` code
path on the tiny encoder (one slow test, all six rows sharing one pair of quick models)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from app.reproduce import registry as reproduction_registry
from app.reproduce import report, rows as reproduction_rows, rows_full
from app.reproduce.spec import DIFFERS, REPRODUCED

FULL_KEYS = ["chen2020", "michel2019", "sanh2019", "houlsby2019", "hewitt_manning2019_causal_protocol", "duan2024"]


def test_the_full_rows_are_registered_full_with_their_expected_times():
    registry = reproduction_registry.registry()
    for key in FULL_KEYS:
        row = registry[key]
        assert row.full and row.minutes == rows_full.FULL_MINUTES[key][0]
        assert "min CPU" in row.our_setting and "min GPU" in row.our_setting
        assert row.paper.citation.paper and row.test.description
    assert not [k for k in FULL_KEYS if k in {r.key for r in report.select_rows(None, full=False)}]


def test_wald_intervals_differences_and_ratios():
    acc, low, high = rows_full.wald(0.8, 100)
    assert (acc, low, high) == pytest.approx((0.8, 0.8 - 1.96 * 0.04, 0.8 + 1.96 * 0.04), abs=1e-3)
    d = rows_full.difference((0.8, 100), (0.7, 100))
    assert d[0] == pytest.approx(0.1) and d[1] == pytest.approx(0.1 - 1.96 * math.sqrt(0.0016 + 0.0021), abs=1e-3)
    r = rows_full.ratio((0.8, 400), (0.8, 400))
    assert r[0] == pytest.approx(1.0) and r[1] < 1.0 < r[2]


def point(method, amount, dev, test, n=200, **extra):
    return {"method": method, "amount": amount, "dev": {"accuracy": dev, "n": n}, "test": {"accuracy": test, "n": n}, **extra}


def test_the_ticket_row_reads_the_highest_matching_sparsity(monkeypatch, tmp_path):
    from workbench.drivers import prune_sweep

    points = [point("full", 0.0, 0.8, 0.80)] + [point("imp", a, 0.8, t) for a, t in
                                                 ((0.1, 0.81), (0.2, 0.79), (0.3, 0.78), (0.4, 0.79), (0.5, 0.76), (0.6, 0.70), (0.7, 0.65))]
    monkeypatch.setattr(prune_sweep, "run_prune", lambda cfg, ft, store=None: SimpleNamespace(points=points, run_id="r"))
    ctx = SimpleNamespace(quick=False, threads=1, models={}, store=SimpleNamespace(root=tmp_path))
    m = rows_full.measure_tickets(ctx)
    assert m.value == 0.4  # se of 0.8 at n 200 is 0.028: 0.78 and 0.79 match, 0.76 does not
    row = reproduction_registry.registry()["chen2020"]
    assert row.test.decide(row.paper, m).status == REPRODUCED


def test_the_head_row_reads_the_share_removable_and_the_three_subnetworks(monkeypatch, tmp_path):
    from workbench.drivers import prune_sweep

    good = [point("heads_good", k / 12, 0.80 - (0.002 * k if k <= 5 else 0.03 * k), 0.8, n_heads=12, n_heads_kept=12 - k)
            for k in range(1, 9)]
    points = [point("full", 0.0, 0.80, 0.80), *good,
              point("heads_random_equal_size", 0.5, 0.7, 0.70, n=1000, n_heads=12, n_heads_kept=6),
              point("heads_bad_equal_size", 0.5, 0.6, 0.55, n=1000, n_heads=12, n_heads_kept=6)]
    good[5]["test"] = {"accuracy": 0.79, "n": 1000}  # the good subnetwork of 6 heads
    monkeypatch.setattr(prune_sweep, "run_prune", lambda cfg, ft, store=None: SimpleNamespace(points=points, run_id="r"))
    ctx = SimpleNamespace(quick=False, threads=1, models={}, store=SimpleNamespace(root=tmp_path))
    m = rows_full.measure_heads(ctx)
    assert m.value == pytest.approx(5 / 12)
    assert m.components["good - random"][0] == pytest.approx(0.09)
    row = reproduction_registry.registry()["michel2019"]
    assert row.test.decide(row.paper, m).status == REPRODUCED
    points[-1]["test"]["accuracy"] = 0.75
    assert row.test.decide(row.paper, rows_full.measure_heads(ctx)).status == DIFFERS


def test_the_peft_row_holds_each_method_to_the_full_model(monkeypatch, tmp_path):
    from workbench.drivers import peft_sweep

    accs = {"full": 0.80, "bitfit": 0.78, "adapter": 0.79, "lora": 0.70}
    params = {"full": 1000.0, "bitfit": 10.0, "adapter": 36.0, "lora": 20.0}
    rows = pd.DataFrame([{"metric": "accuracy", "split": "test", "value": a, "n": 500, "extra": {"method": m}}
                         for m, a in accs.items()] +
                        [{"metric": "trainable_parameters", "split": None, "value": p, "n": None, "extra": {"method": m}}
                         for m, p in params.items()])
    monkeypatch.setattr(peft_sweep, "run_sweep", lambda cfg, store=None, progress=True: ("run-p", rows))
    ctx = SimpleNamespace(quick=False, threads=1, models={}, store=SimpleNamespace(root=tmp_path))
    m = rows_full.measure_peft(ctx)
    assert m.value == pytest.approx(0.70 / 0.80) and "bitfit 0.780 (1.00% of the parameters)" in m.detail
    row = reproduction_registry.registry()["houlsby2019"]
    verdict = row.test.decide(row.paper, m)
    assert verdict.status == DIFFERS and "lora / full 0.875 outside" in verdict.reason


@pytest.mark.slow
def test_quick_runs_every_full_row_on_the_tiny_encoder(tmp_path, monkeypatch):
    """Every `--full` row's code path on the quick models: a verdict, never `failed`."""
    from workbench.store.results import ResultsStore

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    outcomes = report.reproduce(FULL_KEYS, full=True, quick=True, store=ResultsStore(tmp_path / "runs"), threads=1,
                                progress=False)
    for o in outcomes:
        assert o.verdict.status in (REPRODUCED, DIFFERS), (o.row.key, o.verdict)
        assert math.isfinite(o.measurement.value) and o.measurement.run_ids, o.row.key
