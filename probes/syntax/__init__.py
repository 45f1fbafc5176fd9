"""Syntax probes over every layer of a list of checkpoints: POS tags, dependency labels and arcs, trees.

`run_syntax_probes(checkpoints, tasks, treebank="en_ewt")` loads a UD treebank, extracts word
vectors of every layer once per checkpoint (`workbench.activations`, cached), fits probes for all
layers at once with the shared fitters (`probes.core.fitting`) and the structural probes
(`probes.syntax.structural`), and writes one run of tidy rows to the results store.

Tasks
- `upos`, `xpos`: one label per word.
- `deprel`: edge probing (Tenney et al. 2019): the relation label of an arc from the head word's
  and the dependent word's vectors, [h_head; h_dep] (`pair_features="concat_product"` adds
  h_head * h_dep). Deliberate difference: Tenney et al. pool spans with learned attention and use an
  MLP; our spans are single words and the probe is the shared linear (or MLP) probe. The root arc
  has no head word: root arcs are counted (`notes.pairs`) and left out.
- `arc`: "is (a, b) an arc?": positives are the gold (head, dependent) pairs (root arcs left out),
  negatives are ordered pairs of the same sentence that are not linked in either direction, sampled
  1:1 per sentence without replacement (seeded); a sentence with fewer unlinked pairs than arcs
  gives what it has and the shortfall is counted.
- `structural-distance`, `structural-depth`: Hewitt & Manning (2019) via `probes.syntax.structural`: UUAS,
  DSpr, root accuracy, NSpr, and the linear-chain (right-branching) UUAS baseline.

Baselines (`baselines=`)
- `control`: Hewitt & Liang (2019) control task through `baselines.control_labels`: each word type gets
  a label drawn from the task's train label distribution; the type is the word form for upos/xpos,
  the DEPENDENT's form for deprel, and the ordered pair (head form, dependent form) for arc (a
  binary control: a probe can pass it only by memorising type pairs). Selectivity = accuracy -
  control accuracy, with a paired sentence-bootstrap CI.
- `majority`: the most frequent train label, scored on the eval items.
- `random_init`: the same probes on `handle.derive("random_init", ...)` (same class and config, fresh
  weights, same tokenizer).

Splits. Probes are fitted on `train_split` and scored on `eval_split`; early stopping uses a
held-out fraction of the TRAIN sentences (`early_stopping_fraction`, seeded), never the eval split.
A treebank without the requested splits is resolved: es_gsd (dev + test only) trains on dev and
evaluates on test; PUD (test only) and any `train_split == eval_split` are split by sentence
(seeded, `holdout_fraction` for eval). What was used is in the manifest (`notes.splits`).

Rows (`workbench.results.RESULT_COLUMNS`): probe="syntax", task in TASKS, split = the eval split
(scalar-mix rows: "<train_split>:stop", the stopping set they are scored on), stack, layer (0 =
embeddings), model = checkpoint name ("<name> (random init)" for the twin, extra.baseline =
"random_init"), family/seed/step from the checkpoint's manifest.json (None without one), n = eval
items (words, arcs, pairs, gold edges or sentences), ci_low/ci_high = 95% percentile bootstrap over
sentences. Metrics:
- classification tasks: accuracy, train_accuracy, control_accuracy, selectivity, majority (and with
  `probe="mlp"` the same names prefixed "mlp_"); MDL tasks (Voita & Titov 2020): mdl_codelength
  (bits), compression; scalar-mix tasks (Peters et al. 2018; Tenney et al. 2019): per layer
  scalar_mix_weight and cumulative_accuracy (mix of layers 0..l), and with layer=None
  centre_of_gravity, expected_layer, scalar_mix_accuracy;
- structural-distance: uuas, dspr, right_branching_uuas; structural-depth: root_acc, nspr.
Data-only baselines (majority, right_branching_uuas) are written for each real checkpoint, not for
twins. Baseline rows say so in their data (`baselines.mark_baselines`): extra.baseline = "majority",
"control" or "right_branching" and extra.baseline_for = the metric they are a reference for. `extra` holds treebank, train split, pooling, probe seed, n_train and the classifier kind;
accuracy rows also the accuracy on each bootstrap resample (`boot`, the same resamples for every
layer), from which `probes.core.depth` gives CIs of the expected and peak layer.

The run manifest holds the config, seeds, the treebank files with checksums, the checkpoints with
hashes (twins: `notes.random_init_twins`), the extraction counts per model and split
(`notes.extraction`: windowed sentences, windows, words cut by a window, empty sentences, words
mapped to no subword), pair counts (`notes.pairs`) and per-stage timings (`notes.timings_s`).

Resuming: each finished (model, stack, task) is saved under `<runs root>/partials/` as it
completes (`workbench.results.FinishedUnits`); rerunning the same command after a crash or Ctrl-C
reuses those units (listed in `notes.reused_units`) and extracts nothing new (activation cache), so
only the missing work is done. The saved units are removed when the run is published.
"""

