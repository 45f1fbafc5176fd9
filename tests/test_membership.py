"""Membership inference: ground truth from manifests, attack math against hand/scipy/sklearn
computations, and sanity on real text with tiny models trained by the backend (a shadow set)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

from probes import membership as mem
from probes.membership import attacks as ma
from workbench.errors import ConfigError

# --------------------------------------------------------------------------- pure math


def test_metrics_equal_sklearn_with_the_sign_convention():
    rng = np.random.default_rng(0)
    y = np.r_[np.ones(300, bool), np.zeros(500, bool)]
    nll = rng.normal(3.0, 1.0, 800) - 0.4 * y  # members have lower loss
    nll[:40] = np.round(nll[:40], 1)  # some ties
    r = ma.roc_metrics(ma.loss_score(nll), y, n_boot=200, seed=1)
    # MIMIR's LOSS score is +NLL with "lower = member": sklearn on -their score is our AUC
    assert r.auc == pytest.approx(roc_auc_score(y, -nll), abs=1e-12)
    fpr, tpr, _ = roc_curve(y, -nll)
    for x in (0.01, 0.001):
        assert r.tpr_at[x] == pytest.approx(max(t for f, t in zip(fpr, tpr) if f <= x))
    assert r.fp_allowed == {0.01: 5, 0.001: 0}
    assert "no false positive" in r.fpr_note(0.001)
    assert r.balanced_accuracy == pytest.approx((1 + np.max(tpr - fpr)) / 2)
    assert r.auc_ci[0] < r.auc < r.auc_ci[1] and r.auc_ci[1] - r.auc_ci[0] < 0.15
    one = ma.roc_metrics(rng.normal(size=2000), np.r_[np.ones(1000, bool), np.zeros(1000, bool)], n_boot=10)
    assert one.fp_allowed[0.001] == 1 and "single example" in one.fpr_note(0.001)
    pts = ma.roc_points(r, 50)
    assert len(pts) <= 50 and pts[0] == (0.0, 0.0) and pts[-1] == (1.0, 1.0)


def test_zlib_and_reference_scores():
    texts = ["aaaa aaaa aaaa aaaa", "the quick brown fox jumps"]
    import zlib

    z = [len(zlib.compress(t.encode())) for t in texts]
    assert ma.zlib_score(np.array([2.0, 3.0]), texts) == pytest.approx([-2.0 / z[0], -3.0 / z[1]])
    assert ma.reference_score(np.array([2.0, 3.0]), np.array([2.5, 2.0])) == pytest.approx([0.5, -1.0])


def test_mink_and_minkpp_equal_hand_computations():
    lp = np.array([-0.1, -5.0, -2.0, -0.5, -3.0, -1.0, -0.2, -4.0, -0.3, -0.05])
    # 10 tokens: k=20% -> the 2 lowest (-5, -4); k=5% -> int(0.5) = 0 -> at least 1 token (-5)
    assert ma.mink_score(lp, 0.2) == pytest.approx((-5.0 - 4.0) / 2)
    assert ma.mink_score(lp, 0.05) == pytest.approx(-5.0)
    assert ma.mink_score(lp, 0.5) == pytest.approx(np.mean([-5.0, -4.0, -3.0, -2.0, -1.0]))
    mu = np.linspace(-3.0, -1.0, 10)
    sigma = np.linspace(0.5, 2.0, 10)
    z = [(lp[i] - mu[i]) / sigma[i] for i in range(10)]
    low3 = sorted(z)[:3]
    assert ma.minkpp_score(lp, mu, sigma, 0.3) == pytest.approx(sum(low3) / 3)
    with pytest.raises(ValueError):
        ma.mink_score(lp, 0.0)


def test_lira_equals_scipy_hand_computation():
    phi_shadow = np.array([[1.0, 2.0, 0.5, 3.0, -1.0, 0.0],
                           [0.2, 0.1, 0.4, 2.5, 2.0, 1.5]])
    inn = np.array([[True, True, False, True, False, False],
                    [False, False, True, True, True, False]])
    out = ~inn
    out[1, 5] = False  # a shadow whose pool lacks example 1: neither IN nor OUT
    target = np.array([1.7, 0.3])
    want_on, want_off, want_fix = [], [], []
    all_in = phi_shadow[inn]
    all_out = phi_shadow[out]
    for i in range(2):
        a, b = phi_shadow[i][inn[i]], phi_shadow[i][out[i]]
        want_on.append(stats.norm.logpdf(target[i], np.median(a), np.std(a)) -
                       stats.norm.logpdf(target[i], np.median(b), np.std(b)))
        want_off.append(stats.norm.logcdf(target[i], np.median(b), np.std(b)))
        want_fix.append(stats.norm.logpdf(target[i], np.median(a), np.std(all_in)) -
                        stats.norm.logpdf(target[i], np.median(b), np.std(all_out)))
    assert ma.lira_online(target, phi_shadow, inn, out) == pytest.approx(want_on, rel=1e-9)
    assert ma.lira_offline(target, phi_shadow, inn, out) == pytest.approx(want_off, rel=1e-9)
    assert ma.lira_online(target, phi_shadow, inn, out, fix_variance=True) == pytest.approx(want_fix, rel=1e-9)
    with pytest.raises(ValueError):
        ma.lira_online(target, phi_shadow, inn, inn)  # IN and OUT at once


def test_scaled_logits():
    z = np.array([[2.0, 0.0, -1.0], [0.0, 30.0, 0.0]])
    y = np.array([0, 1])
    p = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    py = p[np.arange(2), y]
    assert ma.scaled_logit_from_logits(z, y)[0] == pytest.approx(np.log(py[0] / (1 - py[0])))
    assert ma.scaled_logit_from_logits(z, y)[1] == pytest.approx(30.0 - np.log(2.0), rel=1e-9)  # no overflow
    m = np.array([-0.5, -3.0])
    assert ma.scaled_logit_from_mean_logprob(m) == pytest.approx(np.log(np.exp(m) / (1 - np.exp(m))))


def test_length_matched_samples_have_equal_histograms():
    rng = np.random.default_rng(0)
    a, b = rng.integers(5, 40, 700), rng.integers(10, 60, 400)
    i, j = ma.length_matched(a, b, n_max=None, seed=0)
    assert len(i) == len(j) > 100
    assert sorted(a[i]) == sorted(b[j])
    i2, j2 = ma.length_matched(a, b, n_max=50, seed=0)
    assert len(i2) == len(j2) == 50 and sorted(a[i2]) == sorted(b[j2])


def test_balanced_keep():
    from workbench.drivers.shadows import balanced_keep

    keep = balanced_keep(100, 9, seed=3)
    assert keep.shape == (9, 100) and (keep.sum(0) == 5).all()
    assert not (keep == balanced_keep(100, 9, seed=4)).all()


# --------------------------------------------------------------------------- ground truth from manifests


@pytest.fixture(scope="module")
def polarity_corpus(tmp_path_factory):
    from workbench.data.corpus import build_corpus

    return build_corpus(["sentence_polarity"], tmp_path_factory.mktemp("corpus") / "pol", heldout_fraction=0.5,
                        seed=0, max_documents=3000)


def test_members_come_from_the_manifest_and_a_planted_overlap_is_caught(polarity_corpus, tmp_path):
    s = mem.pretrain_sample(None, passage_words=32, min_words=4, n_examples=200, seed=0,
                            corpus_dir=polarity_corpus.dir, length_bin=2)
    train, held = set(polarity_corpus.doc_ids("train")), set(polarity_corpus.doc_ids("heldout"))
    docs = np.array(s.doc_ids)
    assert s.is_member.sum() == (~s.is_member).sum() == 200
    assert set(docs[s.is_member]) <= train and set(docs[~s.is_member]) <= held
    assert sorted(s.lengths[s.is_member] // 2) == sorted(s.lengths[~s.is_member] // 2)
    # plant an overlap: a training document id also listed as held out
    bad = tmp_path / "bad"
    shutil.copytree(polarity_corpus.dir, bad)
    m = json.loads((bad / "manifest.json").read_text())
    m["doc_ids"]["heldout"].append(m["doc_ids"]["train"][0])
    (bad / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ConfigError, match="both members and non-members"):
        mem.pretrain_sample(None, corpus_dir=bad, n_examples=50)


def test_passages_keep_original_text():
    text = "one two  three\nfour five six seven"
    assert mem.passages(text, 3, 2) == [("one two  three", 3), ("four five six", 3)]
    assert mem.passages(text, 3, 1)[-1] == ("seven", 1)


def test_target_in_shadow_set_means_one_of_its_runs(tmp_path):
    """Auto `equal_counts`: a target from one of the set's training runs (any step of it) ties the
    shadows' IN/OUT counts to its membership; a checkpoint trained elsewhere does not."""
    from types import SimpleNamespace

    runs = [tmp_path / f"model-{i:02d}" / "seed-0" for i in range(3)]
    sset = SimpleNamespace(checkpoints=[r / "step-0000100" for r in runs])
    for p in [*sset.checkpoints, runs[1] / "step-0000050", tmp_path / "other" / "seed-0" / "step-0000100"]:
        p.mkdir(parents=True)
    assert mem.target_in_shadow_set(sset.checkpoints[0], sset)
    assert mem.target_in_shadow_set(runs[1] / "step-0000050", sset)  # an earlier step of a shadow's run
    assert not mem.target_in_shadow_set(tmp_path / "other" / "seed-0" / "step-0000100", sset)


