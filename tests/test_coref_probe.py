"""The coreference probe: a planted layer that encodes chain identity gives the peak pair AUC there;
metrics against sklearn and the GAP scorer; one end-to-end run of every task on a tiny BERT."""

import json

import numpy as np
import pandas as pd
import pytest

from probes.core.statistics import auc, ratio_bootstrap
from probes.coref import (CorefSettings, best_head_rows, choose_heads, format_summary, SpanView, gap_scores_ci,
                          mention_pairs, pair_probe, sample_anaphors, subset_pairs)
from probes.coref.items import DocMention, Document
from probes.coref.gap_scorer import pronoun_gender, read_submission, score_gap
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
    fit = subset_pairs(pairs["fit"], sample_anaphors(pairs["fit"], settings.max_train_pairs, 0))
    assert 0 < len(fit.label) <= 2000
    res, logits = pair_probe(views["fit"], fit, views["stop"], pairs["stop"], views["eval"], pairs["eval"], settings)
    scores = logits[..., 1] - logits[..., 0]
    aucs = np.array([auc(s, pairs["eval"].label) for s in scores])
    assert int(aucs.argmax()) == 2
    assert aucs[2] > 0.95 and np.delete(aucs, 2).max() < 0.7


def _old_ratio_ci(num, den, units, n_boot, seed):
    """The coref probe's own document bootstrap before probes/core/statistics.py, verbatim in substance
    (one multinomial draw of n_boot rows, per-row unit sums, nanquantile): the reference that the
    move to `ratio_bootstrap` kept every non-AUC CI identical."""
    _, inv = np.unique(units, return_inverse=True)
    s = int(inv.max()) + 1
    counts = np.random.default_rng(seed).multinomial(s, np.full(s, 1.0 / s), size=n_boot).astype(np.float64)
    out = []
    for r in range(num.shape[0]):
        pn, pd_ = np.bincount(inv, weights=num[r], minlength=s), np.bincount(inv, weights=den, minlength=s)
        boot = (counts @ pn) / (counts @ pd_)
        out.append((pn.sum() / pd_.sum(), np.nanquantile(boot, 0.025), np.nanquantile(boot, 0.975)))
    return tuple(np.array(v) for v in zip(*out))


def _old_gap_counts(n, n_boot, seed):
    rng = np.random.default_rng(seed)
    return np.vstack([np.ones(n), rng.multinomial(n, np.full(n, 1.0 / n), size=n_boot)])


def test_statistics_move_keeps_the_old_draws():
    """ratio_bootstrap (documents, 300 resamples: more than one 256-block) gives the old ratio_ci's
    numbers exactly, and gap_scores_ci draws the old GAP resamples (its CIs equal a percentile
    interval of the F1 computed on them)."""
    rng = np.random.default_rng(4)
    units = rng.integers(0, 37, size=500)
    num = (rng.random((3, 500)) < [[0.3], [0.5], [0.8]]).astype(float)
    new = ratio_bootstrap(num, None, units, 300, 7)
    old = _old_ratio_ci(num, np.ones(500), units, 300, 7)
    for a, b in zip(new, old):
        np.testing.assert_array_equal(a, b)
    n = 120
    ga, gb = rng.random(n) < 0.4, rng.random(n) < 0.4
    pa, pb = rng.random(n) < 0.5, rng.random(n) < 0.5
    genders = np.where(rng.random(n) < 0.5, "masculine", "feminine")
    got = gap_scores_ci(pa[None], pb[None], ga, gb, genders, n_boot=300, seed=3, return_boot=True)
    counts = _old_gap_counts(n, 300, 3)
    tp = (pa & ga).astype(float) + (pb & gb)
    den = tp * 2 + (pa & ~ga) + (pb & ~gb) + (~pa & ga) + (~pb & gb)
    f1 = (counts @ (2 * tp)) / (counts @ den)
    np.testing.assert_allclose(got["f1"][3][:, 0], f1[1:])
    assert got["f1"][0][0] == pytest.approx(f1[0])
    assert (got["f1"][1][0], got["f1"][2][0]) == pytest.approx((np.quantile(f1[1:], 0.025), np.quantile(f1[1:], 0.975)))


def _RowsUnit():
    """A runner unit with only what `best_head_rows` uses: its `rows` (whole-model rows included)."""
    from types import SimpleNamespace

    from probes.core.runner import Unit

    checkpoint = SimpleNamespace(family="bert", seed=0, step=0)
    return Unit("m", None, checkpoint, "encoder", False, "coref", None, {})


