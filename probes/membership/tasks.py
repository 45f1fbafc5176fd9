"""One (model, stack, task): its sample, the attacks (with the reference model and LiRA's shadows)
and their rows, the layer probe and its model-free control (`run_task`)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from probes.core import runner
from probes.membership import attacks as ma
from probes.membership.samples import Sample, corpus_of, finetune_sample, pretrain_sample
from probes.membership.scores import Stats, classifier_stats, lm_stats, scored_by
from probes.membership.settings import CONTROL_TASK, REFERENCE_ATTACKS, Settings
from probes.membership.summary import summary
from workbench.errors import CheckpointError, ConfigError


def prepare(settings: Settings) -> runner.Prepared:
    """Samples depend on each checkpoint's manifest: built per checkpoint in `run_task`, memoised here."""
    return runner.Prepared(data={"samples": {}, "stats": {}}, notes={"membership_samples": {}})


def _sample_for(unit, prepared, settings: Settings) -> Sample:
    path = unit.checkpoint.path
    if path is None:
        raise CheckpointError(f"{unit.checkpoint.name}: membership needs a checkpoint folder with a manifest")
    memo = prepared.data["samples"]
    if settings.setting == "finetune":
        key = _finetune_key(path)
        if key not in memo:
            pool = loaded_shadow_set(prepared, settings).record["pool"]["ids"] if "lira" in settings.attacks else None
            memo[key] = finetune_sample(path, settings.n_examples, settings.seed, settings.length_bin, within=pool)
        sample, _ = memo[key]
    else:
        from workbench.store.checkpoints import read_manifest

        m = read_manifest(path) or {}
        window = unit.handle.max_length
        key = ("pretrain", settings.corpus or json.dumps(m.get("corpus"), sort_keys=True), window)
        if key not in memo:
            memo[key] = (pretrain_sample(path, settings.passage_words, settings.min_words, settings.n_examples,
                                         settings.seed, settings.corpus, settings.length_bin,
                                         fits=lambda texts: fits_window(unit.handle, texts)), None)
        sample = memo[key][0]
    info = dict(sample.info)  # the sample is shared by the steps of a run; the epochs are per checkpoint
    if settings.setting == "pretrain":
        info["epochs_seen"] = _epochs(m)
    prepared.notes["membership_samples"][unit.checkpoint.name] = info
    return sample


def fits_window(handle, texts: list[str]) -> np.ndarray:
    """Which texts the LM scorer takes whole: special tokens included, plus one for the start token
    a causal scorer may prepend (`lm_scores`)."""
    enc = handle.tokenizer(texts, add_special_tokens=True)["input_ids"]
    return np.array([len(ids) + 1 <= handle.max_length for ids in enc], dtype=bool)


def _finetune_key(checkpoint) -> tuple[str, str]:
    """The memo key of a fine-tuned checkpoint's (sample, task data) in `prepared.data["samples"]`."""
    return ("finetune", str(checkpoint))


def loaded_shadow_set(prepared, settings: Settings):
    """LiRA's shadow set (`settings.shadows`), loaded once per run and set (finetune: its pool bounds
    the sample; its models give the shadow matrix); its kind must match the setting."""
    from workbench.drivers.shadows import ShadowSet

    sets = prepared.data.setdefault("shadow_sets", {})
    if settings.shadows not in sets:
        sets[settings.shadows] = ShadowSet.load(settings.shadows)
    return _of_the_setting(sets[settings.shadows], settings)


def _of_the_setting(sset, settings: Settings):
    """The shadow set, refused when its kind is not the setting's."""
    if sset.kind != settings.setting:
        raise ConfigError(f"{settings.shadows}: a {sset.kind} shadow set; the {settings.setting} setting needs a "
                          f"{settings.setting} one")
    return sset


def shadow_checkpoints(settings: Settings) -> list[Path]:
    """Every checkpoint LiRA may read from the shadow set (the runner's lazy `shadows` role: it
    resolves and hashes them into each unit's resume key, `shadow_matrix` loads them one at a time):
    each model's recorded checkpoint and, for fine-tuned shadows, every step folder of its run
    (`_at_epoch` picks the one at the target's epoch, which depends on the unit)."""
    from workbench.store.checkpoints import list_steps
    from workbench.drivers.shadows import ShadowSet

    sset = _of_the_setting(ShadowSet.load(settings.shadows), settings)
    out = []
    for ck in sset.checkpoints:
        out.append(ck)
        if sset.kind == "finetune":
            out += [step for _, step in list_steps(ck.parent)]
    return out


