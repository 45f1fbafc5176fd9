"""The whole syntax probe on a real model: where the time goes (issue 42, item 1).

For each model (a Hub name or a checkpoint folder, loaded with `workbench.running.models.ModelHandle.load`):

(a) extraction: all-layer word vectors (`workbench.activations.extract`, fp32, into a fresh
    temporary cache so nothing is reused) of a seeded sample of `--sentences` EWT train sentences
    and `--eval-sentences` EWT dev sentences (`probes.syntax.prepare.plan_splits`, the syntax
    probe's own split: 10% of the train sample is its early-stopping set), and of a second train
    pool big enough for `--trees` structural-probe training trees (plus its own 10% stop set);
(b) the UPOS probe over all layers with the workbench's default fit: the lines of
    `probes.syntax.tasks.fit_classification_task` that fit the task (`build_items`, `FeatureView`,
    `fitting.fit_probe` with `SyntaxSettings().probe_config`, the default memory budget's
    `layer_batch`), accuracy per layer on the eval sentences;
(c) the structural-distance probe (Hewitt & Manning 2019) over all layers with `--trees` training
    trees: `probes.syntax.structural.fit_structural_probe` with `SyntaxSettings().structural`,
    UUAS per layer on the eval sentences (and the right-branching chain baseline).

Reported per model: wall and process-CPU seconds of each phase, the ratios fit / extraction (the
machine-independent number the issue's targets are written in: UPOS fit <= 1x the extraction of
its features, structural fit <= 2x its extraction), the peak resident memory during each fit
(sampled from /proc/self/status every 20 ms; total, anonymous and file-backed) against the size
of the fp32 features the fit reads, and the accuracies. The model is released before the fits, so
the fits' memory is the features' and the fitter's.

Extraction seconds: UPOS = train sample + eval; structural = its train pool + the same eval
sentences (the eval features are shared, so the eval extraction is counted in both).

Usage: python benchmarks/bench_real_probe.py [--models NAME ...] [--sentences 1000] [--eval-sentences 500]
           [--trees 2000] [--threads 2] [--layers 0,6,12]  (smoke: --sentences 40 --eval-sentences 20 --trees 40)
Writes benchmarks/results/bench_real_probe-<host>-<time>.json (see results_io.py).
"""

from __future__ import annotations

import argparse
import gc
import math
import shutil
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_MODELS = ("sentence-transformers/all-mpnet-base-v2", "HuggingFaceTB/SmolLM2-135M-Instruct")


