"""The extraction page (app/page_modules/extraction.py), its figures (experiments/figures/extraction_*.yaml) and
the model explorer's generation tab, on a store holding a real extraction run of a tiny GPT trained
with canaries under the runs root: the page and the figures draw exactly the stored numbers; the
explorer's continuation is `workbench.running.generate`'s; an encoder gets one line saying why it cannot generate."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from app.figures import render
from app.page_modules import extraction as page
from probes.core import runner
from tests.conftest import tiny_bert
from tests.test_app import APP, charts, no_errors, shown_table
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore, decode_extra

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def extraction_store(tmp_path_factory, tokenizers):
    """A runs root: a tiny GPT trained 120 steps with canaries (16 and 64 copies, 2 unseen), every task
    of the extraction probe on its last two saved steps; and a tiny BERT (an encoder) checkpoint."""
    import os

    from tests.training_helpers import run_tiny_training

    root = tmp_path_factory.mktemp("extraction-app") / "runs"
    old = os.environ.get("BERTOLOGY_RUNS")
    os.environ["BERTOLOGY_RUNS"] = str(root)
    try:
        run = run_tiny_training("gpt", 120, root / "train" / "canary-gpt" / "seed-0",
                                **{"corpus.sources": ["inaugural"], "corpus.max_documents": 6, "max_len": 48,
                                   "checkpoints": {"log_spaced": False, "every": 60},
                                   "corpus.canaries": {"repetitions": [16, 64], "unseen": 2, "digits": 3}})
        steps = [run.checkpoint.parent / "step-0000060", run.checkpoint]
        runner.run_probe("extraction", steps, {
            "n_samples": 12, "top_n": 4, "max_new_tokens": 24, "verbatim_tokens": 8, "prefix_tokens": 8,
            "suffix_tokens": 16, "n_passages": 6, "n_boot": 20, "progress": False}, store=ResultsStore(root))
    finally:
        if old is None:
            os.environ.pop("BERTOLOGY_RUNS")
        else:
            os.environ["BERTOLOGY_RUNS"] = old
    bert = root / "train" / "bert" / "seed-0" / "step-0000001"
    tiny_bert(tokenizers["bert"]).save_pretrained(bert)
    tokenizers["bert"].save_pretrained(bert)
    (bert / "manifest.json").write_text(json.dumps({"family": "bert", "step": 1, "seed": 0}))
    return root, run.checkpoint, bert


def _rows(root) -> pd.DataFrame:
    store = ResultsStore(root)
    return store.read(store.runs()["run_id"].iloc[-1])


def test_plots_draw_the_stored_numbers(extraction_store):
    root, _, _ = extraction_store
    rows = _rows(root)
    exp = rows[rows["metric"] == "exposure"]
    drawn = page.exposure_vs_repetitions(rows, "t", {}).data
    for (step, rep), g in exp.groupby([exp["step"], [decode_extra(e)["repetitions"] for e in exp["extra"]]]):
        got = drawn[(drawn["step"] == step) & (drawn["task"] == f"exposure, repetitions {rep}")]
        assert got["model"].tolist() == [g["model"].iloc[0]]
        assert got["value"].iloc[0] == pytest.approx(g["value"].mean())
        assert (got["ci_low"].iloc[0], got["ci_high"].iloc[0]) == pytest.approx((g["value"].min(), g["value"].max()))
    prec = page.precision_per_ranking(rows, "t", {}).data
    last = rows[(rows["task"] == "samples") & (rows["step"] == rows["step"].max())]
    want = last[last["metric"].str.startswith("precision_")]
    want = want.assign(task=[f"samples, prompts {x}" for x in want["split"]]).set_index(["task", "metric"])["value"]
    assert prec.set_index(["task", "metric"])["value"].sort_index().tolist() == pytest.approx(want.sort_index().tolist())
    assert set(prec["task"]) == {f"samples, prompts {x}" for x in ("empty", "train", "heldout", "heldout_text")}
    ke = page.extractable_vs_repetitions(rows, "t", {}).data
    assert sorted(ke["value"]) == pytest.approx(sorted(rows[rows["task"] == "k_extraction"]["value"]))


def test_figures_render_from_the_store(extraction_store, tmp_path, monkeypatch):
    root, _, _ = extraction_store
    monkeypatch.setenv("BERTOLOGY_RUNS", str(root))
    for name in ("extraction_exposure", "extraction_precision", "extraction_k_extractable"):
        spec = REPO_ROOT / "experiments" / "figures" / f"{name}.yaml"
        out = render(spec, ResultsStore(root), tmp_path / name, formats=("html",))
        data = pd.read_csv(out.folder / "data.csv")
        assert len(data) > 0 and np.isfinite(data["value"]).all(), name


def test_page_shows_every_task(extraction_store, monkeypatch):
    root, _, _ = extraction_store
    monkeypatch.setenv("BERTOLOGY_RUNS", str(root))
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["page"] = "probe-extraction"
    at.run()
    no_errors(at)
    titles = [c["layout"]["title"]["text"] for c in charts(at)]
    assert any("exposure" in t.lower() for t in titles) and any("precision" in t.lower() for t in titles)
    shown = shown_table(at, "extraction-exposure-table")
    rows = _rows(root)
    assert sorted(shown["value"].round(6)) == sorted(
        page.exposure_vs_repetitions(rows, "t", {}).data["value"].round(6))


def test_explorer_generates_and_refuses_an_encoder(extraction_store, monkeypatch, tmp_path):
    from workbench.running.generate import Sampling, generate
    from workbench.running.models import ModelHandle

    root, gpt, bert = extraction_store
    monkeypatch.setenv("BERTOLOGY_RUNS", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["page"] = "explorer"
    at.run()
    at.selectbox(key="ex-local").set_value(str(gpt.relative_to(root))).run()
    no_errors(at)
    at.text_input(key="ex-gen-prompt").set_value("my number is").run()
    at.selectbox(key="ex-gen-strategy").set_value("sample").run()
    no_errors(at)
    shown = shown_table(at, "ex-gen-table")
    want = generate(ModelHandle.load(gpt), ["my number is"] * 3, Sampling("sample", 1.0, 40, None, 30, 0))
    assert shown["continuation"].tolist() == want.texts
    at.selectbox(key="ex-local").set_value(str(bert.relative_to(root))).run()
    no_errors(at)
    assert any("cannot generate" in i.value for i in at.info)