from __future__ import annotations

import math
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from probes.core import baselines, depth, fitting, mdl, runner, scalar_mix
from probes.syntax import structural as st
from probes.core import statistics as stats
from workbench.errors import ConfigError

TASKS = ("upos", "xpos", "deprel", "arc", "structural-distance", "structural-depth")
CLASSIFICATION_TASKS = ("upos", "xpos", "deprel", "arc")
STRUCTURAL_TASKS = ("structural-distance", "structural-depth")
# `structural:` settings, passed through to `probes.syntax.structural.fit_structural_probe` (its defaults).
STRUCTURAL_SETTINGS = ("rank", "epochs", "batch_size", "lr", "patience", "lr_decay", "standardize")
BASELINES = ("majority", "control", "random_init")
PROBE_KINDS = ("linear", "mlp")
PAIR_FEATURES = ("concat", "concat_product")
NAME = "syntax"
RANDOM_INIT_SUFFIX = runner.RANDOM_INIT_SUFFIX
EXTRACTION_COUNTS = ("sentences", "words", "windowed_sentences", "windows", "words_cut_by_window",
                     "empty_sentences", "no_subword_words")  # fmt: skip


# --------------------------------------------------------------------------- feature views
class FeatureView(fitting.LazyFeatures):
    """Rows of a `[L, N, H]` array (a memmap) gathered on demand, optionally as pairs.

    `cols` holds one or two int arrays of word positions into N; item p is the concatenation of
    `base[:, cols[k][p]]` over k (and, with `product`, the elementwise product of the two). Read one
    layer at a time (`fitting.LazyFeatures`), so pair features of a whole treebank are never all in
    memory unless asked for, and the fitter's one float32 copy per layer group is the only copy.
    """

    def __init__(self, base, cols: Sequence[np.ndarray], product: bool = False):
        if not 1 <= len(cols) <= 2 or (product and len(cols) != 2):
            raise ConfigError("FeatureView takes one index array, or two for pairs")
        self.base = base
        self.cols = [np.asarray(c, dtype=np.int64) for c in cols]
        self.product = product
        n_parts = len(self.cols) + int(product)
        self.shape = (int(base.shape[0]), len(self.cols[0]), int(base.shape[2]) * n_parts)

    def _layer(self, layer, rows, out):
        plane = self.base[layer]
        h = int(self.base.shape[2])
        parts = [np.asarray(plane[c[rows]], dtype=np.float32) for c in self.cols]
        for k, part in enumerate(parts):
            out[:, k * h : (k + 1) * h] = part
        if self.product:
            np.multiply(parts[0], parts[1], out=out[:, 2 * h : 3 * h])


