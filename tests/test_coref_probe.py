"""The coreference probe: a planted layer that encodes chain identity gives the peak pair AUC there;
metrics against sklearn and the GAP scorer; one end-to-end run of every task on a tiny BERT."""

import json

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from probes.coref import (CorefSettings, format_summary, SpanView, auc, gap_scores_ci, mention_pairs, pair_probe, sample_anaphors,
                          _subset)
from probes.coref_items import DocMention, Document
from probes.gap_scorer import pronoun_gender, read_submission, score_gap
from workbench.data.gap import read_gap


def _synthetic(n_docs: int, seed: int, layers: int = 4, hidden: int = 16, planted: int = 2):
    """Documents of 6 chains x 4 mentions (2-word spans, shuffled order) and word vectors [L, N, H]:
    at layer `planted` every word of a mention carries its chain's random vector (+ noise), other
    layers are noise."""
    rng = np.random.default_rng(seed)
    docs, planes = [], []
    for d in range(n_docs):
        chains = rng.integers(0, 6, size=24)
        words = [f"w{i}" for i in range(48)]
        ms = [DocMention(2 * i, 2 * i + 1, 2 * i + 1, f"d{d}/{c}", "person", f"w{2*i} w{2*i+1}", f"w{2*i+1}", "nominal", 0)
              for i, c in enumerate(chains)]
        docs.append(Document(f"d{d}", words, [0, 48], ms))
        chain_vec = rng.normal(size=(6, hidden))
        x = rng.normal(size=(layers, 48, hidden))
        for i, c in enumerate(chains):
            x[planted, 2 * i: 2 * i + 2] = chain_vec[c] + 0.3 * rng.normal(size=(2, hidden))
        planes.append(x)
    acts = np.concatenate(planes, axis=1).astype(np.float32)
    offsets = np.arange(n_docs + 1) * 48
    return docs, acts, offsets


def _views(docs, acts, offsets, span):
    st = [offsets[i] + m.start for i, d in enumerate(docs) for m in d.mentions]
    en = [offsets[i] + m.end for i, d in enumerate(docs) for m in d.mentions]
    hd = [offsets[i] + m.head for i, d in enumerate(docs) for m in d.mentions]
    return SpanView(acts, st, en, hd, span)


def test_span_view_means_and_heads():
    acts = np.arange(2 * 6 * 2, dtype=np.float32).reshape(2, 6, 2)
    v = SpanView(acts, [0, 2, 5], [1, 4, 5], [1, 3, 5], "mean+head")
    assert v.shape == (2, 3, 4)
    assert np.allclose(v[1], [[*acts[1, 0:2].mean(0), *acts[1, 1]], [*acts[1, 2:5].mean(0), *acts[1, 3]],
                              [*acts[1, 5], *acts[1, 5]]])
    assert np.allclose(SpanView(acts, [0], [2], [0], "mean")[0], acts[0, 0:3].mean(0, keepdims=True))


@pytest.mark.parametrize("span", ["mean+head", "mean"])
def test_planted_chain_layer_gives_peak_pair_auc(span):
    settings = CorefSettings(k=8, n_boot=50, max_train_pairs=2000, probe_config={"max_iter": 200})
    views, pairs = {}, {}
    for name, n, seed in (("fit", 30, 0), ("stop", 6, 1), ("eval", 10, 2)):
        docs, acts, offsets = _synthetic(n, seed)
        views[name] = _views(docs, acts, offsets, span)
        pairs[name] = mention_pairs(docs, settings.k)
    fit = _subset(pairs["fit"], sample_anaphors(pairs["fit"], settings.max_train_pairs, 0))
    assert 0 < len(fit.label) <= 2000
    res, logits = pair_probe(views["fit"], fit, views["stop"], pairs["stop"], views["eval"], pairs["eval"], settings)
    scores = logits[..., 1] - logits[..., 0]
    aucs = np.array([auc(s, pairs["eval"].label) for s in scores])
    assert int(aucs.argmax()) == 2
    assert aucs[2] > 0.95 and np.delete(aucs, 2).max() < 0.7


def test_auc_matches_sklearn_with_ties_and_weights():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, size=300).astype(float)  # many ties
    y = rng.random(300) < 0.3
    w = rng.integers(0, 4, size=300)
    assert auc(s, y) == pytest.approx(roc_auc_score(y, s))
    assert auc(s, y, w) == pytest.approx(roc_auc_score(y, s, sample_weight=w))


