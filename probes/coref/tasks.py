"""The coreference tasks, one function each, and `run_task` (see the package docstring)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from probes.core import baselines, depth, fitting, runner
from probes.core.statistics import auc, ratio_bootstrap
from probes.coref.features import PairView, SpanView
from probes.coref.gap_scorer import FEMININE, MASCULINE, pronoun_gender, write_submission
from probes.coref.items import (Document, Pairs, baseline_pair_predictions, gap_decisions, gap_nearest_name,
                                gap_subject_name, mention_pairs)
from probes.coref.metrics import binary_scores, gap_scores_ci, pair_metrics
from probes.coref.prepare import CorefData
from probes.coref.settings import (CorefSettings, GAP_LABELS, HEADS_REPORT_SPLIT, HEADS_SELECT_SPLIT, HEAD_CRITERIA,
                                   MENTION_TYPES, PAPER_PARALLELISM_F1, gap_fit_stop_rows, gap_split_roles)


# --------------------------------------------------------------------------- per unit helpers
def _acts(unit, docs: Sequence[Document] | Sequence[list[str]], key: str, settings: CorefSettings):
    words = [d.words if isinstance(d, Document) else list(d) for d in docs]
    acts = unit.activations(words, key, pooling=settings.pooling)
    unit.notes["extraction"].setdefault(unit.key, {})[key] = {
        k: int(v) for k, v in acts.stats.items() if isinstance(v, (int, np.integer))}
    return acts


def _spans(acts, docs: Sequence[Document], span: str, cache: bool = False) -> SpanView:
    st, en, hd = [], [], []
    for i, d in enumerate(docs):
        off = int(acts.sentence_offsets[i])
        for m in d.mentions:
            st.append(off + m.start)
            en.append(off + m.end)
            hd.append(off + m.head)
    return SpanView(acts.layers, st, en, hd, span, cache)


def _document_context(unit, prepared, settings: CorefSettings) -> None:
    """Left context per word in the windows the model reads (once per unit, noted)."""
    from probes.coref.attention import document_windows, left_context_counts

    if "context" in unit.state:
        return
    d: CorefData = prepared.data
    out = {}
    if d.eval:
        plans = [document_windows(unit.handle, doc.words, unit.stack) for doc in d.eval]
        out[f"gum-{settings.eval_split}"] = left_context_counts(plans, settings.context_thresholds)
    if settings.gap_eval_split in d.gap:
        plans = [document_windows(unit.handle, w, unit.stack) for w in d.gap[settings.gap_eval_split]["words"]]
        out[f"gap-{settings.gap_eval_split}"] = left_context_counts(plans, settings.context_thresholds)
    unit.notes["document_context"][unit.key] = out
    unit.state["context"] = True


def _layer_batch(n_layers: int, n_items: int, dim: int, budget_gb: float) -> int | None:
    per_layer = max(1, n_items * dim * 4)
    k = int(budget_gb * 2**30 // per_layer)
    return None if k >= n_layers else max(1, k)


def _probe_cfg(settings: CorefSettings, layer_batch, **extra) -> dict:
    return dict(settings.probe_config, seed=settings.seed, layer_batch=layer_batch, progress=settings.progress, **extra)


def sample_anaphors(pairs: Pairs, max_pairs: int, seed: int) -> np.ndarray:
    """Indices of the pairs of randomly drawn anaphors (all their candidates) up to `max_pairs`."""
    anaphors = np.unique(pairs.anaphor)
    order = np.random.default_rng(seed).permutation(anaphors)
    sizes = np.bincount(pairs.anaphor, minlength=int(pairs.anaphor.max()) + 1 if len(pairs.anaphor) else 0)[order]
    take = order[: int(np.searchsorted(np.cumsum(sizes), max_pairs, side="right"))]
    return np.flatnonzero(np.isin(pairs.anaphor, take))


def subset_pairs(p: Pairs, idx: np.ndarray) -> Pairs:
    """The mention pairs at positions `idx`."""
    return Pairs(p.anaphor[idx], p.candidate[idx], p.label[idx], p.doc[idx], p.distance[idx])


def _predict_chunked(res, view, chunk: int = 4096) -> np.ndarray:
    return np.concatenate([res.logits(view[:, a: a + chunk]) for a in range(0, view.shape[1], chunk)], axis=1)


def pair_probe(fit_spans: SpanView, fit_pairs: Pairs, stop_spans: SpanView, stop_pairs: Pairs, eval_spans: SpanView,
               eval_pairs: Pairs, settings: CorefSettings, labels: Sequence[np.ndarray] | None = None):
    """Fit the pair probe on every layer and score the eval pairs. `labels` replaces the gold
    labels (fit, stop, eval) for a control task. Returns (result, eval logits [L, P, 2])."""
    x_fit = PairView(fit_spans, fit_pairs.anaphor, fit_pairs.candidate)
    x_stop = PairView(stop_spans, stop_pairs.anaphor, stop_pairs.candidate)
    x_ev = PairView(eval_spans, eval_pairs.anaphor, eval_pairs.candidate)
    y = labels or (fit_pairs.label, stop_pairs.label, eval_pairs.label)
    lb = _layer_batch(x_fit.shape[0], x_fit.shape[1], x_fit.shape[2], settings.memory_budget_gb)
    # Early stopping on dev LOSS: with ~6% positives, dev accuracy rarely beats the all-negative
    # start, so stopping on accuracy keeps the prior-only initialisation. Minibatch Adam by default:
    # joint L-BFGS (200 iterations) over all layers of these pair features left most MiniLM layers at the
    # prior; Adam at 3e-2 (the fitter's default then; 5e-3 since issue 42) overfits these 2,304-wide features within the first epoch
    # (dev loss above the prior's, best step 0); 1e-3 trains (MiniLM layer 2: AUC 0.87 on held-out train pairs).
    cfg = dict(_probe_cfg(settings, lb), **{"stop_on": settings.probe_config.get("stop_on", "loss"),
                                             "optimizer": settings.probe_config.get("optimizer", "adam"),
                                             "lr": settings.probe_config.get("lr", 1e-3)})
    res = fitting.fit_probe(x_fit, y[0], x_stop, y[1], num_classes=2, config=cfg)
    return res, _predict_chunked(res, x_ev)


def _scalars(metrics) -> dict[str, float]:
    """{name: [v]} -> {name: v}: whole-model metrics for `Unit.rows` (layer NA)."""
    return {k: float(np.asarray(v, dtype=np.float64).ravel()[0]) for k, v in metrics.items()}


def _scalar_cis(cis) -> dict[str, tuple[float, float]]:
    """{name: ([lo], [hi])} -> {name: (lo, hi)}."""
    return {k: (float(np.asarray(lo).ravel()[0]), float(np.asarray(hi).ravel()[0])) for k, (lo, hi) in cis.items()}


def _depth_rows(unit, task: str, metric: str, point, ci, boot, *, split: str, n: int, extra: dict) -> list[pd.DataFrame]:
    """One headline metric's per-layer rows with their paired bootstrap replicates (`extra.boot`, read
    by the "where in depth" figure, `probes.core.depth`), the share of resamples in which each layer is
    the best (`<metric>_peak_share`) and the peak layer with its percentile CI (`<metric>_peak_layer`,
    no layer)."""
    layers = list(range(len(point)))
    share, peak, peak_ci = depth.depth_rows(metric, point, boot, layers)
    return [unit.rows(task, {metric: point}, split=split, n=n, ci={metric: ci}, extra=depth.boot_extras(boot, extra)),
            unit.rows(task, share, split=split, n=n, extra=dict(extra, n_boot=len(boot))),
            unit.rows(task, _scalars(peak), split=split, n=n, ci=_scalar_cis(peak_ci),
                      extra=dict(extra, n_boot=len(boot)))]


# --------------------------------------------------------------------------- tasks
def _gum_pairs(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    d: CorefData = prepared.data
    s = settings
    acts = {k: _acts(unit, getattr(d, k), d.keys[k], s) for k in ("fit", "stop", "eval")}
    spans = {k: _spans(acts[k], getattr(d, k), s.span, cache=(k != "fit")) for k in acts}
    pairs = {k: mention_pairs(getattr(d, k), s.k) for k in acts}
    fit_idx = sample_anaphors(pairs["fit"], s.max_train_pairs, s.seed)
    stop_idx = sample_anaphors(pairs["stop"], max(1, s.max_train_pairs // 4), s.seed + 1)
    fit, stop, ev = subset_pairs(pairs["fit"], fit_idx), subset_pairs(pairs["stop"], stop_idx), pairs["eval"]
    unit.notes["items"]["gum-pairs"] = {
        split: {"pairs": int(len(p.label)), "positive": int(p.label.sum()), "anaphors": int(len(np.unique(p.anaphor)))}
        for split, p in (("fit", fit), ("stop", stop), ("eval", ev))}
    t0 = time.perf_counter()
    res, logits = pair_probe(spans["fit"], fit, spans["stop"], stop, spans["eval"], ev, s)
    scores = binary_scores(logits)
    metrics, cis, boots = pair_metrics(logits.argmax(-1) == 1, scores, ev, s.n_boot, s.seed, return_boot=True)
    metrics["train_accuracy"] = res.train_accuracy
    extra = {"k": s.k, "span": s.span, "pooling": s.pooling, "n_train": int(len(fit.label)),
             "positive_rate": float(ev.label.mean()), "pair_features": "concat_product", "probe_seed": s.seed}
    auc_point, out = metrics["auc"], []
    for m, boot in boots.items():
        out += _depth_rows(unit, "gum-pairs", m, metrics.pop(m), cis.pop(m), boot, split=s.eval_split,
                           n=len(ev.label), extra=extra)
    out.append(unit.rows("gum-pairs", metrics, split=s.eval_split, n=len(ev.label), ci=cis, extra=extra))
    n_layers = len(res.train_accuracy)
    if "control" in s.baselines:
        ms = {k: [m for doc in getattr(d, k) for m in doc.mentions] for k in ("fit", "stop", "eval")}
        types = {k: [f"{ms[k][a].head_text.lower()}\x00{ms[k][c].head_text.lower()}" for a, c in zip(p.anaphor, p.candidate)]
                 for k, p in (("fit", fit), ("stop", stop), ("eval", ev))}
        dist = baselines.label_distribution(fit.label, 2)
        ctrl = [baselines.control_labels(types[k], dist, s.seed) for k in ("fit", "stop", "eval")]
        _, clog = pair_probe(spans["fit"], fit, spans["stop"], stop, spans["eval"], ev, s, labels=ctrl)
        cacc = (clog.argmax(-1) == ctrl[2][None]).mean(1)
        cauc = np.array([auc(sc, ctrl[2]) for sc in binary_scores(clog)])
        out.append(baselines.mark_baselines(unit.rows("gum-pairs", {"control_accuracy": cacc, "control_auc": cauc,
                                           "selectivity_auc": auc_point - cauc},
                             split=s.eval_split, n=len(ev.label), extra=extra), {"control_accuracy": ("control", "accuracy"), "control_auc": ("control", "auc")}))
    if not unit.is_twin:
        base = {}
        if "rules" in s.baselines:
            base.update({k: v for k, v in baseline_pair_predictions(d.eval, ev).items() if k != "majority"})
        if "majority" in s.baselines:
            base["majority"] = np.zeros(len(ev.label), dtype=np.int64)
        for name, pred in base.items():
            bm, bc = pair_metrics(pred[None].astype(bool), pred[None].astype(float), ev, s.n_boot, s.seed,
                                  require_positive=1.0)
            out.append(unit.rows("gum-pairs", {f"{name}_{k}": np.repeat(v, n_layers) for k, v in bm.items()},
                                 split=s.eval_split, n=len(ev.label),
                                 ci={f"{name}_{k}": (np.repeat(lo, n_layers), np.repeat(hi, n_layers))
                                     for k, (lo, hi) in bc.items()}, extra=dict(extra, baseline=name)))
    unit.timings["gum-pairs:probe"] = round(time.perf_counter() - t0, 3)
    return out


def _gum_entity_type(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    d: CorefData = prepared.data
    s = settings
    acts = {k: _acts(unit, getattr(d, k), d.keys[k], s) for k in ("fit", "stop", "eval")}
    spans = {k: _spans(acts[k], getattr(d, k), s.span, cache=(k != "fit")) for k in acts}
    ms = {k: [m for doc in getattr(d, k) for m in doc.mentions] for k in acts}
    docs_of = {k: np.repeat(np.arange(len(getattr(d, k))), [len(doc.mentions) for doc in getattr(d, k)]) for k in acts}
    vocab = {t: i for i, t in enumerate(sorted({m.etype for m in ms["fit"]}))}
    enc = lambda k: np.array([vocab.get(m.etype, len(vocab)) for m in ms[k]], dtype=np.int64)  # noqa: E731
    y = {k: enc(k) for k in acts}
    rng = np.random.default_rng([s.seed, 3])
    take = np.sort(rng.permutation(len(ms["fit"]))[: s.max_train_mentions])
    c = len(vocab)

    class _Rows(fitting.LazyFeatures):  # a subset of a SpanView's rows
        def __init__(self, view, idx):
            self.view, self.idx = view, idx
            self.shape = (view.shape[0], len(idx), view.shape[2])

        def _layer(self, layer, rows, out):
            out[:] = self.view.plane(layer)[self.idx[rows]]

    x_fit = _Rows(spans["fit"], take)
    x_stop, x_ev = spans["stop"], spans["eval"]
    lb = _layer_batch(x_fit.shape[0], x_fit.shape[1], x_fit.shape[2], s.memory_budget_gb)
    cfg = _probe_cfg(s, lb)
    res = fitting.fit_probe(x_fit, y["fit"][take], x_stop, y["stop"], num_classes=c + 1, config=cfg)
    correct = _predict_chunked(res, x_ev).argmax(-1) == y["eval"][None]
    acc = ratio_bootstrap(correct.astype(float), None, docs_of["eval"], s.n_boot, s.seed, return_boot=True)
    metrics = {"train_accuracy": res.train_accuracy}
    cis = {}
    if "control" in s.baselines:
        types = {k: [m.head_text.lower() for m in ms[k]] for k in acts}
        ctrl = {k: baselines.control_labels(types[k], baselines.label_distribution(y["fit"][take], c), s.seed) for k in acts}
        cres = fitting.fit_probe(x_fit, ctrl["fit"][take], x_stop, ctrl["stop"], num_classes=c, config=cfg)
        ccorrect = _predict_chunked(cres, x_ev).argmax(-1) == ctrl["eval"][None]
        cacc = ratio_bootstrap(ccorrect.astype(float), None, docs_of["eval"], s.n_boot, s.seed)
        sel = ratio_bootstrap(correct.astype(float) - ccorrect, None, docs_of["eval"], s.n_boot, s.seed)
        metrics.update({"control_accuracy": cacc[0], "selectivity": sel[0]})
        cis.update({"control_accuracy": cacc[1:], "selectivity": sel[1:]})
    extra = {"span": s.span, "pooling": s.pooling, "n_train": int(len(take)), "num_classes": c, "probe_seed": s.seed}
    out = _depth_rows(unit, "gum-entity-type", "accuracy", acc[0], acc[1:3], acc[3], split=s.eval_split,
                      n=len(y["eval"]), extra=extra)
    out.append(unit.rows("gum-entity-type", metrics, split=s.eval_split, n=len(y["eval"]), ci=cis, extra=extra))
    if "majority" in s.baselines and not unit.is_twin:
        _, maj = baselines.majority_baseline(y["fit"][take], y["eval"])
        out.append(unit.rows("gum-entity-type", {"majority": np.full(len(res.train_accuracy), maj)},
                             split=s.eval_split, n=len(y["eval"]), extra=dict(extra, baseline="majority", baseline_for="accuracy")))
    return out


def _gap_features(unit, frame: pd.DataFrame, split: str, settings: CorefSettings) -> np.ndarray:
    """[L, N, 5D] features [p; a; b; p*a; p*b] of GAP examples (mean over each span's words)."""
    key = f"gap-{split}" + (f"-first{settings.max_gap_examples}" if settings.max_gap_examples else "")
    acts = _acts(unit, list(frame["words"]), key, settings)
    off = acts.sentence_offsets[:-1]
    views = [SpanView(acts.layers, off + frame[f"{r}_start"].to_numpy(), off + frame[f"{r}_end"].to_numpy(),
                      off + frame[f"{r}_end"].to_numpy(), "mean") for r in ("pronoun", "a", "b")]
    out = []
    for layer in range(acts.layers.shape[0]):
        p, a, b = (v.plane(layer) for v in views)
        out.append(np.concatenate([p, a, b, p * a, p * b], axis=1))
    return np.stack(out)


def _gap_predictions_dir(unit, settings: CorefSettings) -> Path:
    from workbench.paths import runs_root

    root = Path(settings.gap_predictions_dir) if settings.gap_predictions_dir else runs_root() / "coref" / "gap-predictions"
    slug = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in unit.model)
    return root / f"{slug}-{unit.handle.checkpoint_hash[:12]}" / unit.stack / f"seed{settings.seed}"