def sentence_rows(offsets: np.ndarray, sentence_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(word positions, new offsets) of the given sentences, concatenated in the given order."""
    offsets = np.asarray(offsets, dtype=np.int64)
    idx = np.asarray(sentence_ids, dtype=np.int64)
    lengths = offsets[idx + 1] - offsets[idx]
    new = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    if len(idx) == 0:
        return np.zeros(0, dtype=np.int64), new
    rows = np.repeat(offsets[idx] - new[:-1], lengths) + np.arange(int(new[-1]), dtype=np.int64)
    return rows, new


# --------------------------------------------------------------------------- task items
@dataclass
class Items:
    """The examples of one classification task on one set of sentences.

    cols: word positions (one array per word; two for pairs) into the activations of the split;
    labels/types: gold label and control-task type key per item; sentence: index of the item's
    sentence within the set (for bootstrapping); counts: what was built or left out.
    """

    cols: list[np.ndarray]
    labels: list[str]
    types: list[str]
    sentence: np.ndarray
    counts: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.labels)


def arcs(heads: Sequence[int]) -> list[tuple[int, int]]:
    """0-based (head, dependent) pairs of a sentence, the root arc left out."""
    return [(h - 1, d) for d, h in enumerate(heads) if h > 0]


def sample_non_arcs(heads: Sequence[int], k: int, rng: np.random.Generator) -> list[tuple[int, int]]:
    """Up to `k` ordered pairs (a, b), a != b, linked by no arc in either direction, without replacement."""
    n = len(heads)
    linked = np.zeros((n, n), dtype=bool)
    for h, d in arcs(heads):
        linked[h, d] = linked[d, h] = True
    np.fill_diagonal(linked, True)
    candidates = np.flatnonzero(~linked.ravel())
    take = rng.choice(candidates, size=min(k, len(candidates)), replace=False) if k > 0 else candidates[:0]
    return [(int(c // n), int(c % n)) for c in np.sort(take)]


def build_items(task: str, sentences, offsets: np.ndarray, sentence_ids: Sequence[int] | None = None,
                seed: int = 0, deprel_subtypes: bool = True) -> Items:
    """Items of a classification task for `sentences[sentence_ids]`; offsets locate their words.

    `offsets` are the activation offsets of the full list `sentences`. For `arc`, the negatives of
    sentence i are drawn with a generator seeded by (seed, i), so they do not depend on which other
    sentences are in the set.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    ids = range(len(sentences)) if sentence_ids is None else [int(i) for i in sentence_ids]
    a_idx, b_idx, labels, types, sent = [], [], [], [], []
    counts: Counter = Counter()
    for j, i in enumerate(ids):
        s, base = sentences[i], int(offsets[i])
        if task in ("upos", "xpos"):
            tags = s.upos if task == "upos" else s.xpos
            for w, (form, tag) in enumerate(zip(s.words, tags)):
                a_idx.append(base + w)
                labels.append(tag)
                types.append(form)
                sent.append(j)
            counts["words"] += len(s.words)
            continue
        pos = arcs(s.heads)
        counts["root_arcs_left_out"] += len(s.heads) - len(pos)
        if task == "deprel":
            for h, d in pos:
                rel = s.deprels[d] if deprel_subtypes else s.deprels[d].split(":")[0]
                a_idx.append(base + h)
                b_idx.append(base + d)
                labels.append(rel)
                types.append(s.words[d])
                sent.append(j)
            counts["arcs"] += len(pos)
        elif task == "arc":
            neg = sample_non_arcs(s.heads, len(pos), np.random.default_rng([seed, i]))
            counts["positive_pairs"] += len(pos)
            counts["negative_pairs"] += len(neg)
            counts["negative_shortfall"] += len(pos) - len(neg)
            for (h, d), label in [(p, "arc") for p in pos] + [(p, "none") for p in neg]:
                a_idx.append(base + h)
                b_idx.append(base + d)
                labels.append(label)
                types.append(f"{s.words[h]}\x00{s.words[d]}")
                sent.append(j)
        else:
            raise ConfigError(f"not a classification task: {task!r}")
    cols = [np.asarray(a_idx, dtype=np.int64)] + ([np.asarray(b_idx, dtype=np.int64)] if task in ("deprel", "arc") else [])
    return Items(cols, labels, types, np.asarray(sent, dtype=np.int64), dict(counts))


# --------------------------------------------------------------------------- data
@dataclass
class SplitPlan:
    """Which sentences of which files the probes train on, stop on, and are scored on."""

    train: list  # Sentence objects the activations are extracted for ("train pool": fit + stop)
    fit: np.ndarray  # indices into train: probe training sentences
    stop: np.ndarray  # indices into train: early-stopping sentences
    eval: list
    train_split: str
    eval_split: str
    files: list[Path]
    description: dict[str, Any]


def plan_splits(treebank: str, train_split: str, eval_split: str, *, max_train_sentences: int | None,
                max_eval_sentences: int | None, early_stopping_fraction: float, holdout_fraction: float,
                seed: int) -> SplitPlan:
    """Load the treebank and choose sentences (see the module docstring, "Splits")."""
    from workbench.data.conllu import TREEBANKS, load_treebank, treebank_path

    if treebank not in TREEBANKS:
        raise ConfigError(f"unknown treebank {treebank!r}; known: {sorted(TREEBANKS)}")
    have = TREEBANKS[treebank]
    requested = (train_split, eval_split)
    if train_split not in have or eval_split not in have:
        if (train_split, eval_split) != ("train", "dev"):
            raise ConfigError(f"treebank {treebank} has splits {have}, not {train_split!r}/{eval_split!r}")
        train_split, eval_split = (have[0], have[1]) if len(have) >= 2 else (have[0], have[0])
    rng = np.random.default_rng([seed, 1])
    train_all = load_treebank(treebank, train_split)
    files = [treebank_path(treebank, train_split)]
    if train_split == eval_split:  # one split: hold out sentences for evaluation
        order = rng.permutation(len(train_all))
        n_eval = max(1, int(round(holdout_fraction * len(train_all))))
        eval_ids = np.sort(order[:n_eval])
        train_ids = np.sort(order[n_eval:])
        eval_all = [train_all[i] for i in eval_ids]
        train_all = [train_all[i] for i in train_ids]
    else:
        eval_all = load_treebank(treebank, eval_split)
        files.append(treebank_path(treebank, eval_split))
    train = _cap(train_all, max_train_sentences, rng)
    evals = _cap(eval_all, max_eval_sentences, rng)
    if len(train) < 2:
        raise ConfigError(f"need at least 2 training sentences, got {len(train)}")
    order = rng.permutation(len(train))
    n_stop = min(len(train) - 1, max(1, int(round(early_stopping_fraction * len(train)))))
    stop, fit = np.sort(order[:n_stop]), np.sort(order[n_stop:])
    desc = {"treebank": treebank, "requested": list(requested), "train_split": train_split,
            "eval_split": eval_split, "held_out_from_one_split": train_split == eval_split,
            "train_sentences_available": len(train_all), "eval_sentences_available": len(eval_all),
            "fit_sentences": len(fit), "stop_sentences": len(stop), "eval_sentences": len(evals)}  # fmt: skip
    return SplitPlan(train, fit, stop, evals, train_split, eval_split, files, desc)


def _cap(sentences: list, cap: int | None, rng: np.random.Generator) -> list:
    """A seeded sample of `cap` sentences, kept in file order (all of them without a cap)."""
    if cap is None or cap >= len(sentences):
        return list(sentences)
    if cap < 1:
        raise ConfigError(f"sentence caps must be >= 1, got {cap}")
    return [sentences[i] for i in np.sort(rng.choice(len(sentences), size=cap, replace=False))]


# --------------------------------------------------------------------------- fitting helpers
def _encode(labels: Sequence[str], vocab: dict[str, int]) -> np.ndarray:
    """Label strings -> indices; a label unseen in training gets len(vocab) (never counted correct)."""
    unk = len(vocab)
    return np.fromiter((vocab.get(l, unk) for l in labels), dtype=np.int64, count=len(labels))


def _layer_batch(n_layers: int, n_items: int, dim: int, budget_bytes: float) -> int | None:
    """Layers per batched fit so that one group's float32 features stay under the budget."""
    per_layer = max(1, n_items * dim * 4)
    k = int(budget_bytes // per_layer)
    return None if k >= n_layers else max(1, k)


def _length_averaged_ci(values: np.ndarray, lengths: np.ndarray, n_boot: int, seed: int):
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


# --------------------------------------------------------------------------- settings
def _no_cap_if_zero(value):
    return None if value == 0 else value


@dataclass
class SyntaxSettings(runner.Settings):
    """Settings of the syntax probes (see the module docstring); every field is a CLI option."""

    tasks: tuple[str, ...] = field(default=TASKS, metadata={"help": "comma-separated tasks"})
    baselines: tuple[str, ...] = field(default=BASELINES, metadata={
        "help": "subset of majority,control,random_init ('' for none)"})
    treebank: str = field(default="en_ewt", metadata={"help": "en_ewt | en_gum | es_gsd | en_pud | es_pud"})
    train_split: str = "train"
    eval_split: str = "dev"
    pooling: str = field(default="first", metadata={"help": "first | mean | last subword of each word"})
    classifier: tuple[str, ...] = field(default=("linear",), metadata={"help": "linear | mlp | linear,mlp (alias --probe)"})
    max_train_sentences: int | None = field(default=None, metadata={"help": "cap on training sentences (seeded sample)"})
    max_eval_sentences: int | None = None
    pair_features: str = field(default="concat", metadata={"help": "concat | concat_product (deprel, arc)"})
    deprel_subtypes: bool = True
    mdl_tasks: tuple[str, ...] = field(default=("upos",), metadata={"help": "tasks with an MDL online code ('' for none)"})
    mdl_max_examples: int | None = 20000
    mdl_fractions: tuple[float, ...] | None = None
    scalar_mix_tasks: tuple[str, ...] = field(default=("upos",), metadata={"help": "tasks with a scalar mix ('' for none)"})
    structural_max_train_sentences: int | None = field(default=2000, metadata={
        "help": "cap on the structural probes' training sentences (0 = no cap)"})
    structural: dict = field(default_factory=dict, metadata={
        "help": "structural probe settings: rank, epochs, batch_size, lr, patience, lr_decay, standardize"})
    probe_config: dict = field(default_factory=dict, metadata={"help": "fitting.ProbeConfig overrides"})
    early_stopping_fraction: float = 0.1
    holdout_fraction: float = 0.2
    memory_budget_gb: float = field(default=1.0, metadata={"help": "features in memory per batched fit"})

    BASELINES = BASELINES
    EXECUTION_FIELDS = runner.Settings.EXECUTION_FIELDS + ("memory_budget_gb",)

    def __post_init__(self):
        self.structural_max_train_sentences = _no_cap_if_zero(self.structural_max_train_sentences)

    def validate(self, spec) -> None:
        from workbench.data.conllu import TREEBANKS

        super().validate(spec)
        if not self.classifier or any(k not in PROBE_KINDS for k in self.classifier):
            raise ConfigError(f"classifier must be one or more of {PROBE_KINDS}, got {list(self.classifier)}")
        if self.pair_features not in PAIR_FEATURES:
            raise ConfigError(f"pair_features must be one of {PAIR_FEATURES}, got {self.pair_features!r}")
        if self.pooling not in ("first", "mean", "last"):
            raise ConfigError(f"pooling must be first, mean or last, got {self.pooling!r}")
        if self.treebank not in TREEBANKS:
            raise ConfigError(f"unknown treebank {self.treebank!r}; known: {sorted(TREEBANKS)}")
        if not 0 < self.early_stopping_fraction < 1 or not 0 < self.holdout_fraction < 1:
            raise ConfigError("early_stopping_fraction and holdout_fraction must lie in (0, 1)")
        for key in ("max_train_sentences", "max_eval_sentences", "mdl_max_examples", "structural_max_train_sentences"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be >= 1 (or unset), got {value}")
        for key in ("mdl_tasks", "scalar_mix_tasks"):
            bad = [t for t in getattr(self, key) if t not in CLASSIFICATION_TASKS]
            if bad:
                raise ConfigError(f"{key}: {bad} are not classification tasks {list(CLASSIFICATION_TASKS)}")
        if self.mdl_fractions is not None and not all(0 < f <= 1 for f in self.mdl_fractions):
            raise ConfigError(f"mdl_fractions must lie in (0, 1], got {list(self.mdl_fractions)}")
        unknown = set(self.structural) - set(STRUCTURAL_SETTINGS)
        if unknown:
            raise ConfigError(f"unknown structural probe settings {sorted(unknown)}")
        bad_keys = set(self.probe_config) - set(fitting.ProbeConfig.__dataclass_fields__)
        if bad_keys:
            raise ConfigError(f"unknown probe_config key(s) {sorted(bad_keys)}")
        if self.memory_budget_gb <= 0:
            raise ConfigError(f"memory_budget_gb must be > 0, got {self.memory_budget_gb}")


# --------------------------------------------------------------------------- data, once per run
@dataclass
class SyntaxData:
    plan: SplitPlan
    train_words: list
    eval_words: list
    train_key: str  # activation-cache keys: the treebank split and, for a subset, its size and seed
    eval_key: str


def prepare(settings: SyntaxSettings) -> runner.Prepared:
    s = settings
    plan = plan_splits(s.treebank, s.train_split, s.eval_split, max_train_sentences=s.max_train_sentences,
                       max_eval_sentences=s.max_eval_sentences, early_stopping_fraction=s.early_stopping_fraction,
                       holdout_fraction=s.holdout_fraction, seed=s.seed)
    desc = plan.description
    subset = s.max_train_sentences is not None or desc["held_out_from_one_split"]
    train_key = f"{s.treebank}-{plan.train_split}" + (f"-n{len(plan.train)}-seed{s.seed}" if subset else "")
    eval_subset = desc["held_out_from_one_split"] or len(plan.eval) < desc["eval_sentences_available"]
    eval_key = f"{s.treebank}-{plan.eval_split}" + (f"-n{len(plan.eval)}-seed{s.seed}" if eval_subset else "")
    data = SyntaxData(plan, [x.words for x in plan.train], [x.words for x in plan.eval], train_key, eval_key)
    return runner.Prepared(data=data, files=plan.files, notes={"splits": desc, "extraction": {}})


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


def _context(unit, prepared: runner.Prepared, settings: SyntaxSettings) -> _Context:
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


def run_task(unit, prepared: runner.Prepared, task: str, settings: SyntaxSettings) -> list[pd.DataFrame]:
    ctx = _context(unit, prepared, settings)
    return _structural(ctx, task) if task in STRUCTURAL_TASKS else _classification(ctx, task)


def _rows(ctx: _Context, task: str, metrics, *, split=None, layers=None, n=None, ci=None, extra=None):
    """`extra`: one dict for every row, or a list with one per layer."""
    merged = [dict(ctx.extra, **e) for e in extra] if isinstance(extra, list) else dict(ctx.extra, **(extra or {}))
    return ctx.unit.rows(task, metrics, split=split or ctx.plan.eval_split, layers=layers, n=n, ci=ci, extra=merged)


def _classification(ctx: _Context, task: str) -> list[pd.DataFrame]:
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
    y_fit, y_stop, y_ev = _encode(fit.labels, vocab), _encode(stop.labels, vocab), _encode(ev.labels, vocab)
    known = y_ev < c
    unseen = int((~known).sum())
    if unseen:
        ctx.notes.setdefault("unseen_eval_labels", {})[task] = unseen
    product = ctx.settings.pair_features == "concat_product" and task in ("deprel", "arc")
    x_fit = FeatureView(ctx.train_acts.layers, fit.cols, product)
    x_stop = FeatureView(ctx.train_acts.layers, stop.cols, product)
    x_ev = FeatureView(ctx.eval_acts.layers, ev.cols, product)
    n_layers = x_fit.shape[0]
    layer_batch = _layer_batch(n_layers, len(fit), x_fit.shape[2], ctx.memory_budget)
    out = []
    extra = {"n_train": len(fit), "num_classes": c, "unseen_eval_labels": unseen}
    if task in ("deprel", "arc"):
        extra["pair_features"] = "concat_product" if product else "concat"
    # Control labels: one draw per type from the train label distribution, same for every split.
    want_control = "control" in ctx.baselines
    if want_control:
        dist = baselines.label_distribution(y_fit, c)
        ctrl = [baselines.control_labels(items.types, dist, seed) for items in (fit, stop, ev)]
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
            cres = fitting.fit_probe(x_fit, ctrl[0], x_stop, ctrl[1], num_classes=c, config=cfg)
            ccorrect = cres.correct(x_ev, ctrl[2])
            cacc, clo, chi = stats.ratio_bootstrap(ccorrect, None, ev.sentence, n_boot=ctx.n_boot, seed=seed)
            sel, slo, shi = stats.ratio_bootstrap(correct.astype(np.float64) - ccorrect, None, ev.sentence,
                                                  n_boot=ctx.n_boot, seed=seed)
            metrics.update({f"{prefix}control_accuracy": cacc, f"{prefix}selectivity": sel})
            cis.update({f"{prefix}control_accuracy": (clo, chi), f"{prefix}selectivity": (slo, shi)})
        ctx.timings[f"{task}:{kind}"] = round(time.perf_counter() - t0, 3)
        out.append(baselines.mark_baselines(_rows(ctx, task, metrics, n=len(ev), ci=cis, extra=dict(extra, classifier=kind)),
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
        cfg = dict(ctx.settings.probe_config, kind="linear", seed=seed, layer_batch=layer_batch, progress=ctx.progress)
        kw = {"fractions": ctx.settings.mdl_fractions} if ctx.settings.mdl_fractions else {}
        code = mdl.mdl_online_code(x_mdl, y_fit[idx], num_classes=c, config=cfg, seed=seed, **kw)
        out.append(_rows(ctx, task, {"mdl_codelength": code.online_codelength, "compression": code.compression},
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


def _tree_set(acts, sentences, ids=None) -> st.TreeSet:
    if ids is None:
        return st.TreeSet(acts.layers, np.asarray(acts.sentence_offsets), [np.asarray(s.heads) for s in sentences],
                          [s.upos for s in sentences])
    rows, offsets = sentence_rows(acts.sentence_offsets, ids)
    chosen = [sentences[i] for i in ids]
    return st.TreeSet(FeatureView(acts.layers, [rows]), offsets, [np.asarray(s.heads) for s in chosen],
                      [s.upos for s in chosen])


def _structural(ctx: _Context, task: str) -> list[pd.DataFrame]:
    plan, seed = ctx.plan, ctx.seed
    fit_ids = plan.fit
    cap = ctx.settings.structural_max_train_sentences
    if cap is not None and len(fit_ids) > cap:
        fit_ids = np.sort(np.random.default_rng([seed, 3]).choice(fit_ids, cap, replace=False))
    train = _tree_set(ctx.train_acts, plan.train, fit_ids)
    stop = _tree_set(ctx.train_acts, plan.train, plan.stop)
    ev = _tree_set(ctx.eval_acts, plan.eval)
    kind = "distance" if task == "structural-distance" else "depth"
    t0 = time.perf_counter()
    fitted = st.fit_structural_probe(train, stop, kind=kind, seed=seed, progress=ctx.progress, **ctx.settings.structural)
    preds = st.predict(fitted, ev)
    n_layers = len(preds)
    lengths = np.array([len(h) for h in ev.heads])
    extra = {"n_train": len(train), "rank": int(fitted.proj.shape[-1]), "epochs": fitted.epochs,
             "lr_decay": fitted.lr_decay}
    if fitted.scaling is not None:
        extra["standardized"] = True
    out = []
    scores = st.sentence_scores(kind, preds, ev)
    if kind == "distance":
        correct, total = scores["uuas_correct"], scores["uuas_total"]
        uuas, lo, hi = stats.ratio_bootstrap(correct, total, n_boot=ctx.n_boot, seed=seed)  # per-sentence sums
        dspr = st.length_averaged(scores["dspr"], lengths)
        dlo, dhi = _length_averaged_ci(scores["dspr"], lengths, ctx.n_boot, seed)
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
        nlo, nhi = _length_averaged_ci(scores["nspr"], lengths, ctx.n_boot, seed)
        out.append(_rows(ctx, task, {"root_acc": acc}, n=int(counted.sum()), ci={"root_acc": (lo, hi)}, extra=extra))
        out.append(_rows(ctx, task, {"nspr": nspr}, n=len(ev), ci={"nspr": (nlo, nhi)}, extra=extra))
    ctx.timings[task] = round(time.perf_counter() - t0, 3)
    return out



# --------------------------------------------------------------------------- public entry point
def run_syntax_probes(checkpoints: Sequence[str | Path | Any], tasks: Sequence[str] = TASKS, store=None,
                      **settings: Any) -> tuple[str, pd.DataFrame]:
    """Fit the syntax probes on every layer of every checkpoint; one run in the results store.

    checkpoints: checkpoint folders, training folders (every saved step), Hub names in the local
    cache, or open model handles. `settings` are SyntaxSettings fields (`probe=` is accepted for
    `classifier=`, the probe kind). Returns (run_id, rows). See the module docstring.
    """
    if "probe" in settings:
        settings["classifier"] = settings.pop("probe")
    settings["tasks"] = tasks
    return runner.run_probe(PROBE, checkpoints, settings, store=store)


def _counts(stats: Mapping[str, int]) -> dict[str, int]:
    """Every extraction count, the bad-input ones always present (0 when nothing happened)."""
    out = {k: int(stats.get(k, 0)) for k in EXTRACTION_COUNTS}
    out.update({k: int(v) for k, v in stats.items() if k not in out})
    return out


# --------------------------------------------------------------------------- summary table
def format_layer_table(rows: pd.DataFrame) -> str:
    """Per-layer summary of a syntax run: one block per checkpoint and stack (twins folded into their checkpoint).

    Columns: layer, UPOS accuracy [95% CI], UPOS selectivity, UUAS, and the baselines: UPOS majority,
    random-init UPOS accuracy, random-init UUAS, linear-chain UUAS. "-" where a task was not run.
    """
    if rows is None or len(rows) == 0:
        return "(no rows)"
    df = rows[(rows["probe"] == NAME) & rows["layer"].notna()]
    df = df[~df["split"].astype(str).str.contains(":")]
    stacks = [s for s in dict.fromkeys(df["stack"].tolist()) if isinstance(s, str)]
    if len(stacks) > 1:  # an encoder-decoder probed on both stacks: one block per stack
        return "\n\n".join(_format_blocks(df[df["stack"] == s], f" [{s}]") for s in stacks)
    return _format_blocks(df, "")


def _format_blocks(df: pd.DataFrame, suffix: str) -> str:
    def series(model, task, metric):
        sub = df[(df["model"] == model) & (df["task"] == task) & (df["metric"] == metric)]
        return {int(r.layer): r for r in sub.itertuples()}

    def fmt(r, ci=False):
        if r is None or r.value is None or (isinstance(r.value, float) and math.isnan(r.value)):
            return "-"
        s = f"{r.value:.3f}"
        if ci and pd.notna(r.ci_low) and pd.notna(r.ci_high):
            s += f" [{r.ci_low:.3f},{r.ci_high:.3f}]"
        return s

    models = [m for m in dict.fromkeys(df["model"].tolist()) if not str(m).endswith(RANDOM_INIT_SUFFIX)]
    header = ["layer", "UPOS acc [95% CI]", "UPOS sel", "UUAS", "UPOS majority", "rand-init UPOS", "rand-init UUAS",
              "chain UUAS"]  # fmt: skip
    blocks = []
    for model in models:
        twin = model + RANDOM_INIT_SUFFIX
        acc = series(model, "upos", "accuracy") or series(model, "upos", "mlp_accuracy")
        sel = series(model, "upos", "selectivity") or series(model, "upos", "mlp_selectivity")
        uuas, maj = series(model, "structural-distance", "uuas"), series(model, "upos", "majority")
        racc = series(twin, "upos", "accuracy") or series(twin, "upos", "mlp_accuracy")
        ruuas, chain = series(twin, "structural-distance", "uuas"), series(model, "structural-distance", "right_branching_uuas")
        layers = sorted(set().union(acc, sel, uuas, maj, racc, ruuas, chain))
        table = [header] + [[str(l), fmt(acc.get(l), True), fmt(sel.get(l)), fmt(uuas.get(l)), fmt(maj.get(l)),
                             fmt(racc.get(l)), fmt(ruuas.get(l)), fmt(chain.get(l))] for l in layers]  # fmt: skip
        blocks.append(f"== {model}{suffix}\n" + runner.aligned(table))
    if not blocks:
        return "(no per-layer syntax rows)"
    if len(models) <= MAX_LAYER_BLOCKS:
        return "\n\n".join(blocks)
    # A sweep over many checkpoints: the last one in full, then one line per checkpoint and metric.
    run_ids = df["run_id"].dropna().unique().tolist() if "run_id" in df else []
    show = f"bertology runs show {run_ids[0]}" if len(run_ids) == 1 else "bertology runs show RUN_ID"
    out = [f"(per-layer tables of the other {len(models) - 1} checkpoints: `{show}`)", blocks[-1]]
    for task, metric, label in CHECKPOINT_MATRICES:
        cells = {m: series(m, task, metric) for m in models}
        layers = sorted(set().union(*cells.values()))
        if layers:
            table = [[label + " | layer"] + [str(l) for l in layers]]
            table += [[m] + [fmt(cells[m].get(l)) for l in layers] for m in models]
            out.append(f"== {label} by checkpoint and layer{suffix}\n" + runner.aligned(table))
    return "\n\n".join(out)


MAX_LAYER_BLOCKS = 3  # more checkpoints than this: one matrix per metric instead of a block each
CHECKPOINT_MATRICES = (("upos", "accuracy", "UPOS acc"), ("upos", "selectivity", "UPOS sel"),
                       ("structural-distance", "uuas", "UUAS"), ("structural-depth", "root_acc", "root acc"))


# --------------------------------------------------------------------------- CLI
def _cli_hook(parser):
    """The syntax CLI's two shorthands: `--probe` for `--classifier`, `--structural-epochs N`."""
    parser.add_argument("--probe", default=None, help="alias of --classifier (linear | mlp | linear,mlp)")
    parser.add_argument("--structural-epochs", type=int, default=None, help="structural probe epochs (default 30)")

    def apply(args, values: dict) -> None:
        if args.probe is not None:
            values["classifier"] = args.probe
        if args.structural_epochs is not None:
            values["structural"] = dict(values.get("structural") or {}, epochs=args.structural_epochs)

    return apply


PROBE = runner.ProbeSpec(
    name=NAME, tasks=TASKS, settings=SyntaxSettings, prepare=prepare, run_task=run_task,
    description="Syntax probes (UPOS, XPOS, deprel, arc, structural) on every layer.",
    summary=format_layer_table, cli_hook=_cli_hook, twin_once_per_run=True, version=3,  # 3: structural lr_decay 0.1
)


def syntax_cli_main(argv: Sequence[str] | None = None) -> int:
    """`bertology probe syntax ...` (0 on success, 2 with one line on stderr for bad input)."""
    from workbench.errors import cli_errors

    return cli_errors(lambda: runner.cli_main(NAME, argv), "bertology probe syntax")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(syntax_cli_main())
