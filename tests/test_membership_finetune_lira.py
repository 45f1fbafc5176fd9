"""LiRA for fine-tuned classifiers (issue 12): 9 tiny BERT classifiers fine-tuned by
`workbench.drivers.finetune` on balanced random halves of 160 real sentence_polarity examples; model 0 is
the target, the other 8 its shadows. LiRA equals a scipy.stats.norm hand computation on the shadow
statistics the probe produced, and the overfit target's members are found."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from scipy import stats
from sklearn.metrics import roc_auc_score

from probes import membership as mem
from probes.membership import attacks as ma
from tests.conftest import tiny_bert
from workbench.errors import ConfigError

N_MODELS, POOL = 9, 160


@pytest.fixture(scope="module")
def shadow_set(tokenizers, tmp_path_factory):
    from workbench.drivers.shadows import train_finetune_shadow_set

    root = tmp_path_factory.mktemp("ft-shadows")
    base = root / "base"
    tiny_bert(tokenizers["bert"], hidden=64).save_pretrained(base)
    tokenizers["bert"].save_pretrained(base)
    # no weight decay, lr 1e-3, 12 epochs over its ~89 examples (its half of the pool): the last
    # epoch's classifier is overfit (dev accuracy 0.53-0.66; member p_y clearly above non-members')
    cfg = {"checkpoint": str(base), "task": "sentence_polarity", "epochs": 12, "lr": 1e-3, "batch_size": 16,
           "max_len": 48, "weight_decay": 0.0, "warmup": 0.0, "patience": 12, "max_eval_examples": 32,
           "progress": False, "baselines": False}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BERTOLOGY_RUNS", str(root / "runs"))
        s = train_finetune_shadow_set(cfg, {"max_examples": POOL, "seed": 0}, N_MODELS, root / "set", seed=0,
                                      use="last", progress=False)
    return s


@pytest.mark.slow
def test_finetune_shadows_record_their_halves(shadow_set):
    from workbench.store.checkpoints import read_manifest, seed_dir, step_dir
    from workbench.drivers.finetune import load_finetune_config, load_task, members

    assert shadow_set.kind == "finetune" and len(shadow_set.checkpoints) == N_MODELS
    pool = shadow_set.record["pool"]["ids"]
    assert len(pool) == len(set(pool)) == POOL
    data = load_task(load_finetune_config(shadow_set.record["finetune_config"]))
    assert set(pool) <= set(data.split_ids()["train"])  # dev and test stay out of the pool
    ins = [set(members(c)[0]) for c in shadow_set.checkpoints]
    assert all(m <= set(pool) for m in ins)
    assert all(sum(i in m for m in ins) == (N_MODELS + 1) // 2 for i in pool)  # balanced: each in 5 of 9
    outs = set(members(shadow_set.checkpoints[0])[1])
    assert set(pool) - ins[0] <= outs and not ins[0] & outs
    # use="last": each recorded checkpoint is the step folder `workbench.drivers.finetune` saved at the last
    # epoch (both name it through `checkpoints.seed_dir` / `step_dir`)
    for m, ck in enumerate(shadow_set.checkpoints):
        saved = read_manifest(ck)
        assert saved["epoch"] == 12 and ck == step_dir(seed_dir(shadow_set.folder / f"model-{m:02d}", m), saved["step"])


@pytest.mark.slow
def test_finetune_lira_equals_hand_computation_and_finds_members(shadow_set, tmp_path, monkeypatch):
    from probes import get_probe
    from probes.core import runner
    from workbench.running.classifier_loading import load_classifier
    from workbench.running.models import ModelHandle
    from workbench.store.results import ResultsStore
    from workbench.drivers.shadows import ShadowSet

    loads = []
    real_load = ShadowSet.load.__func__
    monkeypatch.setattr(ShadowSet, "load", classmethod(lambda cls, folder: loads.append(folder) or real_load(cls, folder)))
    target = shadow_set.checkpoints[0]
    settings = {"setting": "finetune", "tasks": ["attacks"], "attacks": ["loss", "lira"], "shadows": str(shadow_set.folder),
                "length_bin": 4, "n_boot": 200, "baselines": [], "progress": False}
    _, rows = runner.run_probe("membership", [target], settings, store=ResultsStore(tmp_path / "runs"))
    # read twice per run, never per unit: by the runner's shadows role (its checkpoints, hashed into the
    # resume key) and once by the probe (its pool bounds the sample, its models give phi)
    assert loads == [str(shadow_set.folder)] * 2
    auc = rows[rows["metric"] == "auc"].set_index("task")
    print("finetune LiRA AUCs:", auc["value"].round(3).to_dict(), "n:", auc["n"].to_dict())

    # the same sample, target statistic and shadow matrix, recomputed outside the runner
    spec = get_probe("membership")
    st_settings = spec.settings(**{**settings, "tasks": ("attacks",), "attacks": ("loss", "lira"), "baselines": ()})
    sample, data = mem.finetune_sample(target, st_settings.n_examples, st_settings.seed, 4,
                                       within=shadow_set.record["pool"]["ids"])
    assert set(sample.ids) <= set(shadow_set.record["pool"]["ids"])
    assert auc.loc["loss", "n"] == len(sample.ids) >= 40
    target_stats = mem.classifier_stats(target, ModelHandle.load(target), data, sample, 32)
    phi, ins, outs, names = mem.shadow_matrix(sample, target, mem.prepare(st_settings), st_settings, data)
    assert phi.shape == (len(sample.ids), N_MODELS - 1) and not any(n.startswith("model-00/") for n in names)
    assert (ins.sum(1) >= 3).all() and (outs.sum(1) >= 3).all() and not (ins & outs).any()
    # one shadow statistic by hand: logit-scaled confidence log p_y - log(1 - p_y) from its logits
    sh = shadow_set.checkpoints[1]
    model = load_classifier(sh)
    enc = ModelHandle.load(sh).tokenizer(sample.texts[0], truncation=True, max_length=48, return_tensors="pt")
    with torch.no_grad():
        p = torch.softmax(model(**enc).logits[0].double(), -1).numpy()
    y = sample.labels[0]
    assert phi[0, 0] == pytest.approx(np.log(p[y]) - np.log(1 - p[y]), abs=1e-4)
    # LiRA by hand: per example, Gaussians with the median as centre and the std of the IN / OUT values
    online, offline = [], []
    for i in range(len(sample.ids)):
        a, b = phi[i][ins[i]], phi[i][outs[i]]
        online.append(stats.norm.logpdf(target_stats.phi[i], np.median(a), np.std(a))
                      - stats.norm.logpdf(target_stats.phi[i], np.median(b), np.std(b)))
        offline.append(stats.norm.logcdf(target_stats.phi[i], np.median(b), np.std(b)))
    scores = mem.attack_scores(sample, target_stats, st_settings, shadows=(phi, ins, outs, names))
    assert scores["lira_online"] == pytest.approx(online, rel=1e-9)
    assert scores["lira_offline"] == pytest.approx(offline, rel=1e-9)
    # the runner's default for a target from the set: shadows thinned to equal IN/OUT counts first
    ins_eq, outs_eq = ma.equal_shadow_counts(ins, outs, st_settings.seed)
    assert len(set(ins_eq.sum(1))) == 1 and len(set(outs_eq.sum(1))) == 1
    thinned = mem.attack_scores(sample, target_stats, dataclasses.replace(st_settings, equal_counts=True),
                                shadows=(phi, ins, outs, names))
    online_eq = [stats.norm.logpdf(target_stats.phi[i], np.median(phi[i][ins_eq[i]]), np.std(phi[i][ins_eq[i]]))
                 - stats.norm.logpdf(target_stats.phi[i], np.median(phi[i][outs_eq[i]]), np.std(phi[i][outs_eq[i]]))
                 for i in range(len(sample.ids))]
    assert thinned["lira_online"] == pytest.approx(online_eq, rel=1e-9)
    assert auc.loc["lira_online", "value"] == pytest.approx(roc_auc_score(sample.is_member, online_eq), abs=1e-12)
    assert auc.loc["lira_offline", "value"] == pytest.approx(
        roc_auc_score(sample.is_member, thinned["lira_offline"]), abs=1e-12)
    assert auc.loc["loss", "value"] == pytest.approx(roc_auc_score(sample.is_member, -target_stats.nll), abs=1e-12)
    extra = auc.loc["lira_online", "extra"]
    extra = json.loads(extra) if isinstance(extra, str) else extra
    assert extra["scored_by"] == "classifier" and extra["setting"] == "finetune"
    # measured (this fixture, targets model 0 / 1 / 2): LOSS 0.926 / 0.884 / 0.781, LiRA online
    # 0.710 / 0.625 / 0.650, offline 0.767 / 0.667 / 0.771, online with one global deviation
    # 0.786 / 0.716 / 0.810: 8 shadows are few for per-example deviations (docs/membership.md)
    # each attack detects membership: its own 95% bootstrap CI lies above chance (how well attacks
    # recover a signal of known size is tests/test_membership.py's planted-signal test)
    assert (auc.loc[["loss", "lira_online", "lira_offline"], "ci_low"] > 0.5).all(), auc["ci_low"]


@pytest.mark.slow
def test_finetune_lira_needs_a_finetune_shadow_set(shadow_set, tmp_path):
    from probes.core import runner
    from workbench.store.results import ResultsStore

    target = shadow_set.checkpoints[0]
    record = json.loads((shadow_set.folder / "shadows.json").read_text())
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    (wrong / "shadows.json").write_text(json.dumps({**record, "kind": "pretrain",
                                                    "models": [{"checkpoint": str(c)} for c in shadow_set.checkpoints]}))
    settings = {"setting": "finetune", "tasks": ["attacks"], "attacks": ["lira"], "shadows": str(wrong),
                "baselines": [], "progress": False}
    with pytest.raises(ConfigError, match="pretrain shadow set"):
        runner.run_probe("membership", [target], settings, store=ResultsStore(tmp_path / "runs"))


@pytest.mark.slow
def test_finetune_shadows_follow_the_target_epoch(shadow_set):
    """A target saved at epoch 3 is compared with every shadow's epoch-3 checkpoint, not its last."""
    from probes import get_probe
    from workbench.store.checkpoints import read_manifest

    spec = get_probe("membership")
    settings = spec.settings(setting="finetune", tasks=("attacks",), attacks=("loss", "lira"),
                             shadows=str(shadow_set.folder), length_bin=4, baselines=())
    pool = shadow_set.record["pool"]["ids"]
    early = next(p for p in sorted(shadow_set.checkpoints[0].parent.glob("step-*")) if read_manifest(p)["epoch"] == 3)
    sample, data = mem.finetune_sample(early, 1000, 0, 4, within=pool)
    by_epoch = {}
    for target in (early, shadow_set.checkpoints[0]):
        phi, ins, _, names = mem.shadow_matrix(sample, target, mem.prepare(settings), settings, data)
        by_epoch[read_manifest(target)["epoch"]] = phi[ins].mean()
        assert [read_manifest(shadow_set.folder / n)["epoch"] for n in names] == [read_manifest(target)["epoch"]] * 8
    print("mean phi of IN shadows by epoch:", by_epoch)
    assert by_epoch[12] > by_epoch[3]  # the shadows memorise their halves as they train