def _copied_shadow_set(root, tiny_checkpoint, kind: str, n: int = 4):
    """A shadow-set folder of `n` copies of a tiny checkpoint: pretrain `model-II/seed-0/step-0000100`
    (plus an earlier step-0000050 of each run); finetune `model-II/seed-0/best` beside step folders."""
    import json
    import shutil

    models = []
    for i in range(n):
        run = root / f"model-{i:02d}" / "seed-0"
        for step in ("step-0000050", "step-0000100"):
            shutil.copytree(tiny_checkpoint, run / step)
        if kind == "finetune":
            shutil.copytree(tiny_checkpoint, run / "best")
        models.append({"checkpoint": str((run / ("best" if kind == "finetune" else "step-0000100")).relative_to(root))})
    (root / "shadows.json").write_text(json.dumps({"kind": kind, "models": models}))
    return root


def test_shadows_are_a_lazy_runner_role_and_the_target_run_is_never_a_shadow(tiny_checkpoint, tmp_path, monkeypatch):
    """LiRA's shadows are the runner's lazy `shadows` role: resolved before any work (every checkpoint
    LiRA may read: each model's recorded one; fine-tuned sets also every step folder, for the
    per-epoch choice), hashed into the resume key, loaded by `shadow_matrix` one at a time; the
    probed model's own training run is never among its shadows, for any step of it."""
    from types import SimpleNamespace

    from probes.core import runner
    from workbench.store.identity import weights_hash

    folder = _copied_shadow_set(tmp_path / "pre", tiny_checkpoint, "pretrain")
    settings = runner.make_settings(mem.Settings, {"tasks": ["attacks"], "attacks": ["loss", "lira"], "shadows": str(folder)})
    resolved = runner.resolve_roles(mem.PROBE, settings)["shadows"]
    assert [c.path for c in resolved] == [folder / f"model-{i:02d}" / "seed-0" / "step-0000100" for i in range(4)]
    assert runner.resolve_roles(mem.PROBE, runner.make_settings(
        mem.Settings, {"attacks": ["loss"], "shadows": str(folder)})) == {}  # no LiRA: neither loaded nor keyed
    fine = _copied_shadow_set(tmp_path / "fine", tiny_checkpoint, "finetune", n=2)
    fine_settings = runner.make_settings(mem.Settings, {"setting": "finetune", "attacks": ["loss", "lira"],
                                                        "shadows": str(fine)})
    assert sorted(str(c.path.relative_to(fine)) for c in runner.resolve_roles(mem.PROBE, fine_settings)["shadows"]) == [
        f"model-{i:02d}/seed-0/{f}" for i in range(2) for f in ("best", "step-0000050", "step-0000100")]
    with pytest.raises(ConfigError, match="shadows \\(shadows\\): .*a pretrain shadow set; the finetune setting"):
        runner.resolve_roles(mem.PROBE, runner.make_settings(mem.Settings, {**fine_settings.as_config(), "shadows": str(folder)}))

    role = runner.load_roles(mem.PROBE, {"shadows": resolved})["shadows"]
    assert [r.checkpoint_hash for r in role] == [weights_hash(c.path) for c in resolved]
    scored = []
    from probes.membership import tasks as mem_tasks  # where shadow_matrix looks them up

    monkeypatch.setattr(mem_tasks, "corpus_of", lambda ck: (SimpleNamespace(doc_ids=lambda split: ["a"] if split == "train" else ["b"]), None))
    monkeypatch.setattr(mem_tasks, "lm_stats", lambda h, texts, *a, **k: scored.append(h.path.parent.parent.name)
                        or mem.Stats(np.zeros(len(texts)), np.full(len(texts), float(len(scored)))))
    sample = mem.Sample(ids=["a#0", "b#0"], doc_ids=["a", "b"], texts=["x y", "z w"], is_member=np.array([True, False]),
                        lengths=np.array([2, 2]))
    for target in (folder / "model-01" / "seed-0" / "step-0000100", folder / "model-02" / "seed-0" / "step-0000050",
                   tmp_path / "elsewhere" / "seed-0" / "step-0000100"):
        scored.clear()
        phi, ins, outs, names = mem.shadow_matrix(sample, target, mem.prepare(settings), settings, shadows=role)
        own = target.parent.parent.name
        assert own not in scored and not any(n.startswith(own + "/") for n in names)
        assert scored == [f"model-{i:02d}" for i in range(4) if f"model-{i:02d}" != own]
        assert phi.shape == (2, len(scored)) and ins[0].all() and outs[1].all()
    with pytest.raises(RuntimeError, match="did not resolve"):  # a shadow outside the role would be unkeyed
        mem.shadow_matrix(sample, tmp_path / "t" / "seed-0" / "step-1", mem.prepare(settings), settings, shadows=role[:3])


