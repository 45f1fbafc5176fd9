"""The Streamlit app, headless (AppTest): every page on a store of real syntax-probe rows (the
`probe_store` fixture, copied so pages may delete and damage runs), on an empty store and on
damaged and older-schema runs; the values shown are checked against the store's rows."""

from __future__ import annotations

import base64
import json
import shutil
import types

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from streamlit.testing.v1 import AppTest

from app import data, model_views
from tests.conftest import tiny_bert, tiny_gpt2
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore

APP = str(REPO_ROOT / "app" / "streamlit_app.py")
TINY = "train/tiny/seed-0/step-0000001"


def copy_store(src: ResultsStore, root) -> ResultsStore:
    """A private copy of a store (results + catalog), so a test may delete or damage runs."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src.results_dir, root / "results", ignore=shutil.ignore_patterns(".writers"))
    return ResultsStore(root)


@pytest.fixture
def app_env(probe_store, tokenizers, tmp_path, monkeypatch):
    """A runs root holding a copy of the probe store and a tiny BERT checkpoint; an empty HF cache."""
    store = copy_store(probe_store, tmp_path / "runs")
    folder = store.root / TINY
    tiny_bert(tokenizers["bert"], seed=1).save_pretrained(folder)
    tokenizers["bert"].save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps({"family": "bert", "step": 1, "seed": 0}))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(store.root))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    return store


def open_page(url: str) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = url
    return at.run()


def no_errors(at: AppTest) -> None:
    assert not at.exception, [e.message for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def shown_table(at: AppTest, key: str) -> pd.DataFrame:
    """The dataframe the app shows in the container keyed `key` (app.ui.table)."""
    return at.container(key).dataframe[0].value


def charts(at: AppTest) -> list[dict]:
    """The plotly figures on the page, typed arrays (plotly's {"dtype", "bdata"}) decoded."""
    def decode(obj):
        if isinstance(obj, dict) and "bdata" in obj and "dtype" in obj:
            arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=obj["dtype"])
            shape = obj.get("shape")
            return arr.reshape([int(n) for n in str(shape).split(",")]) if shape else arr
        if isinstance(obj, dict):
            return {k: decode(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [decode(v) for v in obj]
        return obj

    return [decode(json.loads(c.proto.spec)) for c in at.get("plotly_chart")]


def test_navigation_has_a_page_per_registered_probe(app_env):
    from app import page_modules
    from probes import probe_names

    found = dict(page_modules.probe_pages())
    assert list(found) == probe_names()
    assert found["syntax"] is not None and hasattr(found["syntax"], "render")
    at = open_page("runs")
    no_errors(at)
    for name in probe_names():  # each probe page opens (companion or generic)
        at = open_page(f"probe-{name}")
        no_errors(at)
        if found[name] is None:  # the generic page
            assert at.header[0].value == f"Probe: {name}"


def test_runs_page_catalog_filters_and_manifest(app_env):
    store = app_env
    at = open_page("runs")
    no_errors(at)
    table = shown_table(at, "runs-table")
    runs = store.runs()
    assert table["run_id"].tolist() == runs["run_id"].tolist()
    assert table["n_rows"].tolist() == [174, 60] == runs["n_rows"].tolist()
    assert set(table["health"]) == {"ok"}
    # the newest run's manifest: checkpoints with their hashes, data files with checksums
    m = store.manifest(runs["run_id"].iloc[-1])
    ck = shown_table(at, "manifest-checkpoints")
    assert ck["sha256"].tolist() == [c["sha256"] for c in m["checkpoints"]]
    files = shown_table(at, "manifest-data")
    assert files["sha256"].tolist() == [f["sha256"] for f in m["data_files"]]
    # filter by step: only the run over training steps holds step 0
    at.multiselect(key="runs-filter-step").set_value(["0"]).run()
    no_errors(at)
    assert shown_table(at, "runs-table")["name"].tolist() == ["over-steps"]
    at.multiselect(key="runs-filter-step").set_value([]).run()
    at.multiselect(key="runs-filter-task").set_value(["deprel"]).run()
    assert shown_table(at, "runs-table")["name"].tolist() == ["over-steps"]


def test_runs_page_opens_the_run_its_link_names(app_env):
    """`runs?run=RUN_ID` (the Reproductions page's per-row links) opens that run's manifest, not the
    newest; an unknown id warns and falls back to the newest."""
    store = app_env
    runs = store.runs()["run_id"].tolist()
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "runs"
    at.query_params["run"] = runs[0]
    at.run()
    no_errors(at)
    assert at.selectbox(key="runs-manifest-run").value == runs[0] != runs[-1]
    m = store.manifest(runs[0])
    assert shown_table(at, "manifest-checkpoints")["sha256"].tolist() == [c["sha256"] for c in m["checkpoints"]]
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "runs"
    at.query_params["run"] = "20990101T000000.000000Z-nosuchrun"
    at.run()
    assert at.selectbox(key="runs-manifest-run").value == runs[-1]
    assert any("nosuchrun" in w.value for w in at.warning)


def test_runs_page_compares_two_runs(app_env):
    store = app_env
    a, b = store.runs()["run_id"].tolist()
    at = open_page("runs")
    no_errors(at)
    rows = shown_table(at, "runs-compare-rows")
    ra, rb = store.read(a), store.read(b)
    key = dict(model="tinyrun/seed-0/step-0000010", task="upos", metric="accuracy", split="dev", layer=2)

    def pick(df):
        sel = np.ones(len(df), bool)
        for k, v in key.items():
            sel &= (df[k] == v).fillna(False).to_numpy(bool)
        return df[sel]

    shown = pick(rows)
    assert len(shown) == 1
    assert shown["value_a"].iloc[0] == pytest.approx(pick(ra)["value"].iloc[0])
    assert shown["value_b"].iloc[0] == pytest.approx(pick(rb)["value"].iloc[0])
    assert shown["diff"].iloc[0] == pytest.approx(pick(rb)["value"].iloc[0] - pick(ra)["value"].iloc[0])
    # deprel only in run a: no value for b
    assert rows.loc[rows["task"] == "deprel", "value_b"].isna().all()
    diff = shown_table(at, "runs-compare-config")
    assert set(diff["setting"]) >= {"name", "tasks", "checkpoints"}


def test_runs_page_deletes_only_after_confirmation(app_env):
    store = app_env
    victim = store.runs()["run_id"].iloc[0]
    at = open_page("runs")
    at.selectbox(key="runs-delete-run").set_value(victim).run()
    assert at.button(key="runs-delete-button").disabled  # not without the confirmation
    assert victim in store.runs()["run_id"].tolist()
    at.checkbox(key="runs-delete-confirm").check().run()
    at.button(key="runs-delete-button").click().run()
    no_errors(at)
    assert victim not in store.runs()["run_id"].tolist()
    assert any(victim in s.value for s in at.success)


def test_layer_curves_page_shows_store_rows(app_env):
    store = app_env
    at = open_page("layer-curves")
    no_errors(at)
    assert at.selectbox(key="lc-probe").value == "syntax"
    assert at.selectbox(key="lc-metric").value == "accuracy"
    at.selectbox(key="lc-task").set_value("upos").run()
    no_errors(at)
    shown = shown_table(at, "lc-table")
    ref = store.query(probe="syntax", task="upos", metric="accuracy", split="dev")
    ref = ref.sort_values(["model", "layer"]).reset_index(drop=True)
    assert len(shown) == len(ref) == 18  # 2 runs x (2 or 1 steps) x (model + twin) x 3 layers
    assert shown["value"].round(12).tolist() == ref["value"].round(12).tolist()
    assert shown["ci_low"].round(12).tolist() == ref["ci_low"].round(12).tolist()
    figs = charts(at)
    # the curve chart: one line per model with the stored values, baselines as their own traces
    curves = figs[0]["data"]
    line = next(t for t in curves if t.get("name") == "tinyrun/seed-0/step-0000000" and t.get("mode") == "lines+markers")
    want = ref[ref["model"] == "tinyrun/seed-0/step-0000000"].sort_values("layer")["value"].tolist()
    assert np.allclose(line["y"], want)
    names = {t.get("name") for t in curves}
    assert {"majority", "control"} <= names  # baselines named as their rows declare them (extra.baseline)
    # selectivity (stored rows), scalar-mix weights, and the checkpoints x layers heatmap
    kinds = [[t["type"] for t in f["data"]] for f in figs]
    assert any("bar" in k for k in kinds) and any("heatmap" in k for k in kinds)
    heat = next(f for f in figs if f["data"][0]["type"] == "heatmap")["data"][0]
    rows = ref[~ref["model"].str.endswith("(random init)")]
    table = rows.assign(step=rows["step"].astype(int), layer=rows["layer"].astype(int)).pivot_table(
        index="step", columns="layer", values="value", aggfunc="mean")
    assert np.allclose(np.array(heat["z"], float), table.to_numpy())


def test_layer_curves_aggregates_seeds(app_env):
    """Two more runs that differ only in the training seed folder and values: the mean with the
    min-max band over seeds (app.data.aggregate_seeds, the one aggregation the figures use too)."""
    store = app_env
    base = store.query(probe="syntax", task="deprel", metric="accuracy", split="dev")
    base = base[base["model"] == "tinyrun/seed-0/step-0000010"]
    for seed, shift in ((1, 0.1), (2, -0.04)):
        rows = base.drop(columns="run_id").assign(model=f"tinyrun/seed-{seed}/step-0000010",
                                                  value=base["value"] + shift, seed=seed)
        with store.start_run("probe", {"probe": "syntax", "seed": seed}, name=f"seed-{seed}") as run:
            run.add(rows)
    at = open_page("layer-curves")
    at.selectbox(key="lc-task").set_value("deprel").run()
    at.checkbox(key="lc-aggregate").check().run()
    no_errors(at)
    shown = shown_table(at, "lc-table")
    agg = shown[shown["model"] == "tinyrun/step-0000010"].sort_values("layer")
    v = base.sort_values("layer")["value"].to_numpy()
    trio = np.stack([v, v + 0.1, v - 0.04])
    assert np.allclose(agg["value"], trio.mean(0))
    assert np.allclose(agg["ci_low"], trio.min(0)) and np.allclose(agg["ci_high"], trio.max(0))
    assert agg["n_seeds"].tolist() == [3, 3, 3]


def test_syntax_page_best_layers_and_depth(app_env):
    store = app_env
    at = open_page("probe-syntax")
    no_errors(at)
    at.selectbox(key="syntax-run").set_value("all runs").run()
    no_errors(at)
    best = shown_table(at, "syntax-best")
    rows = store.query(probe="syntax", split="dev")
    upos = rows[(rows["task"] == "upos") & (rows["metric"] == "accuracy")]
    for model, g in upos.groupby("model"):
        got = best[(best["model"] == model) & (best["task"] == "upos")]
        assert got["value"].iloc[0] == pytest.approx(g["value"].max())
    depth = shown_table(at, "syntax-depth-table")
    assert {"expected_layer", "centre_of_gravity"} <= set(depth["metric"])
    assert len(charts(at)) == 3  # curves, depth summary, training-time heatmap


def test_generic_probe_page_draws_any_probe(app_env, monkeypatch):
    """A probe without a companion module: per-layer curves and its rows without a layer."""
    import probes

    store = app_env
    monkeypatch.setattr(probes, "_RUNTIME", dict(probes._RUNTIME))  # restored after the test
    probes.register(types.SimpleNamespace(name="toyprobe", description="test probe"))
    layer_rows = [{"model": "m", "probe": "toyprobe", "task": "bli", "split": "test", "stack": "encoder",
                   "layer": layer, "metric": "p_at_1", "value": 0.1 * layer} for layer in range(4)]
    flat = [{"model": "m", "probe": "toyprobe", "task": "bli", "split": "test", "metric": "cka_matrix_mean",
             "value": 0.42}]
    with store.start_run("probe", {"probe": "toyprobe"}, name="toy") as run:
        run.add(layer_rows + flat)
    at = open_page("probe-toyprobe")
    no_errors(at)
    assert at.header[0].value == "Probe: toyprobe"
    shown = shown_table(at, "probe-toyprobe-bli-table")
    assert shown["value"].round(6).tolist() == [0.0, 0.1, 0.2, 0.3]
    table = shown_table(at, "probe-toyprobe-flat")
    assert table["value"].tolist() == [0.42]


def test_explorer_attention_vectors_and_logit_lens(app_env):
    at = open_page("explorer")
    no_errors(at)
    assert at.selectbox(key="ex-local").value == TINY
    at.text_input(key="ex-sentence").set_value("the cat sat on the mat").run()
    no_errors(at)
    figs = charts(at)
    att = figs[0]["data"]
    assert len(att) == 2  # two heads of layer 1
    z = np.array(att[0]["z"], float)
    assert z.shape[0] == z.shape[1] and np.allclose(z.sum(1), 1.0, atol=1e-5)  # softmax rows
    lens = shown_table(at, "ex-lens-table")
    assert len(lens) == 3 and list(lens.columns) == [1, 2, 3, 4, 5]  # embeddings + 2 layers, top 5


def test_model_views_against_reference(app_env, tokenizers):
    handle = model_views.load(app_env.root / TINY)
    words = "the cat sat on the mat".split()
    att = model_views.attention(handle, words)
    enc = handle.tokenizer(" ".join(words), return_tensors="pt")
    with torch.no_grad():
        ref = handle.model(**enc, output_attentions=True)
    assert att.tokens == model_views.readable_tokens(handle.tokenizer, enc["input_ids"][0].tolist())
    assert np.allclose(att.maps, torch.stack([a[0] for a in ref.attentions]).numpy(), atol=1e-6)
    # the lens' last layer is the model's own prediction at the mask
    lens = model_views.logit_lens(handle, words, 1, k=3)
    masked = handle.tokenizer(" ".join(["the", handle.tokenizer.mask_token] + words[2:]), return_tensors="pt")
    with torch.no_grad():
        logits = handle.model(**masked).logits[0, 2]
    top = torch.topk(torch.softmax(logits, -1), 3)
    last = lens[lens["layer"] == 2].sort_values("rank")
    assert last["piece"].tolist() == handle.tokenizer.convert_ids_to_tokens(top.indices)
    assert last["token"].tolist() == model_views.readable_tokens(handle.tokenizer, top.indices.tolist())
    assert np.allclose(last["prob"], top.values.numpy(), atol=1e-5)
    # word vectors: cosine to the layer below, from first-subword states
    view = model_views.layer_view(handle, words)
    states = next(iter(handle.word_states([words])))
    a, b = states[2, 1], states[1, 1]
    assert view.to_previous.loc["cat", "2"] == pytest.approx(a @ b / np.linalg.norm(a) / np.linalg.norm(b), rel=1e-5)
    assert np.allclose(np.diag(view.across_layers), 1.0, atol=1e-5)


def test_logit_lens_of_a_causal_lm(tokenizers):
    from workbench.running.models import ModelHandle

    model = tiny_gpt2(tokenizers["gpt"])
    handle = ModelHandle(model, tokenizers["gpt"])
    words = "the cat sat on".split()
    lens = model_views.logit_lens(handle, words, 3, k=2)
    # the words before it behind the start token (as the cloze probe scores a causal LM)
    ids = [tokenizers["gpt"].eos_token_id] + tokenizers["gpt"](" ".join(words[:3]))["input_ids"]
    with torch.no_grad():
        p = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, -1], -1)
    last = lens[lens["layer"] == 2].sort_values("rank")
    assert np.allclose(last["prob"], torch.topk(p, 2).values.numpy(), atol=1e-5)


