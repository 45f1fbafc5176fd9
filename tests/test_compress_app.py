"""The compression page (app/page_modules/prune.py) and its figures (experiments/figures/prune_*.yaml) on
a store holding sweep rows built by the sweep's own `build_rows` from planted points: each figure
draws exactly the stored means and standard deviations, and the page renders them."""

from __future__ import annotations

import numpy as np
import pytest

from app.figures import load_spec, render
from app.page_modules import prune as page
from workbench.drivers.prune_sweep import build_rows
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore

APP = str(REPO_ROOT / "app" / "streamlit_app.py")
FULL = {0: 0.80, 1: 0.82, 2: 0.78}


def _points() -> list[dict]:
    out = []

    def add(method, amount, seed, acc, **kw):
        out.append({"method": method, "amount": amount, "seed": seed, "dev": {"accuracy": acc + 0.01, "n": 100},
                    "test": {"accuracy": acc, "n": 100}, "parameters": 1200, "prunable": 1000, "nonzero_prunable": 800,
                    "nonzero_parameters": 900, "sparsity_measured": kw.pop("measured", amount if method in (
                        "imp", "oneshot") else 0.0), **kw})

    for seed, acc in FULL.items():
        add("full", 0.0, seed, acc)
        for k, amount in enumerate((0.1, 0.2, 0.3)):
            add("imp", amount, seed, acc - 0.01 * k, round=k + 1)
        add("oneshot", 0.3, seed, acc - 0.1)
        add("quantize", 8, seed, acc, bits=8)
        add("quantize", 1, seed, 0.5, bits=1)
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    s = ResultsStore(tmp_path_factory.mktemp("prune-store"))
    with s.start_run("prune", {"planted": True}, seeds=[0, 1, 2], name="planted") as w:
        w.add(build_rows(_points(), "sentence_polarity", "bert", "planted") + _head_rows())
    return s


# a planted head-pruning subnetwork per seed (2 layers x 3 heads): (0, 1) removed by both seeds,
# (1, 2) by seed 0 only
HEADS_KEPT = {0: [[1, 0, 1], [1, 1, 0]], 1: [[1, 0, 1], [1, 1, 1]]}


def _head_rows() -> list[dict]:
    from workbench.drivers.head_pruning import PruningCurve, PruningStep, curve_rows

    rows = []
    for seed, kept in HEADS_KEPT.items():
        kept = np.array(kept, dtype=bool)
        curve = PruningCurve("good", 0.8, 0.9, [PruningStep(0, 0, 0.8, np.ones((2, 3), bool)),
                                                PruningStep(1, int((~kept).sum()), 0.75, kept)])
        rows += [r for r in curve_rows(curve, model="heads", family="bert", seed=seed, task="sentence_polarity")
                 if r["metric"] in ("head_kept", "heads_prunable")]
    return rows


def test_the_surviving_heads_figure_draws_the_share_of_seeds_keeping_each_head(store, tmp_path):
    import pandas as pd

    assert load_spec("prune_heads_matrix")[1]["plot"] in page.PLOTS
    result = render("prune_heads_matrix", store, tmp_path / "fig", formats=("html",))
    data = pd.read_csv(result.folder / "data.csv")
    share = data.set_index(["layer", "head"])["value"]
    expected = np.mean([np.array(k, float) for k in HEADS_KEPT.values()], axis=0)  # layer = block + 1
    assert [share[(layer + 1, head)] for layer in range(2) for head in range(3)] == pytest.approx(expected.ravel())
    assert set(data["seeds"]) == {2}


def test_wins_follow_one_sd_of_the_full_model(store):
    rows = store.query(probe="prune")
    wins = page._aggregates(rows, "test", "wins").set_index(["model", "amount"])["value"]
    full = np.array(list(FULL.values()))
    band = full.mean() - full.std(ddof=1)  # 0.78
    # imp at 0.3 has mean 0.78 = band (wins), oneshot 0.70 (does not)
    assert wins[("imp", 0.1)] == 1.0 and wins[("imp", 0.3)] == float(0.78 >= band) and wins[("oneshot", 0.3)] == 0.0
    assert ("quantize", 8.0) not in wins.index  # only the retrained methods are tickets


def test_sparsity_figure_draws_the_stored_means_and_sds(store, tmp_path):
    import pandas as pd

    result = render("prune_sparsity", store, tmp_path / "fig", formats=("html",))
    data = pd.read_csv(result.folder / "data.csv")
    imp = data[data["model"] == "imp"].sort_values("x")
    assert list(imp["x"]) == [0.1, 0.2, 0.3]
    expected = [np.mean([a - 0.01 * k for a in FULL.values()]) for k in range(3)]
    assert np.allclose(imp["value"], expected)
    sd = np.std(list(FULL.values()), ddof=1)
    assert np.allclose(imp["high"] - imp["value"], sd)
    full = data[data["model"] == "full"]
    assert full["value"].item() == pytest.approx(np.mean(list(FULL.values())))


def test_bits_and_size_figures(store):
    rows = store.query(probe="prune")
    bits = page.prune_vs_bits(rows, "bits", {}).data
    q = bits[bits["model"] == "quantize"].sort_values("x")
    assert list(q["x"]) == [1.0, 8.0] and q["value"].iloc[0] == pytest.approx(0.5)
    size = page.prune_vs_size(rows, "size", {}).data
    assert set(size[size["model"] == "quantize"]["x"]) == {1000 * 8 / 32, 1000 * 1 / 32}  # zeros stored too
    assert set(size[size["model"] == "imp"]["x"]) == {800.0}
    for spec in ("prune_bits", "prune_size"):
        assert load_spec(spec)[1]["plot"] in page.PLOTS


@pytest.mark.slow
def test_the_compression_page_renders_the_table(store, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["page"] = "prune"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    table = at.container("prune-table").dataframe[0].value
    imp = table[(table["method"] == "imp") & (table["amount"] == 0.3)]
    assert imp["accuracy"].item() == pytest.approx(np.mean(list(FULL.values())) - 0.02)
    # the surviving-heads section draws the stored matrix: (0, 1) kept by no seed, (1, 2) by one of two
    heads = next(d.value for d in at.dataframe if "head" in d.value.columns)
    share = heads.set_index(["layer", "head"])["value"]
    assert share[(1, 1)] == 0.0 and share[(2, 2)] == 0.5 and share[(1, 0)] == 1.0
