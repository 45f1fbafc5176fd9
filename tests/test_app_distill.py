"""The distillation page and figures: the accuracy/size table and scatter draw exactly the stored
rows (`workbench.drivers.distill.distill_rows`), the layer map is each student layer's most similar teacher
layer whichever way the model-pair rows are oriented, and the page renders headless (AppTest)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from app.figures import render
from app.page_modules.distill import implied_layer_map, layer_map_plot, tradeoff_plot, tradeoff_table
from probes.core.rows import layer_rows
from workbench.drivers.distill import distill_rows
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore

APP = str(REPO_ROOT / "app" / "streamlit_app.py")
TEACHER = {"test_accuracy": 0.80, "test_n": 100, "dev_accuracy": 0.8, "dev_n": 100, "parameters": 1000,
           "file_bytes": 4000, "latency_ms": 10.0, "depth": 6, "sha256": "x", "path": "/t"}


def _point(depth, init, t, a, accs, params, latency):
    return {"point": {"depth": depth, "init": init, "temperature": t, "alpha": a},
            "seeds": {str(s): {"test_accuracy": v, "dev_accuracy": v, "test_n": 100, "checkpoint": "c", "best_epoch": 1}
                      for s, v in enumerate(accs)},
            "parameters": params, "file_bytes": 4 * params, "latency_ms": latency}


def planted_distill_rows():
    points = {"L3-teacher-T2-a0.5": _point(3, "teacher", 2.0, 0.5, [0.76, 0.78], 600, 5.0),
              "L2-random-Tnone-a0": _point(2, "random", None, 0.0, [0.60, 0.64], 500, 3.5)}
    return pd.DataFrame(distill_rows(points, TEACHER, "teacher", "bert", "sentence_polarity"))


def _store(tmp_path, cka_rows=None):
    store = ResultsStore(tmp_path / "runs")
    with store.start_run("distill", {"k": 1}, name="d") as run:
        run.add(planted_distill_rows())
    if cka_rows is not None:
        with store.start_run("probe", {"probe": "align"}, name="a") as run:
            for f in cka_rows:
                run.add(f)
    return store


def test_tradeoff_table_and_plot_are_the_rows():
    rows = planted_distill_rows()
    table = tradeoff_table(rows).set_index("model")
    s = table.loc["teacher/distill/L3-teacher-T2-a0.5"]
    assert s["accuracy"] == pytest.approx(0.77) and s["kept_pct"] == pytest.approx(100 * 0.77 / 0.80)
    assert (s["accuracy_min"], s["accuracy_max"], s["seeds"]) == (0.76, 0.78, 2) and s["parameters"] == 600
    assert table.loc["teacher", "kept_pct"] == 100.0 and table.loc["teacher", "latency_ms"] == 10.0
    drawn = tradeoff_plot(rows, "t", {"x": "latency_ms"})
    xs = sorted(x for tr in drawn.figure.data for x in tr.x)
    assert xs == [3.5, 5.0, 10.0]


def _cka_frames(M, a, b):
    return [layer_rows({"cka": [M[i, j]]}, probe="align", task="model-pair", split="all", layers=[i], model=a,
                       extra={"other_model": b, "other_layer": j}) for i in range(M.shape[0]) for j in range(M.shape[1])]


def test_layer_map_is_the_row_argmax_in_either_orientation():
    M = np.array([[0.9, 0.5, 0.2, 0.1], [0.3, 0.4, 0.8, 0.6]])  # student 2 layers x teacher 4 layers
    want = [0, 2]
    for frames in (_cka_frames(M, "student", "teacher"), _cka_frames(M.T, "teacher", "student")):
        rows = pd.concat(frames, ignore_index=True)
        drawn = layer_map_plot(rows, "CKA", {"metric": "cka"})
        assert np.allclose(np.array(drawn.figure.data[0].z, dtype=float), M)
        implied = drawn.data[drawn.data["implied"]].sort_values("student_layer")
        assert implied["teacher_layer"].tolist() == want
    assert implied_layer_map(pd.DataFrame(M)).tolist() == want


def test_shipped_distill_figures_render(tmp_path):
    M = np.array([[0.9, 0.5, 0.2], [0.3, 0.4, 0.8]])
    store = _store(tmp_path, _cka_frames(M, "student", "teacher"))
    for name in ("distill_tradeoff", "distill_latency", "distill_layer_map"):
        r = render(name, store, tmp_path / name, formats=("html",))
        assert json.loads((r.folder / "manifest.json").read_text())["n_points"] > 0


def _render_page(store, monkeypatch):
    """The distillation page run headless (AppTest) on `store`: the app and its plotly specs."""
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "distill"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    return at, [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


@pytest.mark.slow
def test_distill_page_renders_headless(tmp_path, monkeypatch):
    M = np.array([[0.9, 0.5, 0.2], [0.3, 0.4, 0.8]])
    store = _store(tmp_path, _cka_frames(M, "student", "teacher"))
    at, specs = _render_page(store, monkeypatch)
    assert len(specs) == 4  # accuracy vs parameters, vs latency, vs temperature, the CKA heatmap
    assert any(s["layout"]["xaxis"].get("title", {}).get("text") == "temperature T" for s in specs)
    assert any("0 -> 0, 1 -> 2" in c.value for c in at.caption)


def _pretraining_rows():
    """Rows as `workbench.drivers.distill_pretraining` writes them: the teacher once, each student per seed."""
    common = {"family": "deberta", "probe": "distill", "task": "mlm", "split": "heldout", "metric": "heldout_mlm_loss"}
    rows = [{**common, "model": "teacher", "value": 4.8, "extra": {"role": "teacher", "depth": 4, "parameters": 5000}}]
    for init, losses in (("teacher", [5.1, 5.3]), ("random", [7.7, 7.9])):
        for seed, loss in enumerate(losses):
            rows.append({**common, "model": f"student-L2-{init}", "seed": seed, "step": 12, "value": loss,
                         "extra": {"role": "student", "depth": 2, "init": init, "parameters": 3000}})
    return pd.DataFrame(rows)


def test_pretraining_table_and_plot_are_the_rows(tmp_path):
    from app.page_modules.distill import pretraining_plot, pretraining_table

    rows = _pretraining_rows()
    table = pretraining_table(rows).set_index("model")
    assert table.loc["student-L2-teacher", "loss"] == pytest.approx(5.2)
    assert (table.loc["student-L2-teacher", "loss_min"], table.loc["student-L2-teacher", "loss_max"]) == (5.1, 5.3)
    assert table.loc["student-L2-random", "gap_to_teacher"] == pytest.approx(7.8 - 4.8)
    assert table.loc["teacher", "gap_to_teacher"] == 0.0 and table.loc["student-L2-random", "seeds"] == 2
    drawn = pretraining_plot(rows, "t", {})
    assert sorted(y for tr in drawn.figure.data for y in tr.y) == pytest.approx([4.8, 5.2, 7.8])
    store = ResultsStore(tmp_path / "runs")
    with store.start_run("distill", {"k": 2}, name="p") as run:
        run.add(rows)
    r = render("distill_pretraining_loss", store, tmp_path / "fig", formats=("html",))
    assert json.loads((r.folder / "manifest.json").read_text())["n_points"] == 3


@pytest.mark.slow
def test_distill_page_shows_pretraining_students_headless(tmp_path, monkeypatch):
    store = ResultsStore(tmp_path / "runs")
    with store.start_run("distill", {"k": 2}, name="p") as run:
        run.add(_pretraining_rows())
    _, specs = _render_page(store, monkeypatch)
    assert len(specs) == 1  # no task rows: only the held-out MLM loss chart
    assert [tr["name"] for tr in specs[0]["data"]] == ["teacher", "students, init teacher", "students, init random"]
    assert specs[0]["layout"]["yaxis"]["title"]["text"] == "held-out masked-LM loss"


def test_temperature_plot_draws_each_alpha_against_t_with_ce_and_teacher_lines():
    points = {"L3-teacher-Tnone-a0": _point(3, "teacher", None, 0.0, [0.70, 0.72], 600, 5.0),
              "L3-teacher-T1-a0.5": _point(3, "teacher", 1.0, 0.5, [0.73, 0.75], 600, 5.0),
              "L3-teacher-T4-a0.5": _point(3, "teacher", 4.0, 0.5, [0.76, 0.78], 600, 5.0),
              "L3-teacher-T4-a0.9": _point(3, "teacher", 4.0, 0.9, [0.79, 0.79], 600, 5.0),
              "L2-random-T1-a0.5": _point(2, "random", 1.0, 0.5, [0.55, 0.57], 500, 3.5)}
    rows = pd.DataFrame(distill_rows(points, TEACHER, "teacher", "bert", "sentence_polarity"))
    from app.page_modules.distill import temperature_plot

    drawn = temperature_plot(rows, "t", {"depth": 3, "init": "teacher"})
    lines = {tr.name: (list(tr.x), [round(y, 4) for y in tr.y]) for tr in drawn.figure.data}
    assert lines == {"alpha 0.5": ([1.0, 4.0], [0.74, 0.77]), "alpha 0.9": ([4.0], [0.79])}
    hlines = sorted(round(shape.y0, 4) for shape in drawn.figure.layout.shapes)
    assert hlines == [0.71, 0.80]  # plain CE (alpha 0) and the teacher
    assert set(drawn.data["depth"]) == {3}  # the 2-layer random student is another panel's
    with pytest.raises(Exception, match="no alpha > 0 points"):
        temperature_plot(rows, "t", {"depth": 2, "init": "teacher"})