def test_each_shadow_set_is_loaded_and_checked_under_its_own_folder(monkeypatch):
    """Two settings naming different shadow sets get their own (not the first one loaded), and the
    kind check applies to every setting."""
    from types import SimpleNamespace

    from workbench.drivers.shadows import ShadowSet

    monkeypatch.setattr(ShadowSet, "load", staticmethod(lambda folder: SimpleNamespace(folder=folder, kind="pretrain")))
    prepared = SimpleNamespace(data={})
    a = mem.loaded_shadow_set(prepared, SimpleNamespace(shadows="set-a", setting="pretrain"))
    b = mem.loaded_shadow_set(prepared, SimpleNamespace(shadows="set-b", setting="pretrain"))
    assert (a.folder, b.folder) == ("set-a", "set-b")
    assert mem.loaded_shadow_set(prepared, SimpleNamespace(shadows="set-a", setting="pretrain")) is a  # loaded once
    with pytest.raises(ConfigError, match="set-a: a pretrain shadow set; the finetune setting"):
        mem.loaded_shadow_set(prepared, SimpleNamespace(shadows="set-a", setting="finetune"))


def test_settings_are_checked_before_loading():
    from probes import get_probe
    from probes.core.runner import build_parser

    spec = get_probe("membership")
    assert "--attacks" in build_parser(spec)[0].format_help()  # argparse formats every help text
    with pytest.raises(ConfigError, match="needs --shadows"):
        spec.settings(tasks=("attacks",), attacks=("lira",)).validate(spec)
    with pytest.raises(ConfigError, match="finetune setting"):
        spec.settings(tasks=("attacks",), setting="finetune", attacks=("mink",)).validate(spec)