def _epochs(manifest: dict) -> float | None:
    """Passes over the training split when the checkpoint was saved (tokens seen / train tokens)."""
    seen, total = manifest.get("tokens_seen"), (manifest.get("corpus") or {}).get("train_tokens")
    return round(seen / total, 4) if seen is not None and total else None


def _stats(handle, checkpoint, sample: Sample, prepared, settings: Settings) -> Stats:
    if settings.setting == "finetune":
        _, data = prepared.data["samples"][_finetune_key(checkpoint)]
        return classifier_stats(checkpoint, handle, data, sample, settings.batch_size)
    return lm_stats(handle, sample.texts, settings.batch_size, moments="minkpp" in settings.attacks,
                    progress=settings.progress, electra_head=settings.electra_head)


def reference_stats(unit, sample: Sample, prepared, settings: Settings) -> Stats:
    """The reference model's statistics on the sample; the model is the runner's `reference` role
    (`settings.reference`, loaded once per run)."""
    h = unit.roles["reference"]
    key = ("reference", h.checkpoint_hash, sample.key)
    if key not in prepared.data["stats"]:
        path = h.path
        if settings.setting == "finetune":
            _, data = finetune_sample(path, settings.n_examples, settings.seed, settings.length_bin)
            prepared.data["stats"][key] = classifier_stats(path, h, data, sample, settings.batch_size)
        else:
            prepared.data["stats"][key] = lm_stats(h, sample.texts, settings.batch_size, moments=False,
                                                   electra_head=settings.electra_head)
    return prepared.data["stats"][key]


def shadow_matrix(sample: Sample, target_path: Path, prepared, settings: Settings, data=None, shadows=None):
    """[n, S] shadow statistics phi and IN/OUT masks from each shadow's own manifest (pretrain: its
    corpus split; finetune: its splits.json, `workbench.drivers.finetune.members`); shadows from the
    target's training run are left out. `data`: the task (finetune). `shadows`: the runner's
    `shadows` role (`runner.RoleCheckpoint`s, hashed into the resume key), from which each shadow
    is loaded when it is read and let go after (resolved here the runner's way when not given).
    Returns (phi, in_mask, out_mask, shadow names)."""
    key = ("shadows", settings.shadows, sample.key, str(target_path))
    if key in prepared.data["stats"]:
        return prepared.data["stats"][key]
    if shadows is None:
        shadows = runner.load_roles(PROBE, {"shadows": runner.resolve_roles(PROBE, settings)["shadows"]})["shadows"]
    resolved = {Path(c.path).resolve(): c for c in shadows}
    sset = loaded_shadow_set(prepared, settings)
    target_run = Path(target_path).resolve().parent
    epoch = _finetune_epoch(target_path) if settings.setting == "finetune" else None
    phis, ins, outs, names = [], [], [], []
    for ck in sset.checkpoints:
        if ck.resolve().parent == target_run:
            continue
        if epoch is not None:
            ck = _at_epoch(ck, epoch)
        if ck.resolve() not in resolved:  # the role lists every checkpoint this loop may pick
            raise RuntimeError(f"{ck}: a shadow the runner's shadows role did not resolve (so not in the resume key)")
        h = resolved[ck.resolve()].load()
        if settings.setting == "finetune":
            from workbench.drivers.finetune import members

            mem_ids, non_ids = (set(x) for x in members(ck))
            st = classifier_stats(ck, h, data, sample, settings.batch_size)
            phis.append(st.phi)
            ins.append([d in mem_ids for d in sample.doc_ids])
            outs.append([d in non_ids for d in sample.doc_ids])
            names.append(str(ck.relative_to(sset.folder)))
            continue
        corpus, _ = corpus_of(ck)
        train, held = set(corpus.doc_ids("train")), set(corpus.doc_ids("heldout"))
        st = lm_stats(h, sample.texts, settings.batch_size, moments=False, electra_head=settings.electra_head)
        phis.append(st.phi)
        ins.append([d in train for d in sample.doc_ids])
        outs.append([d in held for d in sample.doc_ids])
        names.append(str(ck.relative_to(sset.folder)))
    if len(names) < 2:
        raise ConfigError(f"{settings.shadows}: {len(names)} shadow model(s) besides the target; LiRA needs more")
    out = (np.array(phis).T, np.array(ins).T, np.array(outs).T, names)
    prepared.data["stats"][key] = out
    return out


