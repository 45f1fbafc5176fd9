"""One (model, stack, task): `run_task` and the rows of each of its parts."""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

from probes.cloze.blank import blank_word, probe_words
from probes.cloze.finetune import finetune_mc, weighted_score
from probes.cloze.scoring import (accuracy_ci, content_free_word, lens_correct_rules, metric_name, reference_items,
                                  zero_shot_rules)
from probes.cloze.settings import FIXED_CHOICE_TASKS, Settings
from probes.core import baselines, fitting, runner
from probes.core.rows import probe_schema
from workbench.errors import CheckpointError
from workbench.running.lm_scores import LMScorer, lm_scorer

# The `extra` of the cloze probe's rows (checked when written, `workbench.store.rowschema`).
EXTRA_SCHEMA = probe_schema("cloze", optional={
    "methods": list, "items_with_multipiece_candidates": int, "head": str, "answer_counts": list, "scoring": str,
    "content_free_word": str, "domain_premise": str, "head_model": str, "train_size": int, "curve_seed": int,
    "steps": int, "train_sizes": list, "position": str, "blank": str})


def _scorer(unit) -> LMScorer | None:
    if "scorer" not in unit.state:
        try:
            unit.state["scorer"] = lm_scorer(unit.handle)
        except CheckpointError as e:
            unit.state["scorer"] = None
            unit.notes.setdefault("no_lm_head", []).append({"model": unit.model, "why": str(e)})
            unit.log(f"no LM head: zero-shot, lens and learning curves skipped ({e})")
    return unit.state["scorer"]


def run_task(unit: runner.Unit, prepared: runner.Prepared, task: str, settings: Settings) -> list[pd.DataFrame]:
    data = prepared.data[task]
    test = data["test"]
    K = len(test[0].choices)
    L = unit.handle.num_layers[unit.stack]
    last = [L]
    out: list[pd.DataFrame] = []
    # data-only and head-based rows once per model (with --stack all, on its first stack's unit)
    head_stack = unit.stack == unit.handle.stacks[0]
    scorer = _scorer(unit) if head_stack else None

    if not unit.is_twin and head_stack and "majority" in settings.baselines:
        _, maj = baselines.majority_baseline([it.answer for it in data["train"]], [it.answer for it in test])
        out.append(baselines.mark_baselines(unit.rows(task, {"majority_acc": [maj], "random_acc": [1.0 / K]}, split="test", layers=last,
                             n=len(test)), {"majority_acc": "majority", "random_acc": "chance"}))

    if scorer is not None and head_stack:
        premises: dict = {}  # the calibrated rules' reference scores, shared by the test items and their control
        real = zero_shot_rules(scorer, test, settings.batch_size, settings.scoring, premises)
        control = zero_shot_rules(scorer, data["nonsense"], settings.batch_size, settings.scoring, premises) \
            if settings.nonsense else {}
        out += [_zero_shot_rows(unit, scorer, test, task, settings, rule, real[rule], control.get(rule))
                for rule in settings.scoring]
        if settings.lens:
            lens = lens_correct_rules(scorer, test, settings.batch_size, settings.scoring)
            lens_control = lens_correct_rules(scorer, data["nonsense"], settings.batch_size, settings.scoring) \
                if settings.nonsense else {}
            out += [_lens_rows(unit, scorer, test, task, settings, rule, lens[rule], lens_control.get(rule))
                    for rule in settings.scoring]
        if settings.curve_sizes:
            out += _learning_curve(unit, scorer, data, task, settings)

    if settings.probe and task in FIXED_CHOICE_TASKS:
        out.extend(_blank_probe(unit, data, task, settings))
    return out



def _scoring_extra(scorer, rule: str, items) -> dict:
    """What a row says about its scoring rule: the rule, and for a calibrated rule the first
    item's reference context (`domain_premise`: contextual the content-free template, pmi_dc the
    task's domain premise; `probes.cloze.scoring`), contextual also its neutral word."""
    if rule == "raw":
        return {"scoring": rule}
    extra = {"scoring": rule, "domain_premise": reference_items(scorer, items[:1], rule)[0].text}
    return {**extra, "content_free_word": content_free_word(scorer)} if rule == "contextual" else extra