def _gap(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    d: CorefData = prepared.data
    s = settings
    frames = {k: d.gap[k] for k in ("development", "validation", s.gap_eval_split)}
    x = {k: _gap_features(unit, f, k, s) for k, f in frames.items()}
    lab = {k: np.array([GAP_LABELS.index(v) for v in f["label"]], dtype=np.int64) for k, f in frames.items()}
    ev = frames[s.gap_eval_split]
    roles = gap_split_roles(s)  # the probe never stops on the data it is reported on
    if s.gap_eval_split == "validation":
        fit, stop = gap_fit_stop_rows(len(frames["development"]), s)
        x_fit, y_fit = x["development"][:, fit], lab["development"][fit]
        x_stop, y_stop = x["development"][:, stop], lab["development"][stop]
    else:
        x_fit, y_fit, x_stop, y_stop = x["development"], lab["development"], x["validation"], lab["validation"]
    res = fitting.fit_probe(x_fit, y_fit, x_stop, y_stop, num_classes=3, config=_probe_cfg(s, None))
    pred = res.predict(x[s.gap_eval_split])  # [L, N]
    genders = [pronoun_gender(p) for p in ev["pronoun"]]
    scores = gap_scores_ci(pred == 0, pred == 1, ev["a_coref"], ev["b_coref"], genders, s.n_boot, s.seed,
                           return_boot=True)
    f1_boot = scores["f1"][3]
    scores = {k: v[:3] for k, v in scores.items()}
    acc = ratio_bootstrap((pred == lab[s.gap_eval_split][None]).astype(float), None, None, s.n_boot, s.seed)
    metrics = {k: v[0] for k, v in scores.items()}
    metrics.update({"accuracy": acc[0], "train_accuracy": res.train_accuracy})
    cis = {k: v[1:] for k, v in scores.items()}
    cis["accuracy"] = acc[1:]
    folder = _gap_predictions_dir(unit, s)
    files = []
    for layer in range(pred.shape[0]):
        rows = [(i, *gap_decisions(GAP_LABELS[p])) for i, p in zip(ev["id"], pred[layer])]
        files.append(str(write_submission(folder / f"layer-{layer:02d}.tsv", rows)))
    unit.notes.setdefault("gap_predictions", {})[unit.key] = files
    extra = {"features": "p;a;b;p*a;p*b", "pooling": s.pooling, "train": roles["train"], "stop": roles["stop"],
             "paper_parallelism_f1": PAPER_PARALLELISM_F1, "probe_seed": s.seed}
    out = _depth_rows(unit, "gap", "f1", metrics.pop("f1"), cis.pop("f1"), f1_boot, split=s.gap_eval_split,
                      n=len(ev), extra=extra)
    out.append(unit.rows("gap", metrics, split=s.gap_eval_split, n=len(ev), ci=cis, extra=extra))
    if not unit.is_twin:
        base = {}
        if "rules" in s.baselines:
            base["nearest_name"] = [gap_nearest_name(r) for r in ev.itertuples()]
            base["subject_name"] = [gap_subject_name(r) for r in ev.itertuples()]
        if "majority" in s.baselines:
            major = GAP_LABELS[int(np.bincount(y_fit).argmax())]
            base["majority"] = [major] * len(ev)
        n_layers = pred.shape[0]
        for name, labels in base.items():
            dec = np.array([gap_decisions(v) for v in labels], dtype=bool)
            sc = gap_scores_ci(dec[None, :, 0], dec[None, :, 1], ev["a_coref"], ev["b_coref"], genders, s.n_boot, s.seed)
            out.append(unit.rows("gap", {f"{name}_{k}": np.repeat(v[0], n_layers) for k, v in sc.items()},
                                 split=s.gap_eval_split, n=len(ev),
                                 ci={f"{name}_{k}": (np.repeat(v[1], n_layers), np.repeat(v[2], n_layers))
                                     for k, v in sc.items()}, extra=dict(extra, baseline=name)))
    return out


def _per_layer_rows(unit, task, metrics, split, n, ci, extras) -> list[pd.DataFrame]:
    """Rows of layers 1..L with a different `extra` per layer (e.g. which head is best there)."""
    return [unit.rows(task, {k: [v[i]] for k, v in metrics.items()}, split=split, layers=[i + 1], n=n,
                      ci={k: ([lo[i]], [hi[i]]) for k, (lo, hi) in ci.items()}, extra=ex)
            for i, ex in enumerate(extras)]


def gap_heads_select_split(settings: CorefSettings) -> str:
    """The GAP split a best head is chosen on: never the one it is reported on."""
    return "validation" if settings.gap_eval_split == "test" else "development"


def choose_heads(select: np.ndarray) -> tuple[np.ndarray, tuple[int, int], np.ndarray]:
    """Best heads on the selection data `select` (bool [N, L, heads], per item whether a head is
    right): (best head per layer [L], best (layer, head) overall, accuracy [L, heads]). Ties go to
    the lowest head."""
    acc = select.mean(0) if len(select) else np.zeros(select.shape[1:])
    layer, head = np.unravel_index(int(acc.argmax()), acc.shape)
    return acc.argmax(1), (int(layer), int(head)), acc


def best_head_rows(unit, metric: str, select: np.ndarray, report: np.ndarray, units: np.ndarray, settings, *,
                   split: str, chosen_on: str, extra: dict, by_group: dict[str, np.ndarray] | None = None
                   ) -> list[pd.DataFrame]:
    """Held-out best heads: chosen on `select` ([N_sel, L, heads], the selection split `chosen_on`),
    scored on `report` ([N, L, heads], `split`) with a bootstrap over `units` (documents/examples).
    Rows: `metric` per layer 1..L (extra.best_head, chosen_on, chosen_value = its accuracy where it
    was chosen), `metric`_<group> on the same heads for each mask of `by_group`, and `metric`_overall
    (no layer: the best layer x head; extra.best_layer, best_head)."""
    s = settings
    per_layer, (bl, bh), sel_acc = choose_heads(select)
    L = report.shape[1]
    chosen = report[:, np.arange(L), per_layer].T.astype(float)  # [L, N]
    pt, lo, hi = ratio_bootstrap(chosen, None, units, s.n_boot, s.seed)
    metrics = {metric: pt}
    for name, mask in (by_group or {}).items():
        metrics[f"{metric}_{name}"] = chosen[:, mask].mean(1) if mask.any() else np.full(L, np.nan)
    extras = [dict(extra, best_head=int(h), chosen_on=chosen_on, chosen_value=float(sel_acc[layer, h]))
              for layer, h in enumerate(per_layer)]
    out = _per_layer_rows(unit, "attention-heads", metrics, split, len(report), {metric: (lo, hi)}, extras)
    o_pt, o_lo, o_hi = ratio_bootstrap(report[:, bl, bh][None].astype(float), None, units, s.n_boot, s.seed)
    out.append(unit.rows("attention-heads", {f"{metric}_overall": float(o_pt[0])}, split=split, n=len(report),
                         ci={f"{metric}_overall": (float(o_lo[0]), float(o_hi[0]))},
                         extra=dict(extra, best_layer=bl + 1, best_head=bh, chosen_on=chosen_on,
                                    chosen_value=float(sel_acc[bl, bh]))))
    return out


def _attention_heads(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    """Coreference heads (Clark et al. 2019): per-head rows on the report split (GUM test, GAP test),
    best heads chosen on the selection split (GUM dev, GAP validation) and reported on the report
    split, so no held-out figure is chosen on the data it is scored on."""
    from probes.coref.attention import gap_head_scores, gum_head_scores

    d: CorefData = prepared.data
    s = settings
    out = []
    notes = unit.notes.setdefault("attention", {}).setdefault(unit.key, {})
    gum = {}
    for split in (HEADS_SELECT_SPLIT, HEADS_REPORT_SPLIT):
        stats: dict[str, Any] = {}
        t0 = time.perf_counter()
        gum[split] = gum_head_scores(unit.handle, d.heads[split], unit.stack, s.attention_batch_size, s.progress, stats)
        sec = time.perf_counter() - t0
        words = sum(len(doc.words) for doc in d.heads[split])
        notes[f"gum_{split}"] = {"counts": gum[split].counts, "documents": len(d.heads[split]), "words": words,
                                 "seconds": round(sec, 3), "words_per_s": round(words / sec, 1) if sec else None,
                                 **stats}
    sel, rep = gum[HEADS_SELECT_SPLIT], gum[HEADS_REPORT_SPLIT]
    L, H = rep.correct.shape[1:]
    extra = {"data": f"gum-{HEADS_REPORT_SPLIT}", "evaluated": rep.counts["evaluated"],
             "out_of_window": rep.counts["out_of_window"]}
    groups = {"heads_all": np.ones(len(rep.group), bool), **{f"heads_{t}": rep.group == t for t in MENTION_TYPES}}
    for h in range(H):
        metrics = {name: rep.correct[mask, :, h].mean(0) if mask.any() else np.full(L, np.nan)
                   for name, mask in groups.items()}
        metrics["heads_strict"] = rep.strict[:, :, h].mean(0) if len(rep.strict) else np.full(L, np.nan)
        metrics["heads_head_word"] = rep.head_word[:, :, h].mean(0) if len(rep.head_word) else np.full(L, np.nan)
        out.append(unit.rows("attention-heads", metrics, split=HEADS_REPORT_SPLIT, layers=range(1, L + 1),
                             n=len(rep.group), extra=dict(extra, head=h)))
    types = {t: rep.group == t for t in MENTION_TYPES}
    out += best_head_rows(unit, "best_head_accuracy", sel.strict, rep.strict, rep.unit, s, split=HEADS_REPORT_SPLIT,
                          chosen_on=f"gum-{HEADS_SELECT_SPLIT}", by_group=types,
                          extra=dict(extra, criterion=HEAD_CRITERIA["best_head_accuracy"]))
    for metric, chosen in (("best_head_accuracy_head_word", "head_word"), ("best_head_accuracy_lenient", "correct")):
        out += best_head_rows(unit, metric, getattr(sel, chosen), getattr(rep, chosen), rep.unit, s,
                              split=HEADS_REPORT_SPLIT, chosen_on=f"gum-{HEADS_SELECT_SPLIT}",
                              extra=dict(extra, criterion=HEAD_CRITERIA[metric]))
    if "rules" in s.baselines and not unit.is_twin:
        for name, v in rep.baselines.items():
            b = ratio_bootstrap(v[None].astype(float), None, rep.unit, s.n_boot, s.seed)
            out.append(unit.rows("attention-heads", {name: np.repeat(b[0], L)}, split=HEADS_REPORT_SPLIT,
                                 layers=range(1, L + 1), n=len(v), ci={name: (np.repeat(b[1], L), np.repeat(b[2], L))},
                                 extra=dict(extra, baseline=name, baseline_for="best_head_accuracy")))
    # GAP: which name the pronoun attends to more
    gap = {}
    gap_select = gap_heads_select_split(s)
    for split in (gap_select, s.gap_eval_split):
        gstats: dict[str, Any] = {}
        t0 = time.perf_counter()
        gap[split] = gap_head_scores(unit.handle, d.gap[split], unit.stack, max(1, s.attention_batch_size * 2),
                                     s.progress, gstats)
        notes[f"gap_{split}"] = {"counts": gap[split].counts, "seconds": round(time.perf_counter() - t0, 3)}
    grep = gap[s.gap_eval_split]
    gextra = {"data": f"gap-{s.gap_eval_split}", "evaluated": grep.counts["evaluated"]}
    for h in range(H):
        out.append(unit.rows("attention-heads", {"heads_gap": grep.correct[:, :, h].mean(0)}, split=s.gap_eval_split,
                             layers=range(1, L + 1), n=len(grep.group), extra=dict(gextra, head=h)))
    out += best_head_rows(unit, "best_head_gap", gap[gap_select].correct, grep.correct, grep.unit, s,
                          split=s.gap_eval_split, chosen_on=f"gap-{gap_select}", extra=gextra)
    if "rules" in s.baselines and not unit.is_twin:
        for name, v in grep.baselines.items():
            b = ratio_bootstrap(v[None].astype(float), None, grep.unit, s.n_boot, s.seed)
            out.append(unit.rows("attention-heads", {f"gap_{name}": np.repeat(b[0], L)}, split=s.gap_eval_split,
                                 layers=range(1, L + 1), n=len(v),
                                 ci={f"gap_{name}": (np.repeat(b[1], L), np.repeat(b[2], L))},
                                 extra=dict(gextra, baseline=name, baseline_for="best_head_gap")))
    return out


CLOZE_FORMS = {MASCULINE: ("he", "his", "him"), FEMININE: ("she", "her")}


def _gap_cloze(unit, prepared, settings: CorefSettings) -> list[pd.DataFrame]:
    """Mask the pronoun, compare the model's log-probability of the masculine and feminine forms."""
    d: CorefData = prepared.data
    s = settings
    handle = unit.handle
    if not getattr(handle, "head_trained", True) and not unit.is_twin:
        unit.notes.setdefault("gap_cloze", {})[unit.key] = "LM head not trained (missing from the checkpoint): skipped"
        return []
    from workbench.errors import CheckpointError
    from workbench.running.lm_scores import lm_scorer

    try:
        scorer = lm_scorer(handle)
    except CheckpointError as e:
        unit.notes.setdefault("gap_cloze", {})[unit.key] = f"skipped: {e}"
        return []
    frame = d.gap[s.gap_eval_split]
    # snippets longer than the model's window cannot be scored in one pass: left out and counted
    lengths = handle.tokenize_words(list(frame["words"])).attention_mask.sum(1).cpu().numpy()
    frame = frame[lengths + 2 <= handle.max_length].reset_index(drop=True)  # + room for a longer filler
    contexts = [row.text[: row.pronoun_offset] + "<blank>" + row.text[row.pronoun_offset + len(row.pronoun):]
                for row in frame.itertuples()]
    forms = [w for g in (MASCULINE, FEMININE) for w in CLOZE_FORMS[g]]
    scores = np.asarray(scorer.score_candidates(contexts, [forms] * len(contexts)).scores, dtype=np.float64)
    unit.notes.setdefault("gap_cloze", {})[unit.key] = {"scored": len(frame), "too_long": int(len(lengths) - len(frame)),
                                                        "method": scorer.kind}
    n_m = len(CLOZE_FORMS[MASCULINE])
    masc = np.logaddexp.reduce(scores[:, :n_m], axis=1)
    fem = np.logaddexp.reduce(scores[:, n_m:], axis=1)
    genders = np.array([pronoun_gender(p) for p in frame["pronoun"]])
    metrics, cis = {}, {}
    for g in (MASCULINE, FEMININE):
        mask = genders == g
        prefers_f = (fem > masc)[mask].astype(float)
        b = ratio_bootstrap(prefers_f[None], None, None, s.n_boot, s.seed)
        metrics[f"prefers_feminine_{g}"] = b[0]
        cis[f"prefers_feminine_{g}"] = b[1:]
        metrics[f"log_ratio_fm_{g}"] = np.array([float((fem - masc)[mask].mean())])
    correct = np.where(genders == FEMININE, fem > masc, masc > fem).astype(float)
    b = ratio_bootstrap(correct[None], None, None, s.n_boot, s.seed)
    metrics["gender_accuracy"], cis["gender_accuracy"] = b[0], b[1:]
    return [unit.rows("gap-cloze", _scalars(metrics), split=s.gap_eval_split, n=len(frame), ci=_scalar_cis(cis),
                      extra={"candidates": forms, "lm_kind": scorer.kind})]


def run_task(unit, prepared: runner.Prepared, task: str, settings: CorefSettings) -> list[pd.DataFrame]:
    _document_context(unit, prepared, settings)
    fn = {"gum-pairs": _gum_pairs, "gum-entity-type": _gum_entity_type, "gap": _gap,
          "attention-heads": _attention_heads, "gap-cloze": _gap_cloze}[task]
    t0 = time.perf_counter()
    out = fn(unit, prepared, settings)
    unit.timings[f"{task}:compute"] = round(time.perf_counter() - t0, 3)
    return out