# --------------------------------------------------------------------------- tiny models trained by the backend

# no dropout or weight decay, a high learning rate: 60 steps of 16 x 32 tokens are ~20 passes over a
# model's ~1,500-token half of the pool (a few seconds per model on one core)
TINY_SHADOW = {"name": "mia-test", "family": "gpt", "preset": "tiny", "tokenizer": {"vocab_size": 1000}, "max_len": 64,
               "batch_size": 16, "lr": 2e-2, "warmup": 0.05, "weight_decay": 0.0, "steps": 60, "eval": {"batches": 0},
               "model": {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0},
               "checkpoints": {"log_spaced": False}, "progress": False}


@pytest.fixture(scope="module")
def shadow_set(tmp_path_factory):
    """9 tiny GPTs on balanced random halves of 96 real sentences (one tokenizer trained on the pool):
    model 0 is the target, models 1-8 its shadows."""
    from workbench.drivers.shadows import train_shadow_set

    root = tmp_path_factory.mktemp("shadows")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BERTOLOGY_RUNS", str(root / "runs"))
        s = train_shadow_set(TINY_SHADOW, {"sources": ["sentence_polarity"], "max_documents": 96, "seed": 0}, 9,
                             root / "set", seed=0, progress=False)
        yield s


@pytest.mark.slow
def test_shadow_models_record_their_split(shadow_set):
    from workbench.drivers.shadows import ShadowSet

    again = ShadowSet.load(shadow_set.folder)
    assert len(again.checkpoints) == 9
    corpus, _ = mem.corpus_of(again.checkpoints[0])
    in_any = [set(mem.corpus_of(c)[0].doc_ids("train")) for c in again.checkpoints]
    pool = set(corpus.doc_ids("train")) | set(corpus.doc_ids("heldout"))
    assert len(pool) == 96
    assert all(sum(d in s for s in in_any) == 5 for d in pool)  # balanced: each document in 5 of 9


