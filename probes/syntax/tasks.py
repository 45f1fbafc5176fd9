"""The syntax tasks on one (model, stack): the classification probes and the structural probes."""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from probes.core import baselines, depth, fitting, mdl, runner, scalar_mix, statistics as stats
from probes.syntax import structural as st
from probes.syntax.features import FeatureView, sentence_rows
from probes.syntax.items import build_edge_control_items, build_items
from probes.syntax.prepare import SplitPlan, SyntaxData
from probes.syntax.settings import SyntaxSettings
from workbench.errors import ConfigError


EXTRACTION_COUNTS = ("sentences", "words", "windowed_sentences", "windows", "words_cut_by_window",
                     "empty_sentences", "no_subword_words")  # fmt: skip



# --------------------------------------------------------------------------- fitting helpers
def encode_labels(labels: Sequence[str], vocab: dict[str, int]) -> np.ndarray:
    """Label strings -> indices; a label unseen in training gets len(vocab) (never counted correct)."""
    unk = len(vocab)
    return np.fromiter((vocab.get(l, unk) for l in labels), dtype=np.int64, count=len(labels))


def layers_per_fit(n_layers: int, n_items: int, dim: int, budget_bytes: float) -> int | None:
    """Layers per batched fit so that one group's float32 features stay under the budget."""
    per_layer = max(1, n_items * dim * 4)
    k = int(budget_bytes // per_layer)
    return None if k >= n_layers else max(1, k)


def length_averaged_ci(values: np.ndarray, lengths: np.ndarray, n_boot: int, seed: int):
    """Bootstrap CI of a statistic averaged within sentence lengths, then over lengths 5-50
    (Hewitt & Manning's DSpr/NSpr). values [L, S] per-sentence scores (NaN = not counted).
    Sentences are resampled with `statistics.resample_counts`: the same resamples as the sentence
    bootstrap of the accuracies (same seed, same sentences)."""
    values = np.asarray(values, dtype=np.float64)
    lo, hi = st.SPEARMAN_LENGTHS
    ok = np.isfinite(values) & ((lengths >= lo) & (lengths <= hi))[None]
    s = values.shape[1]
    if s == 0 or not ok.any():
        nan = np.full(values.shape[0], np.nan)
        return nan, nan
    uniq, group = np.unique(lengths, return_inverse=True)
    onehot = np.zeros((s, len(uniq)))
    onehot[np.arange(s), group] = 1.0
    boots = []
    for counts in stats.resample_counts(s, n_boot, seed):  # [B, S]
        per_layer = []
        for l in range(values.shape[0]):
            w = counts * ok[l][None]
            num = (w * np.where(ok[l], values[l], 0.0)[None]) @ onehot  # [B, lengths]
            den = w @ onehot
            with np.errstate(invalid="ignore", divide="ignore"):
                means = num / den
            with warnings.catch_warnings():  # a resample may miss every sentence of a length
                warnings.simplefilter("ignore", RuntimeWarning)
                per_layer.append(np.nanmean(np.where(den > 0, means, np.nan), axis=1))
        boots.append(np.stack(per_layer, axis=1))
    return stats.percentile_interval(np.concatenate(boots))



# --------------------------------------------------------------------------- one model, one stack
@dataclass
class _Context:
    """Everything the task functions share for one (model, stack)."""

    unit: Any  # runner.Unit
    plan: SplitPlan
    train_acts: Any
    eval_acts: Any
    settings: SyntaxSettings
    extra: dict[str, Any]

    @property
    def notes(self) -> dict[str, Any]:
        return self.unit.notes

    @property
    def timings(self) -> dict[str, float]:
        return self.unit.timings

    @property
    def is_twin(self) -> bool:
        return self.unit.is_twin

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def n_boot(self) -> int:
        return self.settings.n_boot

    @property
    def progress(self) -> bool:
        return self.settings.progress

    @property
    def baselines(self) -> tuple[str, ...]:
        return self.settings.baselines

    @property
    def memory_budget(self) -> float:
        return self.settings.memory_budget_gb * 2**30


def make_context(unit, prepared: runner.Prepared, settings: SyntaxSettings) -> _Context:
    """The unit's activations (extracted once, cached on disk) and shared settings, memoised on the unit."""
    if "ctx" not in unit.state:
        d: SyntaxData = prepared.data
        t0 = time.perf_counter()
        tr = unit.activations(d.train_words, d.train_key, pooling=settings.pooling)
        ev = unit.activations(d.eval_words, d.eval_key, pooling=settings.pooling)
        unit.log(f"extraction {time.perf_counter() - t0:.1f} s")
        plan = d.plan
        unit.notes["extraction"][unit.key] = {
            plan.train_split if plan.train_split != plan.eval_split else "train_pool": _counts(tr.stats),
            plan.eval_split: _counts(ev.stats)}  # fmt: skip
        extra = {"treebank": settings.treebank, "train_split": plan.train_split, "pooling": settings.pooling,
                 "probe_seed": settings.seed}
        unit.state["ctx"] = _Context(unit, plan, tr, ev, settings, extra)
    return unit.state["ctx"]




def _rows(ctx: _Context, task: str, metrics, *, split=None, layers=None, n=None, ci=None, extra=None):
    """`extra`: one dict for every row, or a list with one per layer."""
    merged = [dict(ctx.extra, **e) for e in extra] if isinstance(extra, list) else dict(ctx.extra, **(extra or {}))
    return ctx.unit.rows(task, metrics, split=split or ctx.plan.eval_split, layers=layers, n=n, ci=ci, extra=merged)


def fit_classification_task(ctx: _Context, task: str) -> list[pd.DataFrame]:
    """Rows of one classification task (UPOS, XPOS, deprel, arc): every probe kind on every layer, with
    its control task and MDL / scalar mix where the settings ask for them."""
    plan = ctx.plan
    t_off, e_off = ctx.train_acts.sentence_offsets, ctx.eval_acts.sentence_offsets
    seed = ctx.seed
    fit = build_items(task, plan.train, t_off, plan.fit, seed, ctx.settings.deprel_subtypes)
    stop = build_items(task, plan.train, t_off, plan.stop, seed, ctx.settings.deprel_subtypes)
    ev = build_items(task, plan.eval, e_off, None, seed, ctx.settings.deprel_subtypes)
    ctx.notes.setdefault("pairs" if task in ("deprel", "arc") else "items", {})[task] = {
        "fit": fit.counts, "stop": stop.counts, "eval": ev.counts}  # fmt: skip
    if len(fit) == 0 or len(ev) == 0:
        raise ConfigError(f"task {task}: no training or evaluation items")
    vocab = {l: i for i, l in enumerate(sorted(set(fit.labels)))}
    c = len(vocab)
    y_fit, y_stop, y_ev = encode_labels(fit.labels, vocab), encode_labels(stop.labels, vocab), encode_labels(ev.labels, vocab)
    known = y_ev < c
    unseen = int((~known).sum())
    if unseen:
        ctx.notes.setdefault("unseen_eval_labels", {})[task] = unseen
    product = ctx.settings.pair_features == "concat_product" and task in ("deprel", "arc")
    x_fit = FeatureView(ctx.train_acts.layers, fit.cols, product)
    x_stop = FeatureView(ctx.train_acts.layers, stop.cols, product)
    x_ev = FeatureView(ctx.eval_acts.layers, ev.cols, product)
    n_layers = x_fit.shape[0]
    layer_batch = layers_per_fit(n_layers, len(fit), x_fit.shape[2], ctx.memory_budget)
    out = []
    extra = {"n_train": len(fit), "num_classes": c, "unseen_eval_labels": unseen}
    if task in ("deprel", "arc"):
        extra["pair_features"] = "concat_product" if product else "concat"
    # Control labels: one draw per type from the train label distribution, same for every split;
    # for arcs under Hewitt & Liang's edge control, items of their own (`_edge_control`).
    want_control = "control" in ctx.baselines
    edge_control = want_control and task == "arc" and ctx.settings.arc_control == "hewitt_liang"
    if edge_control:
        cx, ctrl, csent = _edge_control(ctx, vocab, product)
    elif want_control:
        dist = baselines.label_distribution(y_fit, c)
        ctrl = [baselines.control_labels(items.types, dist, seed) for items in (fit, stop, ev)]
        cx, csent = [x_fit, x_stop, x_ev], ev.sentence
    cextra = {"control_task": "hewitt_liang_edges"} if edge_control else {}
    for kind in ctx.settings.classifier:
        prefix = "" if kind == "linear" else f"{kind}_"
        cfg = dict(ctx.settings.probe_config, kind=kind, seed=seed, layer_batch=layer_batch, progress=ctx.progress)
        t0 = time.perf_counter()
        res = fitting.fit_probe(x_fit, y_fit, x_stop, y_stop, num_classes=c + 1, config=cfg)
        correct = res.correct(x_ev, y_ev) & known[None]
        acc, lo, hi, boot = stats.ratio_bootstrap(correct, None, ev.sentence, n_boot=ctx.n_boot, seed=seed, return_boot=True)
        # accuracy rows keep their paired bootstrap replicates (extra.boot): CIs of where in depth (probes.core.depth)
        out.append(_rows(ctx, task, {f"{prefix}accuracy": acc}, n=len(ev), ci={f"{prefix}accuracy": (lo, hi)},
                         extra=depth.boot_extras(boot, dict(extra, classifier=kind))))
        metrics = {f"{prefix}train_accuracy": res.train_accuracy}
        cis = {}
        if want_control:
            cres = fitting.fit_probe(cx[0], ctrl[0], cx[1], ctrl[1], num_classes=c, config=cfg)
            ccorrect = cres.correct(cx[2], ctrl[2])
            cacc, clo, chi = stats.ratio_bootstrap(ccorrect, None, csent, n_boot=ctx.n_boot, seed=seed)
            if edge_control:  # two item sets of the same sentences: a paired difference of accuracies
                sel, slo, shi = paired_accuracy_difference(correct, ev.sentence, ccorrect, csent, ctx.n_boot, seed)
            else:
                sel, slo, shi = stats.ratio_bootstrap(correct.astype(np.float64) - ccorrect, None, ev.sentence,
                                                      n_boot=ctx.n_boot, seed=seed)
            metrics.update({f"{prefix}control_accuracy": cacc, f"{prefix}selectivity": sel})
            cis.update({f"{prefix}control_accuracy": (clo, chi), f"{prefix}selectivity": (slo, shi)})
        ctx.timings[f"{task}:{kind}"] = round(time.perf_counter() - t0, 3)
        out.append(baselines.mark_baselines(_rows(ctx, task, metrics, n=len(ev), ci=cis,
                                                  extra=dict(extra, classifier=kind, **cextra)),
                                         {f"{prefix}control_accuracy": ("control", f"{prefix}accuracy")}))
    if "majority" in ctx.baselines and not ctx.is_twin:
        _, maj = baselines.majority_baseline(y_fit, y_ev)
        out.append(baselines.mark_baselines(_rows(ctx, task, {"majority": np.full(n_layers, maj)}, n=len(ev), extra=extra),
                                         {"majority": ("majority", "accuracy")}))
    if task in ctx.settings.mdl_tasks:
        t0 = time.perf_counter()
        idx = np.arange(len(fit))
        if ctx.settings.mdl_max_examples is not None and len(fit) > ctx.settings.mdl_max_examples:
            idx = np.sort(np.random.default_rng([seed, 2]).choice(len(fit), ctx.settings.mdl_max_examples, replace=False))
        x_mdl = FeatureView(ctx.train_acts.layers, [c_[idx] for c_ in fit.cols], product)
        kind = ctx.settings.mdl_probe  # linear, or Voita & Titov's MLP probe (rows prefixed "mlp_")
        prefix = "" if kind == "linear" else f"{kind}_"
        cfg = dict(ctx.settings.probe_config, kind=kind, seed=seed, layer_batch=layer_batch, progress=ctx.progress)
        kw = {"fractions": ctx.settings.mdl_fractions} if ctx.settings.mdl_fractions else {}
        code = mdl.mdl_online_code(x_mdl, y_fit[idx], num_classes=c, config=cfg, seed=seed, **kw)
        out.append(_rows(ctx, task, {f"{prefix}mdl_codelength": code.online_codelength,
                                     f"{prefix}compression": code.compression},
                         split=f"{plan.train_split}:fit", n=code.num_examples,
                         extra=dict(extra, uniform_codelength=code.uniform_codelength)))
        ctx.timings[f"{task}:mdl"] = round(time.perf_counter() - t0, 3)
    if task in ctx.settings.scalar_mix_tasks:
        t0 = time.perf_counter()
        cfg = dict(ctx.settings.probe_config, kind="linear", seed=seed, progress=ctx.progress)
        cfg.pop("layer_batch", None)
        mix = scalar_mix.fit_scalar_mix(x_fit, y_fit, x_stop, y_stop, num_classes=c + 1, config=cfg)
        split = f"{plan.train_split}:stop"
        out.append(_rows(ctx, task, {"scalar_mix_weight": mix.weights, "cumulative_accuracy": mix.cumulative_dev_accuracy},
                         split=split, n=len(stop), extra=extra))
        out.append(_rows(ctx, task, {"centre_of_gravity": [mix.centre_of_gravity], "expected_layer": [mix.expected_layer],
                                     "scalar_mix_accuracy": [mix.dev_accuracy]},
                         split=split, layers=[0], n=len(stop), extra=extra).assign(layer=pd.NA))
        ctx.timings[f"{task}:scalar_mix"] = round(time.perf_counter() - t0, 3)
    return out


def _edge_control(ctx: _Context, vocab: dict[str, int], product: bool):
    """The arc task's control under Hewitt & Liang (2019)'s edge control task
    (`items.build_edge_control_items`) on the fit / stop / eval sentences: (features, labels, eval
    sentence ids), the item counts in the run notes."""
    plan, seed = ctx.plan, ctx.seed
    t_off, e_off = ctx.train_acts.sentence_offsets, ctx.eval_acts.sentence_offsets
    sets = [build_edge_control_items(plan.train, t_off, plan.fit, seed),
            build_edge_control_items(plan.train, t_off, plan.stop, seed),
            build_edge_control_items(plan.eval, e_off, None, seed)]
    ctx.notes.setdefault("pairs", {}).setdefault("arc", {})["hewitt_liang_control"] = {
        name: items.counts for name, items in zip(("fit", "stop", "eval"), sets)}
    acts = (ctx.train_acts.layers, ctx.train_acts.layers, ctx.eval_acts.layers)
    x = [FeatureView(a, items.cols, product) for a, items in zip(acts, sets)]
    return x, [encode_labels(items.labels, vocab) for items in sets], sets[2].sentence


def paired_accuracy_difference(correct_a, units_a, correct_b, units_b, n_boot: int, seed: int):
    """acc_a - acc_b ([L] each, items [L, N_a] and [L, N_b] correct or not) with a percentile CI from
    one bootstrap over the units (sentences) of both item sets: each set's accuracy is computed on
    the same resamples (every item set sees the union of units; a unit without items of a set adds
    nothing to it), so the replicates pair."""
    a, b = np.asarray(correct_a, dtype=np.float64), np.asarray(correct_b, dtype=np.float64)
    units = np.concatenate([np.asarray(units_a), np.asarray(units_b)])
    na, nb = a.shape[-1], b.shape[-1]
    out = []
    for num, den in ((np.concatenate([a, np.zeros(a.shape[:-1] + (nb,))], axis=-1), np.r_[np.ones(na), np.zeros(nb)]),
                     (np.concatenate([np.zeros(b.shape[:-1] + (na,)), b], axis=-1), np.r_[np.zeros(na), np.ones(nb)])):
        point, _, _, boot = stats.ratio_bootstrap(num, den, units, n_boot=n_boot, seed=seed, return_boot=True)
        out.append((point, boot))
    diff = out[0][1] - out[1][1]
    lo, hi = stats.percentile_interval(diff)
    return out[0][0] - out[1][0], lo, hi


def tree_set(acts, sentences, ids=None) -> st.TreeSet:
    """The structural probes' `TreeSet` of the given sentences (all when `ids` is None) of `acts`."""
    if ids is None:
        return st.TreeSet(acts.layers, np.asarray(acts.sentence_offsets), [np.asarray(s.heads) for s in sentences],
                          [s.upos for s in sentences])
    rows, offsets = sentence_rows(acts.sentence_offsets, ids)
    chosen = [sentences[i] for i in ids]
    return st.TreeSet(FeatureView(acts.layers, [rows]), offsets, [np.asarray(s.heads) for s in chosen],
                      [s.upos for s in chosen])


def fit_structural_task(ctx: _Context, task: str) -> list[pd.DataFrame]:
    """Rows of a structural probe (Hewitt & Manning's distance or depth) on every layer."""
    plan, seed = ctx.plan, ctx.seed
    fit_ids = plan.fit
    cap = ctx.settings.structural_max_train_sentences
    if cap is not None and len(fit_ids) > cap:
        fit_ids = np.sort(np.random.default_rng([seed, 3]).choice(fit_ids, cap, replace=False))
    train = tree_set(ctx.train_acts, plan.train, fit_ids)
    stop = tree_set(ctx.train_acts, plan.train, plan.stop)
    ev = tree_set(ctx.eval_acts, plan.eval)
    kind = "distance" if task == "structural-distance" else "depth"
    t0 = time.perf_counter()
    device = ctx.settings.probe_config.get("device", "auto")  # one device for every fit of the probe
    fitted = st.fit_structural_probe(train, stop, kind=kind, seed=seed, progress=ctx.progress, device=device,
                                     **ctx.settings.structural)
    preds = st.predict(fitted, ev, device=device)
    n_layers = len(preds)
    lengths = np.array([len(h) for h in ev.heads])
    extra = {"n_train": len(train), "rank": int(fitted.proj.shape[-1]), "epochs": fitted.epochs,
             "lr_decay": fitted.lr_decay, "standardized": fitted.scaling is not None,
             "protocol": ctx.settings.protocol}
    out = []
    scores = st.sentence_scores(kind, preds, ev)
    if kind == "distance":
        correct, total = scores["uuas_correct"], scores["uuas_total"]
        uuas, lo, hi = stats.ratio_bootstrap(correct, total, n_boot=ctx.n_boot, seed=seed)  # per-sentence sums
        dspr = st.length_averaged(scores["dspr"], lengths)
        dlo, dhi = length_averaged_ci(scores["dspr"], lengths, ctx.n_boot, seed)
        out.append(_rows(ctx, task, {"uuas": uuas}, n=int(total.sum()), ci={"uuas": (lo, hi)}, extra=extra))
        out.append(_rows(ctx, task, {"dspr": dspr}, n=len(ev), ci={"dspr": (dlo, dhi)}, extra=extra))
        if "majority" in ctx.baselines and not ctx.is_twin:  # data-only baseline, written with the others
            rb = st.right_branching_uuas(ev)
            out.append(baselines.mark_baselines(
                _rows(ctx, task, {"right_branching_uuas": np.full(n_layers, rb)}, n=int(total.sum()), extra=extra),
                {"right_branching_uuas": ("right_branching", "uuas")}))
    else:
        hits = scores["root_hit"]
        counted = np.isfinite(hits[0])
        acc, lo, hi = stats.ratio_bootstrap(hits[:, counted], None, n_boot=ctx.n_boot, seed=seed)  # one hit per sentence
        nspr = st.length_averaged(scores["nspr"], lengths)
        nlo, nhi = length_averaged_ci(scores["nspr"], lengths, ctx.n_boot, seed)
        out.append(_rows(ctx, task, {"root_acc": acc}, n=int(counted.sum()), ci={"root_acc": (lo, hi)}, extra=extra))
        out.append(_rows(ctx, task, {"nspr": nspr}, n=len(ev), ci={"nspr": (nlo, nhi)}, extra=extra))
    ctx.timings[task] = round(time.perf_counter() - t0, 3)
    return out




def _counts(stats: Mapping[str, int]) -> dict[str, int]:
    """Every extraction count, the bad-input ones always present (0 when nothing happened)."""
    out = {k: int(stats.get(k, 0)) for k in EXTRACTION_COUNTS}
    out.update({k: int(v) for k, v in stats.items() if k not in out})
    return out