def test_every_page_on_an_empty_store(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    for url in ("runs", "layer-curves"):
        at = open_page(url)
        no_errors(at)
        assert "No runs yet" in at.info[0].value or "No probe rows yet" in at.info[0].value
        assert "bertology run experiments/main.yaml" in at.info[0].value
    for url in ("probe-syntax", "probe-align"):  # each probe page names its own command
        at = open_page(url)
        no_errors(at)
        assert f"bertology probe {url.removeprefix('probe-')}" in at.info[0].value
    at = open_page("explorer")
    no_errors(at)
    assert "No checkpoints under the runs root" in at.info[0].value and "bertology train" in at.info[0].value


def damage(store: ResultsStore) -> dict[str, str]:
    """Four broken runs: rows deleted, rows corrupt, manifest deleted, and an older schema."""
    ids = {}
    for what in ("no-rows", "corrupt", "no-manifest", "old-schema"):
        with store.start_run("probe", {"probe": "syntax"}, name=what) as run:
            run.add([{"model": "m", "probe": "syntax", "task": "upos", "split": "dev", "stack": "encoder",
                      "layer": layer, "metric": "accuracy", "value": 0.5 + 0.1 * layer} for layer in range(3)])
        ids[what] = run.run_id
    folder = {k: store.results_dir / v for k, v in ids.items()}
    (folder["no-rows"] / "rows.parquet").unlink()
    (folder["corrupt"] / "rows.parquet").write_bytes(b"PAR1 not really parquet")
    (folder["no-manifest"] / "manifest.json").unlink()
    old = pa.table({"model": ["old"] * 3, "probe": ["syntax"] * 3, "task": ["upos"] * 3, "layer": [0, 1, 2],
                    "metric": ["accuracy"] * 3, "value": [0.2, 0.3, 0.4]})  # schema 0: no split/stack/ci/...
    pq.write_table(old, folder["old-schema"] / "rows.parquet")
    m = json.loads((folder["old-schema"] / "manifest.json").read_text())
    m["schema_version"] = 0
    (folder["old-schema"] / "manifest.json").write_text(json.dumps(m))
    return ids


def test_damaged_and_older_runs_give_messages_not_tracebacks(app_env):
    store = app_env
    ids = damage(store)
    at = open_page("runs")
    no_errors(at)
    table = shown_table(at, "runs-table").set_index("run_id")["health"]
    assert table[ids["no-rows"]] == "damaged: no rows.parquet"
    assert table[ids["no-manifest"]] == "damaged: no manifest.json"
    at.selectbox(key="runs-manifest-run").set_value(ids["no-manifest"]).run()
    no_errors(at)
    assert any("manifest" in w.value and ids["no-manifest"] in w.value for w in at.warning)

    for url in ("layer-curves", "probe-syntax"):
        at = open_page(url)
        if url == "probe-syntax":
            at.selectbox(key="syntax-run").set_value("all runs").run()
        else:
            at.selectbox(key="lc-task").set_value("upos").run()
        no_errors(at)
        warnings = " ".join(w.value for w in at.warning)
        assert ids["no-rows"] in warnings and ids["no-manifest"] in warnings
        assert ids["corrupt"] in warnings and "cannot be read" in warnings
        assert ids["old-schema"] in warnings and "older rows schema" in warnings

    at = open_page("layer-curves")
    at.selectbox(key="lc-task").set_value("upos").run()
    shown = shown_table(at, "lc-table")
    assert "old" not in set(shown["model"])  # no split: not on the dev curves, but readable:
    loaded = data.read_run(store, ids["old-schema"])
    assert loaded.rows["value"].tolist() == [0.2, 0.3, 0.4] and loaded.rows["split"].isna().all()


def test_paths_outside_the_runs_root_and_hf_cache_are_refused(tmp_path, monkeypatch):
    runs, hf, outside = tmp_path / "runs", tmp_path / "hf", tmp_path / "elsewhere"
    for d in (runs / "train" / "x", hf / "models--a--b", outside):
        d.mkdir(parents=True)
    (runs / "escape").symlink_to(outside)
    monkeypatch.setenv("HF_HUB_CACHE", str(hf))
    roots = data.allowed_roots(runs)
    assert data.confine("train/x", roots) == (runs / "train" / "x").resolve()
    assert data.confine(str(runs / "train" / "x"), roots) == (runs / "train" / "x").resolve()
    assert data.confine(str(hf / "models--a--b"), roots) == (hf / "models--a--b").resolve()
    for bad in ("../elsewhere", str(outside), "/etc/passwd", "escape", "train/../../elsewhere", "~", ""):
        with pytest.raises(data.PathRefused):
            data.confine(bad, roots)


def test_explorer_refuses_a_typed_path_outside(app_env, tmp_path):
    outside = tmp_path / "outside-model"
    outside.mkdir()
    at = open_page("explorer")
    at.radio(key="ex-source").set_value("type a path or Hub name").run()
    at.text_input(key="ex-typed").set_value(str(outside)).run()
    assert not at.exception
    assert len(at.error) == 1 and "refused" in at.error[0].value and str(outside) in at.error[0].value
    at.text_input(key="ex-typed").set_value("../../etc").run()
    assert len(at.error) == 1 and "refused" in at.error[0].value
