"""The cloze page (app/page_modules/cloze.py) and its figure (experiments/figures/cloze_zero_shot_families.yaml)
on a store holding real cloze runs of two tiny saved checkpoints (a BERT and a GPT-2, random
weights): the table, layer curves, learning curves and the live box show the stored numbers, and
the figure draws exactly them with chance marked."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app.figures import render
from app.page_modules import cloze as page
from probes import cloze
from probes.core import runner
from tests.test_app import charts
from tests.conftest import tiny_bert, tiny_gpt2
from workbench.running import logit_lens
from workbench.running.lm_scores import lm_scorer
from workbench.running.models import ModelHandle
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore

APP = str(REPO_ROOT / "app" / "streamlit_app.py")
TASKS = ("age", "objects")


@pytest.fixture(scope="module")
def cloze_store(tmp_path_factory, tokenizers):
    """Runs `cloze-bert-test` (zero-shot, lens, blank probe, a 2-size learning curve) and
    `cloze-gpt-test` (zero-shot, lens) on checkpoints saved under the runs root."""
    root = tmp_path_factory.mktemp("cloze-app") / "runs"
    store = ResultsStore(root)
    paths = {}
    for family, build in (("bert", tiny_bert), ("gpt", tiny_gpt2)):
        folder = root / "train" / f"tiny-{family}" / "seed-0" / "step-0000005"
        build(tokenizers[family], seed=1, hidden=32, layers=2).save_pretrained(folder)
        tokenizers[family].save_pretrained(folder)
        (folder / "manifest.json").write_text(json.dumps({"family": family, "step": 5, "seed": 0}))
        paths[family] = folder
    common = {"tasks": TASKS, "n_train": 40, "n_test": 30, "n_boot": 100, "progress": False,
              "cache_dir": str(root / "cache")}
    runner.run_probe(cloze.PROBE, [paths["bert"]], {**common, "curve_sizes": (10, 20), "curve_seeds": 2,
                                                     "curve_steps": 2, "name": "cloze-bert-test"}, store=store)
    runner.run_probe(cloze.PROBE, [paths["gpt"]], {**common, "probe": False, "baselines": ("majority",),
                                                    "name": "cloze-gpt-test"}, store=store)
    return store, paths


def _stored(store, metric):
    rows = store.query(probe="cloze")
    return rows[(rows["metric"] == metric) & ~rows["model"].str.endswith("(random init)")]


@pytest.mark.slow
def test_zero_shot_figure_draws_the_stored_numbers(cloze_store, tmp_path):
    store, _ = cloze_store
    r = render("cloze_zero_shot_families", store, tmp_path / "fig", formats=("png", "html"))
    assert (r.folder / "cloze_zero_shot_families.png").read_bytes()[:8].startswith(b"\x89PNG")
    assert sorted(r.manifest["run_ids"]) == sorted(store.runs(probe="cloze")["run_id"])
    drawn = pd.read_csv(r.folder / "data.csv")
    zs = _stored(store, "zero_shot_acc")
    got = drawn[drawn["kind"] == "model"].sort_values(["model", "task"])
    want = zs.sort_values(["model", "task"])
    assert len(got) == 4 and got["model"].tolist() == want["model"].tolist()  # 2 models x 2 tasks, no twins
    np.testing.assert_allclose(got["value"], want["value"], atol=1e-9)
    np.testing.assert_allclose(got["ci_low"], want["ci_low"], atol=1e-9)
    chance = drawn[drawn["kind"] == "baseline:chance"]
    assert sorted(chance["task"]) == sorted(TASKS) and np.allclose(chance["value"], 0.5)  # both tasks: 2 choices
    # the figure: one bar trace per model with its CI, the chance markers
    fig = page.zero_shot_families(store.query(probe="cloze"), "t", {}).figure
    bars = [t for t in fig.data if t.type == "bar"]
    assert [t.name.split(":")[0] for t in bars] == ["bert", "gpt"]  # the backend's family order
    assert np.allclose(np.asarray(bars[0].error_y.array) + np.asarray(bars[0].y),
                       want[want["family"] == "bert"].sort_values("task")["ci_high"])


def test_results_table_vs_chance_by_hand():
    from probes.core.rows import layer_rows

    frames = [layer_rows({"zero_shot_acc": [v], "random_acc": [0.5], "nonsense_acc": [0.5]}, probe="cloze", task=t,
                         split="test", layers=[2], n=100, ci={"zero_shot_acc": ([lo], [hi])}, model=m, family=f)
              for m, f, t, v, lo, hi in (("g/seed-0/step-0000010", "gpt", "age", 0.3, 0.21, 0.39),
                                         ("b", "bert", "age", 0.55, 0.45, 0.65),
                                         ("b", "bert", "objects", 0.7, 0.61, 0.79))]
    rows = pd.concat(frames, ignore_index=True).assign(run_id="r1")
    t = page.results_table(rows)
    assert t[["family", "model", "task", "vs_chance"]].values.tolist() == [
        ["bert", "b", "age", "at"], ["bert", "b", "objects", "above"], ["gpt", "g @10", "age", "below"]]
    # a newer run's row for the same model and task replaces the older one
    newer = frames[1].assign(value=0.9, ci_low=0.85, ci_high=0.95, run_id="r2")
    t2 = page.results_table(pd.concat([rows, newer], ignore_index=True))
    assert t2.loc[(t2["model"] == "b") & (t2["task"] == "age"), "zero_shot"].item() == pytest.approx(0.9)


@pytest.mark.slow
def test_cloze_page_shows_the_stored_values(cloze_store, monkeypatch):
    store, paths = cloze_store
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["page"] = "probe-cloze"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]

    table = at.container("cloze-table").dataframe[0].value
    zs = _stored(store, "zero_shot_acc")
    assert len(table) == 4
    for _, r in zs.iterrows():
        line = table[(table["model"] == page.short_model(r["model"])) & (table["task"] == r["task"])]
        assert line["zero_shot"].item() == pytest.approx(r["value"])
        assert line["zero_shot_ci"].item() == f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}]"
        assert line["random"].item() == pytest.approx(0.5)

    # layer curves: the first model with per-layer rows (BERT), its first task (age)
    layers = at.container("cloze-layer-table").dataframe[0].value
    rows = store.query(probe="cloze")
    bert = rows[(rows["family"] == "bert") & ~rows["model"].str.endswith("(random init)") & (rows["task"] == "age")]
    for metric in ("lens_acc", "probe_acc"):
        want = bert[bert["metric"] == metric].sort_values("layer")["value"].to_numpy()
        got = layers[layers["metric"] == metric].sort_values("layer")["value"].to_numpy()
        assert len(want) == 3 and np.allclose(got, want)
    # the lens' last layer equals the zero-shot accuracy
    assert layers[layers["metric"] == "lens_acc"]["value"].iloc[-1] == pytest.approx(
        bert[bert["metric"] == "zero_shot_acc"]["value"].item())
    # the nonsense-word control through the lens: a line of its own on the curve, the paired gap in the table
    for metric in ("lens_nonsense_acc", "lens_nonsense_gap"):
        want = bert[bert["metric"] == metric].sort_values("layer")
        got = layers[layers["metric"] == metric].sort_values("layer")
        assert len(want) == 3 and np.allclose(got["value"], want["value"]) and np.allclose(got["ci_low"], want["ci_low"])
    assert layers[layers["metric"] == "lens_nonsense_acc"]["value"].iloc[-1] == pytest.approx(
        bert[bert["metric"] == "nonsense_acc"]["value"].item())
    fig = next(c for c in charts(at) if c["layout"].get("title", {}).get("text", "").endswith(", age"))
    line = next(t for t in fig["data"] if t.get("name") == "lens_nonsense_acc (encoder)")
    np.testing.assert_allclose(np.asarray(line["y"], float),
                               bert[bert["metric"] == "lens_nonsense_acc"].sort_values("layer")["value"])
    assert not any(t.get("name", "").startswith("lens_nonsense_gap") for t in fig["data"])

    curves = at.container("cloze-curve-table").dataframe[0].value  # BERT only (twins hidden), both tasks
    curves = curves[curves["task"] == "age"]
    # per fine-tuning seed rows (issue 41); the page shows their mean, population sd and max per size
    per_seed = bert[bert["metric"] == "curve_acc"]
    size = per_seed["extra"].map(lambda e: json.loads(e)["train_size"])
    assert sorted(curves["train_size"]) == [10, 20] and len(per_seed) == 2 * 2
    for n, g in per_seed.groupby(size):
        line = curves[curves["train_size"] == n].iloc[0]
        x = g["value"].to_numpy(dtype=float)
        assert [line["mean"], line["sd"], line["max"], line["seeds"]] == pytest.approx([x.mean(), x.std(), x.max(), 2])
    ws = at.container("cloze-weighted").dataframe[0].value
    ws = ws[ws["task"] == "age"]
    assert ws["weighted_score"].item() == pytest.approx(
        cloze.weighted_score(list(curves["train_size"]), list(curves["mean"])))

    # the live box: the last checkpoint listed (GPT), the default sentence; top-k of the last layer
    live = at.container("cloze-live-table").dataframe[0].value
    scorer = lm_scorer(ModelHandle.load(paths["gpt"]))
    want = logit_lens.blank_topk(scorer, page.to_blank(page.DEFAULT_SENTENCE, None), k=5)
    top = want[want["layer"] == 2].sort_values("rank")
    # tokens as the text they add (byte-level BPE's "Ġthe" shows as "␣the"), not vocabulary strings
    from app.model_views import readable_tokens

    words = readable_tokens(scorer.handle.tokenizer, top["id"].tolist())
    assert live.loc[2].tolist() == [f"{t} ({p:.3f})" for t, p in zip(words, top["prob"])]
    assert not any("Ġ" in cell for cell in live.to_numpy().ravel())

    # a sentence without a blank: one error line, no traceback
    at.text_input(key="cloze-live-text").set_value("no blank here").run()
    assert not at.exception and any("exactly one blank" in e.value for e in at.error)


@pytest.mark.slow
def test_cloze_page_reads_manifests_once_per_change(cloze_store, monkeypatch):
    """The live box's checkpoint list comes from the runs' manifests, read once and again only when
    a manifest changes (cache keyed by run id and mtime), not on every rerun."""
    import os

    import streamlit as st

    from app import data

    store, _ = cloze_store
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    reads = []
    real = data.manifest
    monkeypatch.setattr(data, "manifest", lambda s, run_id: reads.append(run_id) or real(s, run_id))
    st.cache_data.clear()
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["page"] = "probe-cloze"
    at.run()
    ids = store.runs(probe="cloze")["run_id"].tolist()
    assert sorted(reads) == sorted(ids) and len(at.selectbox(key="cloze-live-ckpt").options) == 2
    at.slider(key="cloze-live-k").set_value(3).run()
    assert sorted(reads) == sorted(ids) and not at.exception
    path = store.results_dir / ids[0] / "manifest.json"
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    at.run()
    assert sorted(reads) == sorted(ids + [ids[0]]) and not at.exception