def target_in_shadow_set(target_path, sset) -> bool:
    """True when the target checkpoint comes from one of the set's own training runs (its folder,
    or an earlier step of it): then every example's IN/OUT shadow counts are tied to its membership."""
    run = Path(target_path).resolve().parent
    return any(ck.resolve().parent == run for ck in sset.checkpoints)


def _finetune_epoch(checkpoint) -> int | None:
    from workbench.store.checkpoints import read_manifest

    return (read_manifest(checkpoint) or {}).get("epoch")


def _at_epoch(checkpoint: Path, epoch: int) -> Path:
    """A fine-tuned shadow at the target's epoch: the step folder of its seed run saved at that epoch
    (`keep_epoch_checkpoints`, which `use: last` sets), so that a sweep over the target's epochs
    compares it with shadows trained as long; the recorded checkpoint when the run kept none."""
    from workbench.store.checkpoints import list_steps

    if _finetune_epoch(checkpoint) == epoch:
        return checkpoint
    for _, step in list_steps(Path(checkpoint).parent):
        if _finetune_epoch(step) == epoch:
            return step
    return checkpoint


def attack_scores(sample: Sample, st: Stats, settings: Settings, ref: Stats | None = None,
                  shadows=None) -> dict[str, np.ndarray]:
    """Every requested attack's membership score per example (higher = member)."""
    out: dict[str, np.ndarray] = {}
    for attack in settings.attacks:
        if attack == "loss":
            out["loss"] = ma.loss_score(st.nll)
        elif attack == "zlib":
            out["zlib"] = ma.zlib_score(st.nll, sample.texts)
        elif attack in ("reference_diff", "reference"):  # `reference`: the old name (same score; rows reference_diff)
            out["reference_diff"] = ma.reference_diff_score(st.nll, ref.nll)
        elif attack == "reference_ratio":
            out["reference_ratio"] = ma.reference_ratio_score(st.nll, ref.nll)
        elif attack == "mink":
            for k in settings.mink_ratios:
                out[f"mink_{round(k * 100):d}"] = np.array([ma.mink_score(lp, k) for lp in st.logprobs])
        elif attack == "minkpp":
            for k in settings.mink_ratios:
                out[f"minkpp_{round(k * 100):d}"] = np.array(
                    [ma.minkpp_score(lp, m, s, k) for lp, m, s in zip(st.logprobs, st.mu, st.sigma)])
        elif attack == "lira":
            phi, ins, outs, _ = shadows
            usable = (ins.sum(1) >= 1) & (outs.sum(1) >= 1)
            if not usable.all():
                raise ConfigError(f"{settings.shadows}: {int((~usable).sum())} examples lack an IN or OUT shadow "
                                  f"(the shadow pool must cover the target's examples)")
            if settings.equal_counts:
                ins, outs = ma.equal_shadow_counts(ins, outs, settings.seed)
            out["lira_online"] = ma.lira_online(st.phi, phi, ins, outs, fix_variance=settings.fix_variance)
            out["lira_offline"] = ma.lira_offline(st.phi, phi, ins, outs, fix_variance=settings.fix_variance)
    return out


def _model_rows(unit, task: str, metrics: dict, n: int, ci=None, extra=None) -> pd.DataFrame:
    """A whole-model score (layer NA): `Unit.rows` with one scalar per metric."""
    one = lambda v: np.asarray(v).item()  # noqa: E731
    return unit.rows(task, {k: one(v) for k, v in metrics.items()}, split="test", n=n, extra=extra,
                     ci={k: (one(lo), one(hi)) for k, (lo, hi) in (ci or {}).items()} or None)