@pytest.mark.slow
def test_loss_memorised_and_lira_with_8_shadows(shadow_set, tmp_path):
    from probes.core import runner
    from workbench.store.results import ResultsStore

    target = shadow_set.checkpoints[0]
    settings = {"tasks": ["attacks"], "attacks": ["loss", "zlib", "mink", "minkpp", "lira"], "shadows": str(shadow_set.folder),
                "min_words": 1, "length_bin": 4, "n_boot": 200, "baselines": [], "progress": False}
    run_id, rows = runner.run_probe("membership", [target], settings, store=ResultsStore(tmp_path / "runs"))
    auc = rows[rows["metric"] == "auc"].set_index("task")["value"]
    n = rows[rows["metric"] == "auc"].set_index("task")["n"]
    assert n["loss"] >= 40
    # the target is one of the set's models: LiRA thins to equal IN/OUT counts by default (the
    # balanced design's bias), and the run's notes say so, with the head that scored it
    notes = ResultsStore(tmp_path / "runs").manifest(run_id)["notes"]
    assert list(notes["lira_equal_counts"].values()) == [True]
    assert [len(v) for v in notes["lira_shadows"].values()] == [len(shadow_set.checkpoints) - 1] and notes["lm_score"]
    sample_info = next(iter(notes["membership_samples"].values()))
    print("passages too long for the model's 64-token window:", sample_info["passages_too_long_for_the_model"])
    # ~20 passes over its half: memorisation detectable, each attack's own 95% bootstrap CI above
    # chance (how well attacks recover a known signal is test_attacks_recover_a_planted_signal's)
    ci_low = rows[rows["metric"] == "auc"].set_index("task")["ci_low"]
    assert (ci_low[["loss", "lira_online", "lira_offline"]] > 0.5).all(), ci_low
    extra = rows[(rows["task"] == "lira_online") & (rows["metric"] == "auc")]["extra"].iloc[0]
    extra = json.loads(extra) if isinstance(extra, str) else extra
    assert extra["roc_fpr"][0] == 0.0 and extra["roc_tpr"][-1] == 1.0 and extra["n_nonmembers"] == n["loss"] // 2
    print("tiny shadow set AUCs:", auc.round(3).to_dict())
    # the ROC figure draws exactly the stored points
    import pandas as pd

    from app.figures import render

    fig = render("membership_roc", ResultsStore(tmp_path / "runs"), tmp_path / "fig", formats=("html",))
    drawn = pd.read_csv(fig.folder / "data.csv")
    online = drawn[drawn["task"] == "lira_online"]
    assert online[online["metric"] == "roc_fpr"].sort_values("layer")["value"].tolist() == pytest.approx(extra["roc_fpr"])
    assert online[online["metric"] == "roc_tpr"].sort_values("layer")["value"].tolist() == pytest.approx(extra["roc_tpr"])
    steps = render("membership_auc_steps", ResultsStore(tmp_path / "runs"), tmp_path / "fig2", formats=("html",))
    assert pd.read_csv(steps.folder / "data.csv")["value"].tolist() == pytest.approx(
        [auc[t] for t in ("loss", "mink_20", "minkpp_20", "zlib")], abs=1e-9)