def _zero_shot_rows(unit, scorer, test, task, settings, rule: str, real, control) -> pd.DataFrame:
    """`zero_shot_acc` and `nonsense_acc` (another rule R: `zero_shot_R_acc`, `nonsense_R_acc`) with
    bootstrap CIs over items, by one scoring rule (`real`, `control`: its (correct, scores) on the
    test items and on their nonsense-word control, or None without the control). Each row's extra
    describes its own items' answers (`answer_counts`, methods)."""
    frames = [_accuracy_row(unit, scorer, test, task, settings, rule, metric_name("zero_shot_acc", rule), real)]
    if control is not None:
        frames.append(_accuracy_row(unit, scorer, test, task, settings, rule, metric_name("nonsense_acc", rule),
                                    control))
    return pd.concat(frames, ignore_index=True)


def _accuracy_row(unit, scorer, test, task, settings, rule: str, metric: str, result) -> pd.DataFrame:
    """One zero-shot accuracy row [CI] of (correct, scores), with how often each choice (by
    position) was the answer given: a prior shows as one dominant count."""
    correct, scores = result
    acc, lo, hi = accuracy_ci(correct, settings.n_boot, settings.seed)
    methods = sorted({m for ms in scores.method for m in ms})
    multi = int(sum(any(n > 1 for n in ns) for ns in scores.n_pieces))
    picks = np.bincount(np.asarray(scores.best()), minlength=max(len(c) for c in scores.scores)).tolist()
    return unit.rows(task, {metric: [acc]}, split="test", layers=[unit.handle.num_layers[unit.stack]], n=len(test),
                     ci={metric: ([lo], [hi])},
                     extra={"methods": methods, "items_with_multipiece_candidates": multi, "head": scorer.kind,
                            "answer_counts": picks, **_scoring_extra(scorer, rule, test)})


def _lens_rows(unit, scorer, test, task, settings, rule: str, lc, nc) -> pd.DataFrame:
    """Per layer: `lens_acc` on the test items and, with the language control, `lens_nonsense_acc`
    (the same items, nonsense words for the content words, answers unchanged) and
    `lens_nonsense_gap` = lens_acc - lens_nonsense_acc with a paired bootstrap CI over items (item i
    of the control is item i of the test set). A layer whose lens is above chance on the real items
    and at chance on the control reads the content; one that scores the same on both prefers a
    candidate word (or a surface cue) whatever the sentence says. At the last layer the two
    accuracies are zero_shot_acc and nonsense_acc (tested). With a calibrated `rule` R every layer's
    scores are calibrated by the same layer's reference scores, and the metrics are named
    lens_R_acc, lens_nonsense_R_acc, lens_nonsense_R_gap. `lc`, `nc`: the rule's [L+1, N]
    correctness on the test items and on their control (None without it)."""
    seed, n_boot = settings.seed, settings.n_boot
    name = lambda m: metric_name(m, rule)  # noqa: E731
    a, lo, hi = accuracy_ci(lc, n_boot, seed)
    metrics, ci = {name("lens_acc"): a}, {name("lens_acc"): (lo, hi)}
    if nc is not None:
        metrics[name("lens_nonsense_acc")], l2, h2 = accuracy_ci(nc, n_boot, seed)
        ci[name("lens_nonsense_acc")] = (l2, h2)
        metrics[name("lens_nonsense_gap")], l3, h3 = accuracy_ci(lc.astype(np.float64) - nc, n_boot, seed)
        ci[name("lens_nonsense_gap")] = (l3, h3)
    # ELECTRA: the generator's layers (its own head), which may differ in number from the
    # discriminator's; T5/BART: the decoder's layers
    rows = unit.rows(task, metrics, split="test", n=len(test), ci=ci,
                     extra={"head_model": type(scorer.model).__name__, **_scoring_extra(scorer, rule, test)})
    return rows.assign(stack="decoder") if scorer.kind == "seq2seq" else rows


