"""probes/core's fitting, baselines, MDL, scalar mix and rows: planted signals on real UPOS labels,
sklearn reference.

Features are synthetic, labels and word types are real (EWT train/dev): a fake "model" whose layer
K linearly encodes the UPOS tag and whose other layers are pure noise. At noise layers both the
task probe and the control probe can only learn their label priors, so each sits at its own
majority baseline and selectivity is the difference of the two majority rates (close to zero);
at layer K the task is decodable but the per-type control labels are not, so selectivity is high.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probes.core.baselines import control_labels, label_distribution, majority_baseline
from probes.core.fitting import ProbeConfig, fit_probe, sklearn_C
from probes.core.mdl import MDL_FRACTIONS, mdl_online_code
from probes.core.rows import layer_rows
from probes.core.scalar_mix import centre_of_gravity, expected_layer, fit_scalar_mix
from workbench.data.conllu import load_treebank
from workbench.running.models import random_init_twin
from workbench.store.results import RESULT_COLUMNS

K = 2  # planted layer
N_LAYERS = 5  # L+1
H = 32


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _words(split: str, max_words: int):
    """Words, UPOS tags and sentence ids of the first sentences of EWT `split` (whole sentences)."""
    words, tags, sid = [], [], []
    for i, s in enumerate(load_treebank("en_ewt", split)):
        if len(words) >= max_words:
            break
        words += s.words
        tags += s.upos
        sid += [i] * len(s.words)
    return words, tags, np.asarray(sid)


@pytest.fixture(scope="module")
def ewt():
    wtr, ttr, str_ = _words("train", 5000)
    wdv, tdv, sdv = _words("dev", 2500)
    tags = sorted(set(ttr) | set(tdv))
    index = {t: i for i, t in enumerate(tags)}
    return {
        "train": (wtr, np.array([index[t] for t in ttr]), str_),
        "dev": (wdv, np.array([index[t] for t in tdv]), sdv),
        "C": len(tags),
    }


def _planted(y, rng, k=K, strength=1.5, n_layers=N_LAYERS, h=H, seed=0):
    """[n_layers, N, H]: layer k = class embedding + noise, every other layer pure noise."""
    emb = np.random.default_rng(seed).standard_normal((int(y.max()) + 20, h))  # fixed across splits
    x = rng.standard_normal((n_layers, len(y), h)).astype(np.float32)
    x[k] += (strength * emb[y]).astype(np.float32)
    return x


@pytest.fixture(scope="module")
def planted(ewt):
    rng = np.random.default_rng(1)
    return _planted(ewt["train"][1], rng), _planted(ewt["dev"][1], rng)


@pytest.mark.slow
def test_linear_probe_peaks_at_planted_layer_and_control_selectivity(ewt, planted):
    xtr, xdv = planted
    (wtr, ytr, _), (wdv, ydv, _) = ewt["train"], ewt["dev"]
    C = ewt["C"]
    task = fit_probe(xtr, ytr, xdv, ydv, num_classes=C, seed=0)
    assert task.weights["w"].shape == (N_LAYERS, H, C) and task.dev_predictions.shape == (N_LAYERS, len(ydv))
    acc = task.dev_accuracy
    assert int(np.argmax(acc)) == K and acc[K] > 0.9
    np.testing.assert_allclose(task.accuracy(xdv, ydv), acc, atol=1e-6)  # exported weights reproduce it
    _, maj_task = majority_baseline(ytr, ydv)
    noise = [l for l in range(N_LAYERS) if l != K]
    assert np.all(np.abs(acc[noise] - maj_task) < 0.03), (acc, maj_task)

    dist = label_distribution(ytr, C)
    ctr, cdv = control_labels(wtr, dist, seed=0), control_labels(wdv, dist, seed=0)
    control = fit_probe(xtr, ctr, xdv, cdv, num_classes=C, seed=0)
    _, maj_ctrl = majority_baseline(ctr, cdv)
    assert np.all(np.abs(control.dev_accuracy[noise] - maj_ctrl) < 0.03), (control.dev_accuracy, maj_ctrl)
    selectivity = acc - control.dev_accuracy
    assert selectivity[K] > 0.5, selectivity
    # elsewhere: nothing beyond the two label priors
    assert np.all(np.abs(selectivity[noise] - (maj_task - maj_ctrl)) < 0.04), selectivity
    assert np.all(np.abs(selectivity[noise]) < 0.12), selectivity
    assert selectivity[K] - np.abs(selectivity[noise]).max() > 0.4


def test_control_labels_fixed_per_type_and_follow_the_distribution(ewt):
    (wtr, ytr, _), (wdv, _, _) = ewt["train"], ewt["dev"]
    dist = label_distribution(ytr, ewt["C"])
    assert dist.sum() == pytest.approx(1.0) and dist.argmax() == np.bincount(ytr).argmax()
    a = control_labels(wtr + wdv, dist, seed=3)
    b = control_labels(list(reversed(wdv)), dist, seed=3)[::-1]
    np.testing.assert_array_equal(a[len(wtr) :], b)  # same type -> same label, any order/subset
    by_type = {}
    for w, lab in zip(wtr + wdv, a):
        assert by_type.setdefault(w, lab) == lab
    types = sorted(by_type)
    per_type = np.array([by_type[t] for t in types])
    freq = np.bincount(per_type, minlength=len(dist)) / len(per_type)
    assert np.abs(freq - dist).max() < 0.04  # labels drawn per TYPE from the empirical distribution
    other = control_labels(wtr, dist, seed=4)
    assert (other != a[: len(wtr)]).mean() > 0.5


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_linear_probe_matches_sklearn_on_every_layer(ewt, optimizer):
    from sklearn.linear_model import LogisticRegression

    (wtr, ytr, _), (wdv, ydv, _) = ewt["train"], ewt["dev"]
    rng = np.random.default_rng(7)
    emb = rng.standard_normal((ewt["C"], H))
    types = {w: rng.standard_normal(H) for w in sorted(set(wtr) | set(wdv))}
    mix = [(0.0, 0.0), (0.3, 0.0), (0.6, 0.5), (1.0, 0.3), (0.2, 1.0)]  # (tag signal, type signal)

    def feats(words, y):
        t = np.stack([types[w] for w in words])
        return np.stack([a * emb[y] + b * t + rng.standard_normal((len(y), H)) for a, b in mix]).astype(np.float32)

    xtr, xdv = feats(wtr, ytr), feats(wdv, ydv)
    lam = 1e-3
    ours = fit_probe(xtr, ytr, xdv, ydv, num_classes=ewt["C"], l2=lam, optimizer=optimizer,
                     early_stopping=False, standardize=False, batch_size=256)  # fmt: skip
    for layer in range(len(mix)):
        ref = LogisticRegression(C=sklearn_C(lam, len(ytr)), max_iter=3000, tol=1e-6).fit(xtr[layer], ytr)
        ref_acc = (ref.predict(xdv[layer]) == ydv).mean()
        assert abs(ours.dev_accuracy[layer] - ref_acc) <= 0.01, (layer, ours.dev_accuracy[layer], ref_acc)
        if optimizer == "lbfgs":  # same objective, same minimiser: the weights agree too
            p_ref = ref.predict_proba(xdv[layer])
            p_ours = np.exp(ours.log_proba(xdv)[layer])[:, ref.classes_]  # a class absent from train
            p_ours /= p_ours.sum(1, keepdims=True)
            assert np.abs(p_ref - p_ours).mean() < 2e-3


def test_mlp_probe_decodes_a_nonlinear_layer_the_linear_probe_cannot(ewt):
    (_, ytr, _), (_, ydv, _) = ewt["train"], ewt["dev"]
    rng = np.random.default_rng(2)
    emb = 2.5 * rng.standard_normal((ewt["C"], 16))

    def feats(y):
        sign = rng.choice([-1.0, 1.0], size=(len(y), 1))  # class means are zero: no linear signal
        x = rng.standard_normal((2, len(y), 16))
        x[1] += sign * emb[y]
        return x.astype(np.float32)

    xtr, xdv = feats(ytr), feats(ydv)
    _, maj = majority_baseline(ytr, ydv)
    lin = fit_probe(xtr, ytr, xdv, ydv, num_classes=ewt["C"])
    mlp = fit_probe(xtr, ytr, xdv, ydv, num_classes=ewt["C"], kind="mlp", hidden=64, seed=0)
    assert mlp.weights["w1"].shape == (2, 16, 64) and mlp.weights["w2"].shape == (2, 64, ewt["C"])
    assert mlp.dev_accuracy[1] > 0.7 and lin.dev_accuracy[1] < maj + 0.15, (mlp.dev_accuracy, lin.dev_accuracy)
    assert abs(mlp.dev_accuracy[0] - maj) < 0.05
    again = fit_probe(xtr, ytr, xdv, ydv, num_classes=ewt["C"], kind="mlp", hidden=64, seed=0)
    np.testing.assert_array_equal(again.dev_predictions, mlp.dev_predictions)  # seeded


def test_layer_groups_and_early_stopping(ewt, planted):
    xtr, xdv = planted
    (_, ytr, _), (_, ydv, _) = ewt["train"], ewt["dev"]
    full = fit_probe(xtr, ytr, xdv, ydv, num_classes=ewt["C"], early_stopping=False)
    grouped = fit_probe(xtr, ytr, xdv, ydv, num_classes=ewt["C"], early_stopping=False, layer_batch=2)
    # heads are independent: fitting in groups changes nothing beyond optimiser noise
    assert np.abs(full.dev_accuracy - grouped.dev_accuracy).max() <= 0.005
    sub = fit_probe(xtr, ytr, xdv, ydv, num_classes=ewt["C"], layers=[K, 0])
    assert list(sub.layers) == [K, 0] and sub.dev_accuracy[0] > 0.9
    # (on dev accuracy: the linear Adam fit's default criterion is the dev loss, which the planted
    # layer keeps lowering a little for all 40 epochs here)
    # (polish: 0: the Adam loop's own stopping, without the L-BFGS polish's steps after it)
    es = fit_probe(xtr, ytr, xdv, ydv, num_classes=ewt["C"], optimizer="adam", patience=2, epochs=40, min_steps=0,
                   stop_on="accuracy", polish=0)
    assert es.steps < 40  # stopped once no layer improved for 2 epochs
    assert es.dev_accuracy[K] > 0.9


def test_mdl_online_code(ewt, planted):
    xtr, _ = planted
    (_, ytr, _) = ewt["train"]
    C = ewt["C"]
    res = mdl_online_code(xtr, ytr, num_classes=C, seed=0)
    n = len(ytr)
    assert res.uniform_codelength == pytest.approx(n * math.log2(C))
    expected_ends = np.unique(np.clip(np.round(np.asarray(MDL_FRACTIONS) * n), 1, n).astype(int))
    np.testing.assert_array_equal(res.block_ends, expected_ends)
    np.testing.assert_allclose(res.block_codelengths[:, 0], expected_ends[0] * math.log2(C))
    np.testing.assert_allclose(res.block_codelengths.sum(1), res.online_codelength)
    noise = [l for l in range(N_LAYERS) if l != K]
    assert res.online_codelength[K] < 0.35 * res.online_codelength[noise].min()
    assert res.compression[K] > 3
    # noise layers can only learn the label prior: ratio between 1 and log2(C) / H(labels)
    p = label_distribution(ytr, C)
    entropy = -(p[p > 0] * np.log2(p[p > 0])).sum()
    assert np.all(res.compression[noise] > 0.9) and np.all(res.compression[noise] < math.log2(C) / entropy + 0.02)
    # with uniformly random labels there is nothing to learn: compression ~ 1
    rnd = np.random.default_rng(0).integers(0, C, n)
    flat = mdl_online_code(xtr[:2], rnd, num_classes=C, seed=0)
    assert np.all(np.abs(flat.compression - 1) < 0.05), flat.compression


@pytest.mark.slow
def test_scalar_mix_concentrates_on_planted_layer(ewt, planted):
    xtr, xdv = planted
    (_, ytr, _), (_, ydv, _) = ewt["train"], ewt["dev"]
    res = fit_scalar_mix(xtr, ytr, xdv, ydv, num_classes=ewt["C"], seed=0)
    assert res.weights.shape == (N_LAYERS,) and res.weights.sum() == pytest.approx(1, abs=1e-5)
    others = np.delete(res.weights, K)
    assert res.weights[K] > 0.5 and res.weights[K] > 4 * others.max(), res.weights
    assert abs(res.centre_of_gravity - K) < 0.5
    assert abs(res.expected_layer - K) < 0.5, (res.cumulative_dev_accuracy, res.expected_layer)
    # cumulative heads: head l only mixes layers 0..l
    assert np.allclose(np.triu(res.cumulative_weights, 1), 0)
    assert res.cumulative_dev_accuracy[K - 1] < 0.4 < 0.9 < res.cumulative_dev_accuracy[K]
    assert res.dev_accuracy > 0.9


def test_expected_layer_and_centre_of_gravity_formulas():
    deltas, e = expected_layer([0.2, 0.3, 0.8, 0.9])
    np.testing.assert_allclose(deltas, [0, 0.1, 0.5, 0.1])
    assert e == pytest.approx((1 * 0.1 + 2 * 0.5 + 3 * 0.1) / 0.7)
    assert centre_of_gravity([0.1, 0.2, 0.7]) == pytest.approx(0.2 + 1.4)


def test_layer_rows_follow_the_results_schema():
    acc = np.array([0.5, 0.9, 0.7])
    rows = layer_rows(
        {"accuracy": acc, "selectivity": acc - 0.3}, ci={"accuracy": (acc - 0.01, acc + 0.01)},
        probe="syntax", task="upos", split="dev", n=1234, model="tiny-bert", family="bert", seed=0,
        extra={"classifier": "linear"},
    )  # fmt: skip
    assert list(rows.columns) == RESULT_COLUMNS and len(rows) == 6
    a = rows[rows.metric == "accuracy"].sort_values("layer")
    np.testing.assert_allclose(a.value, acc)
    np.testing.assert_allclose(a.ci_low, acc - 0.01)
    assert rows[rows.metric == "selectivity"].ci_low.isna().all()
    assert set(rows["n"]) == {1234} and set(rows["stack"]) == {"encoder"}
    with pytest.raises(Exception, match="lengths"):
        layer_rows({"a": [1, 2], "b": [1]}, probe="p", task="t", split="dev")


def test_config_errors():
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="kind"):
        ProbeConfig(kind="svm")
    with pytest.raises(ConfigError, match="labels"):
        fit_probe(np.zeros((2, 4, 3), np.float32), np.array([0, 1, 2]))
    with pytest.raises(ConfigError, match="num_classes"):
        fit_probe(np.zeros((2, 3, 3), np.float32), np.array([0, 1, 5]), num_classes=3)
    with pytest.raises(ConfigError, match="unknown probe config"):
        fit_probe(np.zeros((2, 3, 3), np.float32), np.array([0, 1, 1]), config={"l3": 1})


@pytest.mark.slow
def test_random_init_twin_of_a_real_handle():
    from tests.conftest import TOKENIZER_SPECS, tiny_bert
    from workbench.running.models import ModelHandle
    from workbench.tokenization import build_tokenizer

    train = load_treebank("en_ewt", "train")[:1000]
    tok = build_tokenizer(*TOKENIZER_SPECS["bert"], [s.text for s in train], vocab_size=600)
    handle = ModelHandle(tiny_bert(tok), tok)
    rng_state = torch.get_rng_state()
    twin = random_init_twin(handle, seed=1)
    assert torch.equal(rng_state, torch.get_rng_state())  # global RNG untouched
    assert type(twin.model) is type(handle.model) and twin.tokenizer is handle.tokenizer
    assert twin.model.config.to_dict() == handle.model.config.to_dict()
    assert twin.num_layers == handle.num_layers and twin.hidden_size == handle.hidden_size
    assert twin.family == handle.family and twin.max_length == handle.max_length
    for name, p in twin.model.named_parameters():  # the class's own initialiser ran (not empty memory)
        ref = dict(handle.model.named_parameters())[name]
        assert torch.isfinite(p).all() and abs(float(p.detach().std()) - float(ref.detach().std())) < 0.01, name
    assert twin.checkpoint_hash != handle.checkpoint_hash  # fresh weights -> its own activation cache
    assert random_init_twin(handle, seed=1).checkpoint_hash == twin.checkpoint_hash  # seeded
    assert random_init_twin(handle, seed=2).checkpoint_hash != twin.checkpoint_hash
    words = [s.words for s in train[:3]]
    a = np.concatenate(list(handle.word_states(words)), axis=1)
    b = np.concatenate(list(twin.word_states(words)), axis=1)
    assert a.shape == b.shape and not np.allclose(a, b)


def test_task_and_control_heads_of_all_seeds_in_one_program(ewt, planted):
    """fit_probe_tasks: seed 0's heads are fit_probe's (same data order, same objective); other
    seeds are ordinary minibatch fits that agree with sklearn; the control heads give selectivity
    only at the planted layer; early stopping keeps per-head best parameters."""
    from sklearn.linear_model import LogisticRegression

    from probes.core.fitting import fit_probe_tasks

    xtr, xdv = planted
    (wtr, ytr, _), (wdv, ydv, _) = ewt["train"], ewt["dev"]
    C = ewt["C"]
    dist = label_distribution(ytr, C)
    ctr, cdv = control_labels(wtr, dist, seed=0), control_labels(wdv, dist, seed=0)
    common = dict(num_classes=C, optimizer="adam", early_stopping=False, l2=1e-3, min_steps=150)
    res = fit_probe_tasks(xtr, {"task": (ytr, ydv), "control": (ctr, cdv)}, xdv, seeds=[0, 1, 2], **common)
    assert sorted(res) == sorted((k, s) for k in ("task", "control") for s in (0, 1, 2))
    for name, (y, yd) in (("task", (ytr, ydv)), ("control", (ctr, cdv))):
        ref = fit_probe(xtr, y, xdv, yd, seed=0, polish=0, **common)  # fit_probe_tasks: the Adam fit, unpolished
        np.testing.assert_allclose(res[(name, 0)].weights["w"], ref.weights["w"], atol=2e-5)
        np.testing.assert_allclose(res[(name, 0)].dev_accuracy, ref.dev_accuracy, atol=1e-3)
    for s in (1, 2):  # another data order: not the same weights as seed 0, same optimum in accuracy
        assert np.abs(res[("task", s)].weights["w"] - res[("task", 0)].weights["w"]).max() > 1e-4
        np.testing.assert_array_equal(res[("task", s)].predict(xdv), res[("task", s)].dev_predictions)
    sk = LogisticRegression(C=sklearn_C(1e-3, len(ytr)), max_iter=2000).fit(xtr[K], ytr)
    sk_acc = (sk.predict(xdv[K]) == ydv).mean()
    for s in (0, 1, 2):
        assert abs(res[("task", s)].dev_accuracy[K] - sk_acc) <= 0.01, (s, res[("task", s)].dev_accuracy[K], sk_acc)
        selectivity = res[("task", s)].dev_accuracy - res[("control", s)].dev_accuracy
        assert int(np.argmax(selectivity)) == K and selectivity[K] > 0.5
    two = {"task": (ytr, ydv), "control": (ctr, cdv)}
    # stopping on accuracy: the kept epoch's dev accuracy is then the best seen, the last epoch's included
    # (stopping on the loss, the linear Adam default, bounds the loss, not the accuracy)
    stopped = fit_probe_tasks(xtr, two, xdv, seeds=[0, 1], **{**common, "early_stopping": True, "patience": 100,
                                                              "stop_on": "accuracy"})
    for s in (0, 1):  # restored per-head best: dev accuracy at the kept epoch is the best seen
        assert stopped[("task", s)].dev_accuracy[K] > 0.9
        for name in two:  # every head of both tasks (the last epoch is a candidate too)
            assert np.all(stopped[(name, s)].dev_accuracy >= res[(name, s)].dev_accuracy - 1e-9), name
        assert stopped[("task", s)].best_step[K] >= 1 and stopped[("task", s)].weights["w"][K].any()
    with pytest.raises(Exception, match="L-BFGS|lbfgs"):
        fit_probe_tasks(xtr, {"task": (ytr, ydv)}, xdv, num_classes=C, optimizer="lbfgs")


def test_task_heads_start_at_their_task_log_prior():
    """fit_probe_tasks starts every (seed, task, layer) head where fit_probe does (`prior_bias`):
    bias = the add-one smoothed log prior of its task's labels; with lr 0 the heads stay there."""
    from probes.core.fitting import fit_probe_tasks

    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 50, 4)).astype(np.float32)
    tasks = {"skewed": (np.r_[np.zeros(40, int), np.ones(8, int), np.full(2, 2)], None),
             "uniform": (np.arange(50) % 3, None)}
    res = fit_probe_tasks(x, tasks, num_classes=4, seeds=[0, 5], optimizer="adam", lr=0.0, epochs=1)
    for (name, seed), r in res.items():
        counts = np.bincount(tasks[name][0], minlength=4) + 1.0
        want = np.log(counts / counts.sum())
        np.testing.assert_allclose(r.weights["b"], np.broadcast_to(want, (3, 4)), rtol=1e-6)
        assert not r.weights["w"].any()