def test_gap_bootstrap_point_equals_the_scorer():
    frame = read_gap("validation")
    rng = np.random.default_rng(1)
    pred = rng.integers(0, 3, size=(2, len(frame)))
    genders = [pronoun_gender(p) for p in frame["pronoun"]]
    got = gap_scores_ci(pred == 0, pred == 1, frame["a_coref"], frame["b_coref"], genders, n_boot=20, seed=0)
    for r in range(2):
        gold = {i: (p, a, b) for i, p, a, b in zip(frame["id"], frame["pronoun"], frame["a_coref"], frame["b_coref"])}
        s = score_gap(gold, {i: (bool(p == 0), bool(p == 1)) for i, p in zip(frame["id"], pred[r])})
        assert got["f1"][0][r] == pytest.approx(s.overall.f1)
        assert got["f1_masculine"][0][r] == pytest.approx(s.masculine.f1)
        assert got["f1_feminine"][0][r] == pytest.approx(s.feminine.f1)
        assert got["bias"][0][r] == pytest.approx(s.bias)
        assert got["f1"][1][r] <= s.overall.f1 <= got["f1"][2][r]


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    from tests.conftest import read_ewt_minimal, tiny_bert
    from workbench.paths import data_path
    from workbench.tokenization import build_tokenizer

    texts = [s.text for s in read_ewt_minimal(data_path("ud", "en_ewt", "en_ewt-ud-train.conllu"))[:3000]]
    tok = build_tokenizer("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], texts, vocab_size=600)
    folder = tmp_path_factory.mktemp("ckpt") / "tiny-bert"
    tiny_bert(tok, seed=0).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_end_to_end_every_task(tiny_checkpoint, tmp_path):
    from probes.runner import run_probe
    from workbench.results import ResultsStore

    settings = {"max_train_documents": 6, "max_eval_documents": 3, "max_gap_examples": 60, "n_boot": 20,
                "max_train_pairs": 3000, "gap_predictions_dir": str(tmp_path / "gap"), "cache_dir": str(tmp_path / "cache"),
                "progress": False, "threads": 1}
    run_id, rows = run_probe("coref", [str(tiny_checkpoint)], settings, store=ResultsStore(tmp_path / "runs"))
    models = set(rows["model"])
    assert models == {"tiny-bert", "tiny-bert (random init)"}
    real = rows[rows["model"] == "tiny-bert"]
    got = set(zip(real["task"], real["metric"]))
    for need in [("gum-pairs", "auc"), ("gum-pairs", "f1"), ("gum-pairs", "antecedent_accuracy"),
                 ("gum-pairs", "control_auc"), ("gum-pairs", "head_match_antecedent_accuracy"),
                 ("gum-pairs", "string_match_f1"), ("gum-pairs", "majority_accuracy"),
                 ("gum-entity-type", "accuracy"), ("gum-entity-type", "selectivity"), ("gum-entity-type", "majority"),
                 ("gap", "f1"), ("gap", "bias"), ("gap", "nearest_name_f1"), ("gap", "subject_name_f1"),
                 ("attention-heads", "heads_all"), ("attention-heads", "best_head_accuracy"),
                 ("attention-heads", "heads_gap"), ("attention-heads", "nearest_mention"),
                 ("gap-cloze", "gender_accuracy")]:
        assert need in got, need
    pairs = real[(real["task"] == "gum-pairs") & (real["metric"] == "auc")]
    assert sorted(pairs["layer"]) == [0, 1, 2] and pairs["ci_low"].le(pairs["value"]).all()
    # where in depth: each headline curve keeps its paired replicates (the CI is their percentile
    # interval), the peak shares sum to 1 and the peak layer row is the curve's argmax
    for task, metric, n_boot in [("gum-pairs", "auc", 4), ("gum-pairs", "antecedent_accuracy", 20),
                                 ("gum-entity-type", "accuracy", 20), ("gap", "f1", 20)]:
        curve = real[(real["task"] == task) & (real["metric"] == metric)].sort_values("layer")
        boot = np.array([json.loads(e)["boot"] for e in curve["extra"]], dtype=float).T
        assert boot.shape == (n_boot, 3)
        np.testing.assert_allclose(curve["ci_low"], np.nanquantile(boot, 0.025, axis=0), atol=1e-5)
        share = real[(real["task"] == task) & (real["metric"] == f"{metric}_peak_share")]
        assert share["value"].sum() == pytest.approx(1.0)
        peak = real[(real["task"] == task) & (real["metric"] == f"{metric}_peak_layer")]
        assert len(peak) == 1 and peak["layer"].isna().all()
        assert peak["value"].iloc[0] == curve["layer"].iloc[int(np.argmax(curve["value"].to_numpy()))]
        assert peak["ci_low"].iloc[0] <= peak["value"].iloc[0] <= peak["ci_high"].iloc[0]
    assert "peak layer" in format_summary(rows)
    # every layer's GAP predictions are a submission file the scorer reads back to the row's F1
    gap_rows = real[(real["task"] == "gap") & (real["metric"] == "f1")].sort_values("layer")
    files = sorted((tmp_path / "gap").rglob("layer-*.tsv"))
    assert len(files) == 2 * 3  # model and twin x layers 0..2
    test = read_gap("test").iloc[:60]
    gold = {i: (p, a, b) for i, p, a, b in zip(test["id"], test["pronoun"], test["a_coref"], test["b_coref"])}
    real_files = [f for f in files if "random" not in str(f)]
    for f, (_, row) in zip(real_files, gap_rows.iterrows()):
        assert score_gap(gold, read_submission(f)).overall.f1 == pytest.approx(row["value"])
    # heads: one row per (layer, head) for each metric; best head per layer names its head
    heads = real[(real["metric"] == "heads_all")]
    assert len(heads) == 2 * 2 and set(heads["extra"].map(lambda e: json.loads(e)["head"])) == {0, 1}
    best = real[real["metric"] == "best_head_accuracy"].sort_values("layer")
    for _, r in best.iterrows():
        per_head = heads[heads["layer"] == r["layer"]]["value"].max()
        assert r["value"] == pytest.approx(per_head)
    assert "best_head_accuracy" in format_summary(rows)