def _hanley_mcneil_se(auc: float, n_pos: int, n_neg: int) -> float:
    """Standard error of an AUC estimated from n_pos positives and n_neg negatives (Hanley & McNeil,
    1982, Radiology 143:29, eq. 2, with their exponential approximations of Q1 and Q2)."""
    q1, q2 = auc / (2 - auc), 2 * auc**2 / (1 + auc)
    var = (auc * (1 - auc) + (n_pos - 1) * (q1 - auc**2) + (n_neg - 1) * (q2 - auc**2)) / (n_pos * n_neg)
    return float(np.sqrt(var))


def _planted_lm_stats(delta: float, sigma: float, tau: float, calls: list):
    """A stand-in for `membership.lm_stats` with a planted signal: a model's mean NLL of a passage is
    30 + difficulty(passage) + noise(passage, model) - delta * [the passage's document is in that
    model's training split], difficulty ~ N(0, tau^2) shared by all models, noise ~ N(0, sigma^2)
    per model, both drawn from seeds made of the text (and the model's folder): deterministic. (Around
    30 nats LiRA's logit scaling is linear in the NLL, so its Gaussians stay Gaussian.) LOSS then has
    AUC Phi(delta / sqrt(2 (sigma^2 + tau^2))); an attack that learns each passage's difficulty from
    shadows (LiRA) approaches Phi(delta / (sigma sqrt 2)). Each call is recorded."""
    import zlib

    def seed_of(*parts: str) -> int:
        return zlib.crc32("\x1f".join(parts).encode())

    def lm_stats(handle, texts, batch_size, moments=True, progress=False, electra_head="generator"):
        corpus, _ = mem.corpus_of(handle.path)
        train = set(corpus.doc_ids("train"))
        doc_of = {" ".join(t.split()): d.doc_id for split in ("train", "heldout") for d in corpus.documents(split)
                  for t, _ in mem.passages(d.text, 32, 1)}
        member = np.array([doc_of[" ".join(t.split())] in train for t in texts])
        difficulty = np.array([np.random.default_rng(seed_of(t)).normal(0, tau) for t in texts])
        noise = np.array([np.random.default_rng(seed_of(t, handle.path.name, handle.path.parent.name)).normal(0, sigma)
                          for t in texts])
        nll = 30.0 + difficulty + noise - delta * member
        calls.append({"path": handle.path, "texts": list(texts), "member": member, "nll": nll})
        return mem.Stats(nll, ma.scaled_logit_from_mean_logprob(-nll))

    return lm_stats