def _learning_curve(unit, scorer, data, task, settings) -> list[pd.DataFrame]:
    """Per training size and fine-tuning seed one `curve_acc` row (extra train_size, curve_seed,
    steps), and per seed its `weighted_score` over the sizes (extra train_sizes, curve_seed). Per
    seed only: the mean, sd and maximum over seeds per size, and the weighted score of the mean
    curve (the mean of the seeds' scores: the score is linear in the accuracies), are computed when
    the rows are read (`probes.cloze.summary.curve_stats`, through `workbench.store.aggregate`)."""
    train, test = data["train"], data["test"]
    sizes = [n for n in settings.curve_sizes if n <= len(train)]
    if len(sizes) < len(settings.curve_sizes):
        unit.log(f"{task}: learning-curve sizes above {len(train)} train items skipped")
    per_seed = {s: [] for s in range(settings.curve_seeds)}  # seed -> its accuracy at each size
    for n in sizes:
        for s in range(settings.curve_seeds):
            rng = np.random.default_rng([settings.seed, n, s])
            sub = [train[i] for i in sorted(rng.choice(len(train), size=n, replace=False))]
            per_seed[s].append(finetune_mc(scorer, sub, test, steps=settings.curve_steps, lr=settings.curve_lr,
                                           seed=settings.seed * 1000 + s)["accuracy"])
            unit.log(f"{task}: fine-tuned on {n} items (seed {s}): test accuracy {per_seed[s][-1]:.3f}")
    L = unit.handle.num_layers[unit.stack]
    frames = [unit.rows(task, {"curve_acc": [accs[i]]}, split="test", layers=[L], n=len(test),
                        extra={"train_size": n, "curve_seed": s, "steps": settings.curve_steps})
              for i, n in enumerate(sizes) for s, accs in per_seed.items()]
    if sizes:
        frames += [unit.rows(task, {"weighted_score": [weighted_score(sizes, accs)]}, split="test", layers=[L],
                             n=len(test), extra={"train_sizes": sizes, "curve_seed": s}) for s, accs in per_seed.items()]
    return frames


def _blank_probe(unit, data, task, settings) -> list[pd.DataFrame]:
    causal = unit.stack == "decoder"
    tok = unit.handle.tokenizer
    feats, ys, keys = {}, {}, {}
    for s in ("train", "dev", "test"):
        sents, where = probe_words(data[s], tok, causal)
        digest = hashlib.sha256("\n".join(" ".join(w) for w in sents).encode()).hexdigest()[:12]
        acts = unit.activations(sents, dataset_key=f"cloze-{task}-{s}-{digest}")
        offsets = np.asarray(acts.sentence_offsets)
        feats[s] = np.asarray(acts.layers[:, offsets[:-1] + where], dtype=np.float32)
        ys[s] = np.array([it.answer for it in data[s]])
        keys[s] = [it.key for it in data[s]]
    K = len(data["test"][0].choices)
    res = fitting.fit_probe(feats["train"], ys["train"], feats["dev"], ys["dev"], num_classes=K, seed=settings.seed)
    correct = res.correct(feats["test"], ys["test"])
    a, lo, hi = accuracy_ci(correct, settings.n_boot, settings.seed)
    metrics, ci = {"probe_acc": a}, {"probe_acc": (lo, hi)}
    if "control" in settings.baselines:
        dist = baselines.label_distribution(ys["train"], K)
        yc = {s: baselines.control_labels(keys[s], dist, settings.seed) for s in ("train", "dev", "test")}
        rc = fitting.fit_probe(feats["train"], yc["train"], feats["dev"], yc["dev"], num_classes=K, seed=settings.seed)
        metrics["control_acc"] = rc.accuracy(feats["test"], yc["test"])
        metrics["selectivity"] = a - metrics["control_acc"]
    return [baselines.mark_baselines(unit.rows(task, metrics, split="test", n=len(data["test"]), ci=ci,
                      extra={"position": "last word" if causal else "blank", "blank": blank_word(tok)}), {"control_acc": ("control", "probe_acc")})]