# --------------------------------------------------------------------------- memory
def _status_bytes() -> dict[str, int]:
    """VmRSS / RssAnon / RssFile of this process now (bytes; Linux /proc/self/status, {} elsewhere)."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key = line.split(":", 1)[0]
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(line.split()[1]) * 1024
    except OSError:
        pass
    return out


@contextmanager
def peak_memory(interval_s: float = 0.02):
    """Sample resident memory in a thread while the block runs; yields a dict that holds, on exit,
    `rss_before`, `rss_peak`, `anon_before`, `anon_peak`, `file_peak` (bytes) and `samples`."""
    before = _status_bytes()
    peak = dict(before)
    stop = threading.Event()
    samples = [0]

    def sample():
        while not stop.is_set():
            now = _status_bytes()
            for k, v in now.items():
                peak[k] = max(peak.get(k, 0), v)
            samples[0] += 1
            stop.wait(interval_s)

    out: dict = {}
    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield out
    finally:
        stop.set()
        thread.join()
        for k, v in _status_bytes().items():  # the end state too (a fit shorter than one interval)
            peak[k] = max(peak.get(k, 0), v)
        out.update(rss_before=before.get("VmRSS"), rss_peak=peak.get("VmRSS"), anon_before=before.get("RssAnon"),
                   anon_peak=peak.get("RssAnon"), file_peak=peak.get("RssFile"), samples=samples[0])


@contextmanager
def timed():
    """Yields a dict that holds `wall_s` and `cpu_s` (process CPU time, all threads) on exit."""
    out: dict = {}
    t, c = time.perf_counter(), time.process_time()
    try:
        yield out
    finally:
        out.update(wall_s=time.perf_counter() - t, cpu_s=time.process_time() - c)


# --------------------------------------------------------------------------- layer subsets (smoke runs)
def _layer_rows_view(base, layers, rows=None):
    """A lazy [len(layers), rows, H] view of a [L, N, H] memmap: `--layers` without copying every layer."""
    from probes.core.fitting import LazyFeatures

    class _View(LazyFeatures):
        def __init__(self):
            self.base, self.sel = base, np.asarray(layers, dtype=np.int64)
            self.rows = None if rows is None else np.asarray(rows, dtype=np.int64)
            n = int(base.shape[1]) if self.rows is None else len(self.rows)
            self.shape = (len(self.sel), n, int(base.shape[2]))

        def _layer(self, layer, rows_, out):
            idx = np.arange(self.shape[1])[rows_] if self.rows is None else self.rows[rows_]
            out[:] = np.asarray(self.base[self.sel[layer]][idx], dtype=np.float32)

    return _View()


def tree_set(acts, sentences, ids, layers):
    """`probes.syntax.tasks.tree_set` (all layers), or the same trees on a subset of layers."""
    from probes.syntax import structural as st
    from probes.syntax.features import sentence_rows
    from probes.syntax.tasks import tree_set as workbench_tree_set

    if layers is None:
        return workbench_tree_set(acts, sentences, ids)
    ids = np.arange(len(sentences)) if ids is None else np.asarray(ids)
    rows, offsets = sentence_rows(acts.sentence_offsets, ids)
    chosen = [sentences[i] for i in ids]
    return st.TreeSet(_layer_rows_view(acts.layers, layers, rows), offsets, [np.asarray(s.heads) for s in chosen],
                      [s.upos for s in chosen])


# --------------------------------------------------------------------------- one model
def measure(model: str, sentences: int = 1000, eval_sentences: int = 500, trees: int = 2000,
            layers: list[int] | None = None, seed: int = 0, batch_size: int = 32, treebank: str = "en_ewt",
            work_dir: str | Path | None = None, progress: bool = False, structural: dict | None = None,
            reference: bool = False) -> dict:
    """Extraction, UPOS fit and structural-distance fit of `model`, each timed (see the module docstring).

    `layers`: fit only these hidden-state indices (0 = embeddings; the extraction is all-layer
    regardless, so the ratios of a subset are not the all-layer ratios). `work_dir`: where the
    fresh activation cache lives (a temporary folder inside it, removed at the end). `structural`:
    overrides of `SyntaxSettings().structural` (e.g. {"standardize": False}: the raw fit, the default
    before issue 49; docs/evidence/structural-fit.md).
    `reference`: also fit UPOS with L-BFGS run to convergence (no early stopping, up to 1,000
    iterations) and report each layer's accuracy beside the default fit's (the issue's tolerance:
    the default within 0.3 points of it on every layer)."""
    from probes.core import fitting
    from probes.syntax import structural as st
    from probes.syntax.features import FeatureView
    from probes.syntax.items import build_items
    from probes.syntax.prepare import plan_splits
    from probes.syntax.settings import SyntaxSettings
    from probes.syntax.tasks import encode_labels, layers_per_fit
    from workbench.activations import resolve_stack, extract
    from workbench.errors import ConfigError
    from workbench.running.models import ModelHandle

    defaults = SyntaxSettings(structural=dict(structural or {}))
    split_kw = dict(early_stopping_fraction=defaults.early_stopping_fraction,
                    holdout_fraction=defaults.holdout_fraction, seed=seed)
    plan = plan_splits(treebank, "train", "dev", max_train_sentences=sentences, max_eval_sentences=eval_sentences,
                       **split_kw)
    # a pool whose 90% fit part holds `trees` sentences (plan_splits keeps round(10%) for stopping)
    pool_size = math.ceil(trees / (1 - defaults.early_stopping_fraction)) + 1
    tree_plan = plan_splits(treebank, "train", "dev", max_train_sentences=pool_size, max_eval_sentences=eval_sentences,
                            **split_kw)
    tmp = Path(tempfile.mkdtemp(prefix="bench_real_probe-", dir=work_dir))
    record: dict = {"model": model, "treebank": treebank, "seed": seed, "batch_size": batch_size,
                    "sentences": {"upos_train": len(plan.train), "upos_fit": len(plan.fit), "upos_stop": len(plan.stop),
                                  "eval": len(plan.eval), "structural_pool": len(tree_plan.train)}}
    try:
        with timed() as t_load:
            handle = ModelHandle.load(model)
        record["load"] = t_load
        record["compute_dtype"] = getattr(handle, "compute_dtype", "fp32")
        n_states = int(handle.num_layers[resolve_stack(handle, None)]) + 1
        bad = [l for l in (layers or []) if not 0 <= l < n_states]
        if bad:  # before any extraction
            raise ConfigError(f"--layers {bad} outside 0..{n_states - 1} for {model}")

        def run_extract(sents, key):
            with timed() as t:
                acts = extract(handle, [s.words for s in sents], key, batch_size=batch_size, cache_dir=tmp,
                               progress=progress)
            return acts, t

        train_acts, t_train = run_extract(plan.train, f"{treebank}-train-n{len(plan.train)}-seed{seed}")
        eval_acts, t_eval = run_extract(plan.eval, f"{treebank}-dev-n{len(plan.eval)}-seed{seed}")
        pool_acts, t_pool = run_extract(tree_plan.train, f"{treebank}-train-n{len(tree_plan.train)}-seed{seed}")
        n_all, _, hidden = train_acts.layers.shape
        record.update(num_hidden_states=int(n_all), hidden_size=int(hidden))
        del handle
        gc.collect()
        sel = list(range(n_all)) if layers is None else [int(l) for l in layers]
        record["layers"] = sel
        ext = {"upos": {k: t_train[k] + t_eval[k] for k in ("wall_s", "cpu_s")},
               "structural": {k: t_pool[k] + t_eval[k] for k in ("wall_s", "cpu_s")}}
        record["extraction"] = {"train": t_train, "eval": t_eval, "structural_pool": t_pool, **ext,
                                "words": {"train": int(train_acts.num_words), "eval": int(eval_acts.num_words),
                                          "structural_pool": int(pool_acts.num_words)}}
        print(f"{model}: {n_all} hidden states x {hidden}; extraction UPOS {ext['upos']['wall_s']:.1f} s "
              f"({train_acts.num_words} + {eval_acts.num_words} words), structural pool {t_pool['wall_s']:.1f} s "
              f"({pool_acts.num_words} words)", flush=True)

        # (b) UPOS, as probes.syntax.tasks.fit_classification_task fits the task
        t_off, e_off = train_acts.sentence_offsets, eval_acts.sentence_offsets
        fit = build_items("upos", plan.train, t_off, plan.fit, seed, defaults.deprel_subtypes)
        stop = build_items("upos", plan.train, t_off, plan.stop, seed, defaults.deprel_subtypes)
        ev = build_items("upos", plan.eval, e_off, None, seed, defaults.deprel_subtypes)
        vocab = {l: i for i, l in enumerate(sorted(set(fit.labels)))}
        c = len(vocab)
        y_fit, y_stop, y_ev = encode_labels(fit.labels, vocab), encode_labels(stop.labels, vocab), encode_labels(ev.labels, vocab)
        known = y_ev < c
        x_fit = FeatureView(train_acts.layers, fit.cols)
        x_stop = FeatureView(train_acts.layers, stop.cols)
        x_ev = FeatureView(eval_acts.layers, ev.cols)
        layer_batch = layers_per_fit(len(sel), len(fit), hidden, defaults.memory_budget_gb * 2**30)
        cfg = dict(defaults.probe_config, kind="linear", seed=seed, layer_batch=layer_batch, progress=progress)
        with timed() as t_fit, peak_memory() as mem:
            res = fitting.fit_probe(x_fit, y_fit, x_stop, y_stop, num_classes=c + 1, layers=sel, config=cfg)
        with timed() as t_score:
            acc = (res.correct(x_ev, y_ev) & known[None]).mean(1)
        feat = len(sel) * len(fit) * hidden * 4  # the fp32 [layers, fit words, H] the fit reads
        record["upos"] = {
            "fit": t_fit, "score": t_score, "config": fitting.config_dict(res.config), "steps": int(res.steps),
            "best_step": res.best_step.tolist(), "train_words": len(fit), "stop_words": len(stop),
            "eval_words": len(ev), "num_classes": c, "feature_bytes": feat, "memory": mem,
            "accuracy": [float(a) for a in acc],
            "ratio_wall": t_fit["wall_s"] / ext["upos"]["wall_s"], "ratio_cpu": t_fit["cpu_s"] / ext["upos"]["cpu_s"],
            "rss_increase_over_features": (mem["rss_peak"] - mem["rss_before"]) / feat if mem["rss_peak"] else None,
            "anon_increase_over_features": (mem["anon_peak"] - mem["anon_before"]) / feat if mem["anon_peak"] else None,
        }  # fmt: skip
        if reference:  # the fit run to convergence, on the same features and split
            ref_cfg = dict(cfg, optimizer="lbfgs", early_stopping=False, max_iter=1000, tol=1e-6, progress=progress)
            with timed() as t_ref:
                ref = fitting.fit_probe(x_fit, y_fit, x_stop, y_stop, num_classes=c + 1, layers=sel, config=ref_cfg)
            ref_acc = (ref.correct(x_ev, y_ev) & known[None]).mean(1)
            gap = (ref_acc - acc) * 100  # points the default fit is BELOW the converged one
            record["upos"]["reference"] = {"fit": t_ref, "steps": int(ref.steps), "accuracy": [float(a) for a in ref_acc],
                                           "below_reference_points": [float(g) for g in gap],
                                           "worst_below_points": float(gap.max())}
            print(f"  UPOS reference (L-BFGS to convergence, {ref.steps} iterations): {t_ref['wall_s']:.1f} s; default "
                  f"fit at most {gap.max():.2f} points below it (layer {int(np.argmax(gap))}), mean "
                  f"{(acc.mean() - ref_acc.mean()) * 100:+.2f} points", flush=True)
            del ref
        print(f"  UPOS fit ({res.config.optimizer}, {res.steps} steps): {t_fit['wall_s']:.1f} s wall = "
              f"{record['upos']['ratio_wall']:.2f}x extraction (CPU {record['upos']['ratio_cpu']:.2f}x); peak RSS "
              f"{mem['rss_peak'] / 2**30:.2f} GiB (+{(mem['rss_peak'] - mem['rss_before']) / 2**30:.2f}) vs features "
              f"{feat / 2**30:.2f} GiB; accuracy per layer {np.round(acc, 4).tolist()}", flush=True)
        del res, x_fit, x_stop
        gc.collect()

        # (c) structural distance, as probes.syntax.tasks.fit_structural_task fits it
        fit_ids = tree_plan.fit
        if len(fit_ids) > trees:
            fit_ids = np.sort(np.random.default_rng([seed, 3]).choice(fit_ids, trees, replace=False))
        subset = None if layers is None else sel
        train_t = tree_set(pool_acts, tree_plan.train, fit_ids, subset)
        stop_t = tree_set(pool_acts, tree_plan.train, tree_plan.stop, subset)
        eval_t = tree_set(eval_acts, plan.eval, None, subset)
        with timed() as t_sfit, peak_memory() as smem:
            fitted = st.fit_structural_probe(train_t, stop_t, kind="distance", seed=seed, progress=progress,
                                             **defaults.structural)
        with timed() as t_sscore:
            scores = st.score_distance(st.predict(fitted, eval_t), eval_t)
        tree_words = int(np.diff(train_t.offsets).sum())
        sfeat = len(sel) * tree_words * hidden * 4
        record["structural_distance"] = {
            "fit": t_sfit, "score": t_sscore, "trees": len(train_t), "stop_trees": len(stop_t),
            "eval_trees": len(eval_t), "train_words": tree_words, "epochs": int(fitted.epochs),
            # `standardized` as fitted: records before issue 49 have settings {} for the raw fit (then the default)
            "settings": dict(defaults.structural), "standardized": fitted.scaling is not None,
            "feature_bytes": sfeat, "memory": smem,
            "uuas": [s["uuas"] for s in scores], "dspr": [s["dspr"] for s in scores],
            "right_branching_uuas": st.right_branching_uuas(eval_t),
            "ratio_wall": t_sfit["wall_s"] / ext["structural"]["wall_s"],
            "ratio_cpu": t_sfit["cpu_s"] / ext["structural"]["cpu_s"],
            "rss_increase_over_features": (smem["rss_peak"] - smem["rss_before"]) / sfeat if smem["rss_peak"] else None,
            "anon_increase_over_features": (smem["anon_peak"] - smem["anon_before"]) / sfeat if smem["anon_peak"] else None,
        }  # fmt: skip
        r = record["structural_distance"]
        print(f"  structural-distance fit ({len(train_t)} trees, {fitted.epochs} epochs): {t_sfit['wall_s']:.1f} s wall "
              f"= {r['ratio_wall']:.2f}x extraction (CPU {r['ratio_cpu']:.2f}x); peak RSS {smem['rss_peak'] / 2**30:.2f} "
              f"GiB; UUAS per layer {np.round(r['uuas'], 4).tolist()} (chain {r['right_branching_uuas']:.4f})",
              flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


# --------------------------------------------------------------------------- CLI
def _positive(name: str, value: int) -> None:
    if value < 1:
        print(f"bench_real_probe: {name} must be >= 1, got {value}", file=sys.stderr)
        sys.exit(2)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="Hub names or checkpoint folders")
    p.add_argument("--sentences", type=int, default=1000, help="EWT train sentences for UPOS (10%% stop set)")
    p.add_argument("--eval-sentences", type=int, default=500, help="EWT dev sentences scored")
    p.add_argument("--trees", type=int, default=2000, help="structural-probe training trees")
    p.add_argument("--threads", type=int, default=2, help="torch threads (intra-op)")
    p.add_argument("--layers", default=None, help="comma-separated hidden-state indices to fit (smoke runs)")
    p.add_argument("--batch-size", type=int, default=32, help="extraction batch size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, default=None, help="where the temporary activation cache goes")
    raw = p.add_mutually_exclusive_group()
    raw.add_argument("--structural-raw", action="store_true",
                     help="the structural probe on raw features (structural: {standardize: false}; the default before issue 49)")
    raw.add_argument("--structural-standardize", action="store_true",
                     help="z-scored features: the default since issue 49 (kept so that older commands run)")
    p.add_argument("--reference", action="store_true",
                   help="also fit UPOS with L-BFGS run to convergence and report each layer's gap to it")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--json", type=Path, help="output file (default: benchmarks/results/bench_real_probe-<host>-<time>.json)")
    args = p.parse_args(argv)
    for name in ("sentences", "eval_sentences", "trees", "threads", "batch_size"):
        _positive("--" + name.replace("_", "-"), getattr(args, name))
    if args.sentences < 2:
        print("bench_real_probe: --sentences must be >= 2 (a fit and a stop set)", file=sys.stderr)
        sys.exit(2)
    layers = None
    if args.layers is not None:
        try:
            layers = sorted({int(x) for x in args.layers.split(",") if x.strip()})
        except ValueError:
            layers = []
        if not layers or min(layers) < 0:
            print(f"bench_real_probe: --layers must be comma-separated indices >= 0, got {args.layers!r}",
                  file=sys.stderr)
            sys.exit(2)
    torch.set_num_threads(args.threads)
    from results_io import record_start, write_result
    from threadpoolctl import threadpool_limits

    start = record_start()
    out = {}
    from workbench.errors import ConfigError

    with threadpool_limits(args.threads):
        for model in args.models:
            try:
                out[model] = measure(model, args.sentences, args.eval_sentences, args.trees, layers, args.seed,
                                     args.batch_size, work_dir=args.work_dir, progress=args.progress,
                                     structural={"standardize": False} if args.structural_raw else None,
                                     reference=args.reference)
            except ConfigError as e:
                print(f"bench_real_probe: {e}", file=sys.stderr)
                sys.exit(2)
    write_result("bench_real_probe", {"threads": args.threads, "torch": torch.__version__, "models": out}, start,
                 args.json)


if __name__ == "__main__":
    main()