@pytest.mark.slow
@pytest.mark.parametrize("delta", [3.0, 0.0], ids=["planted", "chance-control"])
def test_attacks_recover_a_planted_signal(shadow_set, tmp_path, monkeypatch, delta):
    """The tiny shadow set's real splits, with the models' NLLs replaced by a planted signal of
    known size: LOSS reads the AUC the planted distribution implies, LiRA beats it by learning each
    passage's difficulty from the shadows, and with nothing planted (delta 0) every attack sits at
    chance. Margins: 3 standard errors of an AUC at this sample size (Hanley & McNeil). LiRA with one
    global deviation (fix_variance), which the planted noise has."""
    from probes.core import runner
    from workbench.store.results import ResultsStore

    sigma, tau, calls = 1.0, 6.0, []
    from probes.membership import tasks as mem_tasks  # the target's and the shadows' statistics are read there

    monkeypatch.setattr(mem_tasks, "lm_stats", _planted_lm_stats(delta, sigma, tau, calls))
    target = shadow_set.checkpoints[0]
    settings = {"tasks": ["attacks"], "attacks": ["loss", "lira"], "shadows": str(shadow_set.folder), "min_words": 1,
                "length_bin": 4, "n_boot": 200, "baselines": [], "progress": False, "fix_variance": True}
    _, rows = runner.run_probe("membership", [target], settings, store=ResultsStore(tmp_path / "runs"))
    auc = rows[rows["metric"] == "auc"].set_index("task")
    (scored,) = [c for c in calls if c["path"] == target]
    n_pos, n_neg = int(scored["member"].sum()), int((~scored["member"]).sum())
    assert n_pos == n_neg == auc.loc["loss", "n"] // 2 >= 20
    # the pipeline scores exactly the planted NLLs against the target's own document split
    assert auc.loc["loss", "value"] == pytest.approx(roc_auc_score(scored["member"], -scored["nll"]), abs=1e-12)
    loss_expected = stats.norm.cdf(delta / np.sqrt(2 * (sigma**2 + tau**2)))
    oracle = stats.norm.cdf(delta / (sigma * np.sqrt(2)))  # the difficulty known exactly
    margin = 3 * _hanley_mcneil_se(loss_expected, n_pos, n_neg)
    print(f"planted delta {delta}: AUCs {auc['value'].round(3).to_dict()}, LOSS expected {loss_expected:.3f}, "
          f"oracle {oracle:.3f}, margin {margin:.3f}, members {n_pos}, non-members {n_neg}")
    assert abs(auc.loc["loss", "value"] - loss_expected) < margin
    if delta == 0:
        for attack in ("lira_online", "lira_offline"):
            assert abs(auc.loc[attack, "value"] - 0.5) < margin, attack
    else:
        lira_margin = 3 * _hanley_mcneil_se(oracle, n_pos, n_neg)
        assert loss_expected + margin < auc.loc["lira_online", "value"] < oracle + lira_margin


@pytest.mark.slow
def test_model_trained_on_neither_split_is_at_chance(shadow_set, tmp_path):
    """A tiny GPT trained on sentence_polarity, scored on a subjectivity split it never saw: AUC ~ 0.5."""
    from workbench.data.corpus import build_corpus
    from workbench.running.models import ModelHandle

    corpus = build_corpus(["subjectivity"], tmp_path / "subj", heldout_fraction=0.5, seed=0, max_documents=2600)
    handle = ModelHandle.load(shadow_set.checkpoints[0])
    s = mem.pretrain_sample(None, min_words=1, n_examples=1000, seed=0, corpus_dir=corpus.dir, length_bin=4,
                            fits=lambda texts: mem.fits_window(handle, texts))
    assert s.is_member.sum() == 1000 and min(s.info["passages_too_long_for_the_model"].values()) > 0
    st = mem.lm_stats(handle, s.texts, batch_size=64, moments=False)
    r = ma.roc_metrics(ma.loss_score(st.nll), s.is_member, n_boot=100)
    # a random half of documents it never saw: chance, within 3 standard errors at this sample size
    assert abs(r.auc - 0.5) < 3 * _hanley_mcneil_se(0.5, 1000, 1000), r.auc