def metric_rows(unit, scores: dict[str, np.ndarray], sample: Sample, settings: Settings,
                how: str | None = None) -> list[pd.DataFrame]:
    frames = []
    for attack, s in scores.items():
        r = ma.roc_metrics(s, sample.is_member, n_boot=settings.n_boot, seed=settings.seed, units=sample.doc_ids)
        pts = ma.roc_points(r, settings.max_roc_points)
        base = {"attack": attack, "setting": settings.setting, "n_members": r.n_members, "n_nonmembers": r.n_nonmembers,
                "documents": documents_per_group(sample.doc_ids, sample.is_member), "ci_units": "documents",
                "scored_by": how}
        frames.append(_model_rows(unit, attack, {"auc": [r.auc]}, len(s), ci={"auc": ([r.auc_ci[0]], [r.auc_ci[1]])},
                                  extra={**base, "roc_fpr": [p[0] for p in pts], "roc_tpr": [p[1] for p in pts],
                                         "sign": "higher score = member"}))
        for x, name in ((0.01, "tpr_fpr_1pct"), (0.001, "tpr_fpr_0.1pct")):
            frames.append(_model_rows(unit, attack, {name: [r.tpr_at[x]]}, len(s),
                                      extra={**base, "fpr": x, "fp_allowed": r.fp_allowed[x], "note": r.fpr_note(x)}))
        frames.append(_model_rows(unit, attack, {"balanced_acc": [r.balanced_accuracy]}, len(s),
                                  extra={**base, "threshold": "best on these scores (optimistic)"}))
    return frames


def documents_per_group(doc_ids, is_member) -> dict[str, int]:
    """Distinct documents among the members and among the non-members (what the CIs resample)."""
    docs, y = np.asarray(doc_ids), np.asarray(is_member, dtype=bool)
    return {"members": len(set(docs[y])), "nonmembers": len(set(docs[~y]))}


def layer_probe_rows(unit, sample: Sample, settings: Settings) -> list[pd.DataFrame]:
    """Linear probe per layer on mean-pooled passage vectors, half the documents train, half test
    (`ma.grouped_split`); AUC CIs resample the test documents, with the same resamples for every
    layer (paired); plus the model-free TF-IDF control on the same split (not for the twin: it reads
    no model, so it would repeat the checkpoint's row)."""
    from probes.core.statistics import auc_bootstrap
    from probes.core.fitting import fit_probe

    words = [t.split() for t in sample.texts]
    acts = unit.activations(words, dataset_key=f"membership-{sample.key}", pooling="mean")
    off = np.asarray(acts.sentence_offsets)
    X = np.stack([np.add.reduceat(np.asarray(acts.layers[li]), off[:-1], axis=0) / np.diff(off)[:, None]
                  for li in range(acts.layers.shape[0])]).astype(np.float32)
    y = sample.is_member.astype(np.int64)
    train = ma.grouped_split(sample.doc_ids, y, settings.seed)
    test_docs = np.asarray(sample.doc_ids)[~train]
    res = fit_probe(X[:, train], y[train], num_classes=2, seed=settings.seed, early_stopping=False)
    logp = res.log_proba(X[:, ~train])  # [L, N_test, 2]
    aucs, lo, hi, acc = [], [], [], []
    for li in range(X.shape[0]):
        a, low, high = auc_bootstrap(logp[li, :, 1] - logp[li, :, 0], y[~train], units=test_docs,
                                     n_boot=settings.n_boot, seed=settings.seed)
        aucs.append(a)
        lo.append(low)
        hi.append(high)
        acc.append(float((logp[li].argmax(-1) == y[~train]).mean()))
    extra = {"n_train": int(train.sum()), "pooling": "mean of word means", "split": "by document",
             "documents_train": documents_per_group(np.asarray(sample.doc_ids)[train], y[train] == 1),
             "documents": documents_per_group(test_docs, y[~train] == 1), "ci_units": "documents"}
    frames = [unit.rows("layer_probe", {"auc": aucs, "accuracy": acc}, split="test", n=int((~train).sum()),
                        ci={"auc": (lo, hi)}, extra=extra)]
    if not unit.is_twin:
        scores = ma.tfidf_control_scores(sample.texts, y == 1, train, seed=settings.seed)
        a, low, high = auc_bootstrap(scores, y[~train], units=test_docs, n_boot=settings.n_boot, seed=settings.seed)
        frames.append(_model_rows(unit, CONTROL_TASK, {"auc": [a]}, int((~train).sum()), ci={"auc": ([low], [high])},
                                  extra={**extra, "baseline": "model_free_tfidf",
                                         "what": "TF-IDF + logistic regression on the texts alone (no model)"}))
    return frames


