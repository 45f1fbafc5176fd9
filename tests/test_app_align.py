"""The alignment page, headless (AppTest), on a store holding one align run: its P@1 curves, the
i x j matrices of a model pair and the most-moved words show exactly the stored rows."""

from __future__ import annotations

import json

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from app.page_modules.align import matrix_plot, moved_words, pair_matrices
from probes.core.rows import layer_rows
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore

APP = str(REPO_ROOT / "app" / "streamlit_app.py")


def _frames():
    rng = np.random.default_rng(0)
    cka = rng.random((3, 4))
    frames = [layer_rows({"p_at_1": [.1, .3, .2], "p_at_1_rotation": [0, 0, 0]}, probe="align", task="bli",
                         split="test", model="en")]
    for i in range(3):
        for j in range(4):
            frames.append(layer_rows({"cka": [cka[i, j]], "cka_standardized": [1 - cka[i, j]],
                                      "retrieval": [cka[i, j] / 2]}, probe="align",
                                     task="model-pair", split="all", layers=[i], model="en",
                                     extra={"other_model": "other", "other_layer": j}))
    frames.append(layer_rows({"top_dim_variance_share": [.02, .8, .05]}, probe="align", task="model-pair",
                             split="all", model="en"))
    words = [{"word": "miss", "displacement": .3, "noise_floor": .05, "count_old": 14, "count_new": 3}]
    frames.append(layer_rows({"top_moved_excess": [.25]}, probe="align", task="diachronic", split="all", layers=[2],
                             model="en", extra={"top_moved": words}))
    return frames, cka


def _array(z):
    """A plotly JSON array: a list, or numpy bytes as {"dtype", "bdata" (base64), "shape"}."""
    if isinstance(z, dict):
        import base64

        shape = tuple(int(x) for x in str(z.get("shape", "-1")).split(","))
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape).astype(float)
    return np.array(z, dtype=float)


@pytest.mark.slow
def test_align_page_curves_matrices_and_words(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path / "runs")
    frames, cka = _frames()
    with store.start_run("probe", {"probe": "align"}, name="align-test") as run:
        for f in frames:
            run.add(f)
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    rows = store.query(probe="align")
    mats = pair_matrices(rows)
    assert np.allclose(mats[("en", "other", "cka")].to_numpy(), cka)
    assert np.allclose(mats[("en", "other", "retrieval")].to_numpy(), cka / 2)
    assert np.allclose(mats[("en", "other", "cka_standardized")].to_numpy(), 1 - cka)
    assert moved_words(rows)["word"].tolist() == ["miss"]
    drawn = matrix_plot(rows, "CKA", {"metric": "cka"})
    assert np.allclose(np.array(drawn.figure.data[0].z, dtype=float), cka)
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "probe-align"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    heat = [s for s in specs if s["data"] and s["data"][0].get("type") == "heatmap"]
    # bli P@1 and top-dimension-share curves, CKA / standardised CKA / retrieval heatmaps, most-moved words
    assert len(heat) == 3 and len(specs) == 6
    assert np.allclose(_array(heat[1]["data"][0]["z"]), 1 - cka)
    share = [s for s in specs if "top_dim_variance_share" in json.dumps(s.get("layout", {}).get("title", ""))]
    assert len(share) == 1 and np.allclose(_array(share[0]["data"][0]["y"]), [.02, .8, .05])
    bars = [s for s in specs if s["data"] and s["data"][0].get("type") == "bar"]
    assert len(bars) == 1 and any("miss" in str(label) for label in bars[0]["data"][0]["y"])
    assert np.allclose(_array(heat[0]["data"][0]["z"]), cka)
    shown = at.container("align-moved-words").dataframe[0].value
    assert shown["word"].tolist() == ["miss"] and shown["displacement"].tolist() == pytest.approx([.3])


def test_matrix_plot_marks_each_rows_most_similar_layer():
    """`mark_best`: the marked column of every row is that row's maximum (checked against numpy's
    argmax on a planted matrix), and the drawn data flag exactly those cells."""
    import pandas as pd

    rng = np.random.default_rng(1)
    cka = rng.random((3, 5))
    rows = pd.concat([layer_rows({"cka": [cka[i, j]]}, probe="align", task="model-pair", split="all", layers=[i],
                                 model="small", extra={"other_model": "big", "other_layer": j})
                      for i in range(3) for j in range(5)], ignore_index=True)
    drawn = matrix_plot(rows, "CKA", {"metric": "cka", "model": "small", "other": "big", "mark_best": True})
    marks = drawn.figure.data[1]
    assert [int(x) for x in marks.x] == cka.argmax(1).tolist() and [int(y) for y in marks.y] == [0, 1, 2]
    flagged = drawn.data[drawn.data["best"]]
    assert sorted(zip(flagged["i"], flagged["j"])) == list(enumerate(cka.argmax(1).tolist()))
    plain = matrix_plot(rows, "CKA", {"metric": "cka"})
    assert len(plain.figure.data) == 1 and "best" not in plain.data
    flipped = matrix_plot(rows, "CKA", {"metric": "cka", "model": "big", "other": "small", "mark_best": True})
    assert np.allclose(np.array(flipped.figure.data[0].z, dtype=float), cka.T)  # the pair asked the other way round
    assert [int(x) for x in flipped.figure.data[1].x] == cka.T.argmax(1).tolist()