def test_finetune_members_come_from_splits_json(tmp_path):
    """The fine-tuning ground truth: members = the first n_train ids of splits.json's train split
    (what `bertology finetune --max-train-examples` trains on), the rest non-members; a planted
    overlap (a member id also listed in dev) is caught."""
    from workbench.drivers.finetune import load_finetune_config, load_task
    from workbench.io import sha256_file

    cfg = load_finetune_config({"checkpoint": "unused", "task": "sentence_polarity", "max_train_examples": 300})
    data = load_task(cfg)
    ids = data.split_ids()

    def checkpoint(name, split_ids):
        folder = tmp_path / name
        folder.mkdir()
        splits = folder / "splits.json"
        splits.write_text(json.dumps({"task": "sentence_polarity", "ids": split_ids}))
        (folder / "manifest.json").write_text(json.dumps({"finetune": {
            "splits": str(splits), "splits_sha256": sha256_file(splits), "n_train": 300, "config": cfg.to_dict()}}))
        return folder

    s, _ = mem.finetune_sample(checkpoint("ok", ids), n_examples=200, seed=0)
    chosen = np.array(s.ids)
    assert set(chosen[s.is_member]) <= set(ids["train"][:300])
    assert not set(chosen[~s.is_member]) & set(ids["train"][:300])
    assert s.is_member.sum() == 200 and s.labels is not None
    index = {i: k for k, i in enumerate(data.ids)}
    assert [data.labels[index[i]] for i in chosen] == s.labels.tolist()
    assert sorted(zip(s.labels[s.is_member], s.lengths[s.is_member])) == \
        sorted(zip(s.labels[~s.is_member], s.lengths[~s.is_member]))  # matched on (label, length)
    bad = dict(ids, dev=ids["dev"] + [ids["train"][0]])
    with pytest.raises(ConfigError, match="both members and non-members"):
        mem.finetune_sample(checkpoint("bad", bad), n_examples=50)


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart"])
def test_each_family_is_scored_with_its_own_likelihood(tiny_models, family):
    """lm_stats: mean NLL = -mean of the family's own token log-probs (PLL, causal, seq2seq with the
    text as its own source), Min-K%++ moments present, phi = logit of the geometric-mean probability."""
    import torch

    from workbench.running.lm_scores import lm_scorer
    from workbench.running.models import ModelHandle

    model, tok = tiny_models[family]
    handle = ModelHandle(model, tok, family=family)
    texts = ["the cat sat on the mat .", "a dog barked at the postman all morning ."]
    st = mem.lm_stats(handle, texts, batch_size=4, moments=True)
    scorer = lm_scorer(handle)
    ref = (scorer.seq2seq_logprobs(texts, texts) if family in ("t5", "bart") else scorer.text_logprobs(texts))
    assert st.nll == pytest.approx([-r.logprobs.mean() for r in ref], rel=1e-6)
    assert all(len(m) == len(lp) == len(s) for m, lp, s in zip(st.mu, st.logprobs, st.sigma))
    p = np.exp(-st.nll)
    assert st.phi == pytest.approx(np.log(p / (1 - p)), rel=1e-6)
    if family == "t5":  # the seq2seq choice, by hand: teacher-forced log p(text | text)
        enc = tok(texts[0], return_tensors="pt")
        with torch.inference_mode():
            out = model(input_ids=enc.input_ids, labels=enc.input_ids)
        assert st.nll[0] == pytest.approx(float(out.loss), rel=1e-4)