def run_task(unit: runner.Unit, prepared: runner.Prepared, task: str, settings: Settings) -> list[pd.DataFrame]:
    sample = _sample_for(unit, prepared, settings)
    if task == "layers":
        return layer_probe_rows(unit, sample, settings)
    if unit.is_twin and settings.setting == "finetune":
        # the classifier (body + head) is read from the checkpoint folder; a random body under a
        # trained head is no model anyone trained, so the twin is the layer probe's baseline only
        unit.notes["twin_attacks"] = "finetune: attacks not run for random-init twins (layer probe only)"
        unit.log("finetune setting: attacks are not run for the random-init twin")
        return []
    try:
        st = _stats(unit.handle, unit.checkpoint.path, sample, prepared, settings)
    except CheckpointError as e:
        if not unit.is_twin:
            raise
        unit.notes.setdefault("no_lm_head", []).append({"model": unit.model, "why": str(e)})
        unit.log(f"no LM head, attacks skipped for the twin ({e})")
        return []
    ref = reference_stats(unit, sample, prepared, settings) if set(settings.attacks) & set(REFERENCE_ATTACKS) else None
    shadows = None
    if "lira" in settings.attacks:
        if unit.is_twin:
            settings_twin = [a for a in settings.attacks if a != "lira"]
            unit.log("LiRA is not run for the random-init twin (its shadows would be random models too)")
            import dataclasses

            settings = dataclasses.replace(settings, attacks=tuple(settings_twin))
        else:
            data = (prepared.data["samples"][_finetune_key(unit.checkpoint.path)][1]
                    if settings.setting == "finetune" else None)
            shadows = shadow_matrix(sample, unit.checkpoint.path, prepared, settings, data, unit.roles["shadows"])
            unit.notes.setdefault("lira_shadows", {})[unit.checkpoint.name] = shadows[3]
            if settings.equal_counts is None:  # auto: thin the counts exactly when the design ties them
                import dataclasses

                in_set = target_in_shadow_set(unit.checkpoint.path, loaded_shadow_set(prepared, settings))
                settings = dataclasses.replace(settings, equal_counts=in_set)
                unit.notes.setdefault("lira_equal_counts", {})[unit.checkpoint.name] = in_set
    how = "classifier" if settings.setting == "finetune" else scored_by(unit.handle, settings.electra_head)
    unit.notes.setdefault("lm_score", {})[unit.model] = how
    scores = attack_scores(sample, st, settings, ref, shadows)
    return metric_rows(unit, scores, sample, settings, how)


# The probe's registry entry (`probes.PROBES`, re-exported by the package): here beside `prepare` and
# `run_task`, so that `shadow_matrix` reads its roles without importing the package (no import circle).
NAME = "membership"
TASKS = ("attacks", "layers")


def _twin_same_for_every_step(settings: Settings) -> bool:
    """Pretraining: the steps of a run share the sample (one corpus split) and the twin runs no LiRA,
    so its rows are the same beside every step. Fine-tuning: kept per epoch (conservative)."""
    return settings.setting == "pretrain"


PROBE = runner.ProbeSpec(name=NAME, tasks=TASKS, settings=Settings, prepare=prepare, run_task=run_task,
                         description="membership inference from manifests: LOSS, zlib, reference, Min-K%, Min-K%++, "
                                     "LiRA; layer-wise membership probe",
                         summary=summary, twin_once_per_run=_twin_same_for_every_step,
                         version=4,  # 2: the layer probe's default fit of issue 42 (auto by words x features); 3: L-BFGS to its tolerances (issue 49); 4: the Adam fit's L-BFGS polish (issue 49)
                         roles={"reference": runner.Role("reference", used=lambda s: bool(set(s.attacks) & set(REFERENCE_ATTACKS))),
                                "shadows": runner.Role("shadows", many=True, lazy=True, checkpoints=shadow_checkpoints,
                                                       used=lambda s: "lira" in s.attacks)})
