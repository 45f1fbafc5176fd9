"""The coreference page, headless (AppTest), on a store holding one coref run: its layer x head
heatmap and best-head table show exactly the stored rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.page_modules.coref import best_heads, head_matrix
from probes.core.rows import layer_rows
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore

APP = str(REPO_ROOT / "app" / "streamlit_app.py")
L, H = 3, 4


def _rows(model: str, seed: int):
    rng = np.random.default_rng(seed)
    acc = rng.random((L, H))
    frames = [layer_rows({"heads_all": acc[:, h], "heads_gap": acc[:, h] / 2}, probe="coref", task="attention-heads",
                         split="dev", layers=range(1, L + 1), extra={"head": h}, model=model) for h in range(H)]
    for l in range(L):
        frames.append(layer_rows({"best_head_accuracy": [acc[l].max()]}, probe="coref", task="attention-heads",
                                 split="dev", layers=[l + 1], ci={"best_head_accuracy": ([acc[l].max() - .1], [1.0])},
                                 extra={"best_head": int(acc[l].argmax())}, model=model))
    frames.append(layer_rows({"auc": [.6, .7, .8, .7], "string_match_auc": [.55] * 4}, probe="coref", task="gum-pairs",
                             split="dev", model=model))
    frames.append(layer_rows({"f1_masculine": [.5, .6, .7, .6], "f1_feminine": [.5, .55, .6, .6], "f1": [.5, .6, .65, .6]},
                             probe="coref", task="gap", split="test", model=model))
    return frames, acc


def _store(tmp_path, seed: int = 0):
    """A store with a syntax run (UPOS) and a coref run of model "m"; the heads' accuracies."""
    store = ResultsStore(tmp_path / "runs")
    frames, acc = _rows("m", seed)
    with store.start_run("probe", {"probe": "syntax"}, name="syntax-test") as run:
        run.add(layer_rows({"accuracy": [.8, .9, .85, .8]}, probe="syntax", task="upos", split="dev", model="m"))
    with store.start_run("probe", {"probe": "coref"}, name="coref-test") as run:
        for f in frames:
            run.add(f)
    return store, acc


@pytest.mark.slow
def test_coref_page_heatmap_and_best_heads(tmp_path, monkeypatch):
    store, acc = _store(tmp_path)
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    rows = store.query(probe="coref")
    assert np.allclose(head_matrix(rows, "m", "heads_all").to_numpy(), acc)
    best = best_heads(rows)
    assert best["head"].tolist() == acc.argmax(1).tolist()
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "probe-coref"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    shown = at.container("coref-best-heads").dataframe[0].value
    assert shown["value"].tolist() == pytest.approx(acc.max(1).tolist())
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    heat = [s for s in specs if s["data"] and s["data"][0].get("type") == "heatmap"]
    assert len(heat) == 2 and len(specs) == 7  # pair AUC, GAP F1, best head, depth, 2 heatmaps, F1 by gender
    # where in depth, with the same model's syntax run: UPOS peaks at 1 (E = 1), pair AUC deltas
    # +.1 (l=1), +.1 (l=2) -> E = 1.5; GAP F1 +.1, +.05 -> E = (0.1 + 0.1) / 0.15
    depth = at.container("coref-depth-table").dataframe[0].value
    expected = depth[depth["metric"] == "expected_layer"].set_index("task")["value"]
    assert expected.to_dict() == pytest.approx({"upos": 1.0, "gum-pairs": 1.5, "gap": 0.2 / 0.15})


@pytest.mark.slow
def test_coref_page_reads_the_syntax_run_through_the_cached_query(tmp_path, monkeypatch):
    """The same model's syntax run is read by `app.data.query` once (reruns hit the cache), and a
    damaged one becomes a warning naming it, not an error."""
    from app import data

    store, _ = _store(tmp_path, seed=1)
    syntax_id = store.runs(probe="syntax")["run_id"].item()
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    calls = []
    real = data.query
    monkeypatch.setattr(data, "query", lambda s, runs, **kw: calls.append(list(runs["run_id"])) or real(s, runs, **kw))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "probe-coref"
    at.run()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert calls.count([syntax_id]) == 1
    assert "upos" in set(at.container("coref-depth-table").dataframe[0].value["task"])
    (store.results_dir / syntax_id / "rows.parquet").unlink()
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert any(syntax_id in w.value and "damaged" in w.value for w in at.warning)