def test_best_head_is_chosen_on_the_selection_split_not_on_the_report_split():
    """Planted: on dev head 2 of layer 1 is right 80% of the time and head 0 60%; on test head 0 is
    right 90%, head 2 70%. The held-out best head of layer 1 is head 2 (dev), reported at its test
    accuracy (~0.70), not the test maximum (~0.90); layer 0 (dev and test agree) picks head 1."""
    rng = np.random.default_rng(0)
    n_dev, n_test, L, H = 400, 500, 2, 3
    dev_p = np.array([[0.2, 0.7, 0.1], [0.6, 0.1, 0.8]])
    test_p = np.array([[0.2, 0.7, 0.1], [0.9, 0.1, 0.7]])
    dev = rng.random((n_dev, L, H)) < dev_p
    test = rng.random((n_test, L, H)) < test_p
    per_layer, overall, acc = choose_heads(dev)
    assert per_layer.tolist() == [1, 2] and overall == (1, 2)
    np.testing.assert_allclose(acc, dev.mean(0))
    units = np.arange(n_test) // 5
    rows = pd.concat(best_head_rows(_RowsUnit(), "best_head_accuracy", dev, test, units,
                                    CorefSettings(n_boot=50), split="test", chosen_on="gum-dev", extra={"evaluated": 1}))
    per = rows[rows["metric"] == "best_head_accuracy"].sort_values("layer")
    assert per["value"].tolist() == pytest.approx([test[:, 0, 1].mean(), test[:, 1, 2].mean()])
    assert per["value"].iloc[1] < test[:, 1].mean(0).max() - 0.1  # the test-best head was not chosen
    extras = [json.loads(e) for e in per["extra"]]
    assert [e["best_head"] for e in extras] == [1, 2] and {e["chosen_on"] for e in extras} == {"gum-dev"}
    assert extras[1]["chosen_value"] == pytest.approx(dev[:, 1, 2].mean())
    top = rows[rows["metric"] == "best_head_accuracy_overall"]
    assert len(top) == 1 and top["layer"].isna().all()
    ex = json.loads(top["extra"].iloc[0])
    assert (ex["best_layer"], ex["best_head"]) == (2, 2)  # layers are numbered 1..L in head rows
    assert top["value"].iloc[0] == pytest.approx(test[:, 1, 2].mean())
    assert top["ci_low"].iloc[0] < top["value"].iloc[0] < top["ci_high"].iloc[0]


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
    from probes.core.runner import run_probe
    from workbench.store.results import ResultsStore

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
    for task, metric, n_boot in [("gum-pairs", "auc", 20), ("gum-pairs", "antecedent_accuracy", 20),
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
    # best heads are chosen on GUM dev and reported on GUM test: the row's value is the chosen
    # head's own per-head row on test (Clark et al.'s criterion: heads_strict; lenient: heads_all)
    criteria = (("best_head_accuracy", "heads_strict"), ("best_head_accuracy_head_word", "heads_head_word"),
                ("best_head_accuracy_lenient", "heads_all"))
    for best_metric, head_metric in criteria:
        best = real[real["metric"] == best_metric].sort_values("layer")
        assert len(best) == 2 and set(best["split"]) == {"test"}
        per_head = real[real["metric"] == head_metric]
        assert set(per_head["split"]) == {"test"}
        for _, r in best.iterrows():
            ex = json.loads(r["extra"])
            assert ex["chosen_on"] == "gum-dev"
            same = per_head[(per_head["layer"] == r["layer"])
                            & (per_head["extra"].map(lambda e: json.loads(e)["head"]) == ex["best_head"])]
            assert r["value"] == pytest.approx(same["value"].item())
    gap_best = real[real["metric"] == "best_head_gap"]
    assert {json.loads(e)["chosen_on"] for e in gap_best["extra"]} == {"gap-validation"}
    summary = format_summary(rows)
    assert "best_head_accuracy" in summary and "chosen on gum-dev" in summary


@pytest.mark.parametrize("eval_split", ["validation", "test"])
def test_gap_never_stops_on_the_split_it_reports(tiny_checkpoint, tmp_path, monkeypatch, eval_split):
    """Issue 49: with gap_eval_split validation the GAP probe early-stopped on validation too, so the
    reported score had chosen its own stopping point. Now it stops on held-out development rows
    (disjoint from the rows it trains on); reporting on test keeps development / validation."""
    from probes.core.runner import run_probe
    from probes.coref import tasks as coref_tasks
    from workbench.store.results import ResultsStore

    features, given = {}, []
    real_features, real_fit = coref_tasks._gap_features, coref_tasks.fitting.fit_probe

    def features_spy(unit, frame, split, settings):
        features[split] = real_features(unit, frame, split, settings)
        return features[split]

    def fit_spy(x, y, x_dev, y_dev, **kw):
        given.append((np.asarray(x), np.asarray(x_dev)))
        return real_fit(x, y, x_dev, y_dev, **kw)

    monkeypatch.setattr(coref_tasks, "_gap_features", features_spy)
    monkeypatch.setattr(coref_tasks.fitting, "fit_probe", fit_spy)
    n = 40
    settings = {"tasks": ["gap"], "baselines": [], "max_gap_examples": n, "n_boot": 10, "gap_eval_split": eval_split,
                "gap_predictions_dir": str(tmp_path / "gap"), "cache_dir": str(tmp_path / "cache"), "progress": False,
                "threads": 1}
    _, rows = run_probe("coref", [str(tiny_checkpoint)], settings, store=ResultsStore(tmp_path / "runs"))

    def row_set(a):  # a split's examples as the bytes of their last-layer feature rows
        return {r.tobytes() for r in a[-1]}

    x_fit, x_stop = given[0]
    fit, stop = row_set(x_fit), row_set(x_stop)
    assert stop and not stop & fit
    assert not stop & row_set(features[eval_split])  # never stopped on what it reports
    extra = json.loads(rows[(rows["task"] == "gap") & (rows["metric"] == "f1")]["extra"].iloc[0])
    if eval_split == "validation":
        assert fit | stop == row_set(features["development"]) and x_stop.shape[1] == 4  # 10% of 40 held out
        assert extra["stop"] == "development-heldout-0.1" and extra["train"] == "development-rest-0.1"
    else:
        assert fit == row_set(features["development"]) and stop == row_set(features["validation"])
        assert extra["stop"] == "validation" and extra["train"] == "development"