def test_equal_shadow_counts_removes_the_balanced_design_bias():
    """A planted null: phi = per-model offset + per-example difficulty + noise, no memorisation. With
    the target taken from a balanced set (each example IN for 5 of 9), online LiRA reads below 0.5;
    thinned to equal IN/OUT counts per example it is back at 0.5."""
    from workbench.drivers.shadows import balanced_keep

    raw, equal = [], []
    for rep in range(40):
        rng = np.random.default_rng(rep)
        keep = balanced_keep(400, N_MODELS, rep)
        phi = rng.normal(0, 1, N_MODELS)[:, None] + rng.normal(0, 1, 400)[None, :] + rng.normal(0, 0.3, (N_MODELS, 400))
        ins, outs = keep[1:].T, ~keep[1:].T
        raw.append(roc_auc_score(keep[0], ma.lira_online(phi[0], phi[1:].T, ins, outs)))
        ins2, outs2 = ma.equal_shadow_counts(ins, outs, seed=rep)
        assert (ins2.sum(1) == 4).all() and (outs2.sum(1) == 3).all()
        assert not (ins2 & ~ins).any() and not (outs2 & ~outs).any()  # only drops shadows
        equal.append(roc_auc_score(keep[0], ma.lira_online(phi[0], phi[1:].T, ins2, outs2)))
    print(f"null LiRA online AUC: balanced {np.mean(raw):.3f}, equal counts {np.mean(equal):.3f}")
    # margins: 3 standard errors of the mean over these 40 draws (measured: 0.446, sd 0.040; 0.502, sd 0.034)
    se_raw, se_equal = (np.std(x, ddof=1) / np.sqrt(len(x)) for x in (raw, equal))
    assert np.mean(raw) < 0.5 - 3 * se_raw  # the bias is real
    assert abs(np.mean(equal) - 0.5) < 3 * se_equal  # and thinning removes it


def test_use_last_without_the_last_step_folder_is_a_config_error(tmp_path, monkeypatch):
    """`use: last` names the step folder of the last epoch; a run that did not save it stops with a
    ConfigError naming that folder (training stubbed: a result whose last epoch was not kept)."""
    from types import SimpleNamespace

    import workbench.drivers.finetune as ft
    from workbench.drivers.shadows import train_finetune_shadow_set

    monkeypatch.setattr(ft, "prepare", lambda cfg, data: SimpleNamespace(folder=tmp_path / "set" / "model-00"))
    monkeypatch.setattr(ft, "train_seed", lambda cfg, seed, run: SimpleNamespace(
        checkpoint=str(tmp_path / "best"), curve=[{"step": 30}], best_epoch=1, dev={"accuracy": 0.5}))
    cfg = {"checkpoint": str(tmp_path / "base"), "task": "sentence_polarity", "epochs": 2, "progress": False,
           "baselines": False}
    with pytest.raises(ConfigError, match=r"model 0's last-epoch checkpoint .*seed-0/step-0000030 is not a folder"):
        train_finetune_shadow_set(cfg, {"max_examples": 40, "seed": 0}, 2, tmp_path / "set", use="last",
                                  progress=False)
