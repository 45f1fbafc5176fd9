"""oLMpics-style cloze probes (Talmor et al. 2020): what the pretraining objective teaches, zero-shot
and layer by layer.

For each task of `probes.cloze.tasks` (age, always-never, antonym, objects, taxonomy, multihop) and
each model, on the test split:

- zero-shot multiple choice with the family's own head (`workbench.lm_scores`: MC-MLM at the mask
  for masked LMs, PLL when a candidate is several pieces, flagged in `extra.methods`; the filled
  sentence's log-likelihood for causal LMs and ELMo; sentinel / infilling targets for T5 / BART;
  ELECTRA through its generator): `zero_shot_acc` with a bootstrap CI over items, next to
  `majority_acc` (the train split's most frequent answer) and `random_acc` (1 / number of choices),
  and `nonsense_acc`, the same items with nonsense words in place of the content words (the
  language control: a model that reads the content falls to chance there);
- the logit lens (nostalgebraist 2020; Geva et al. 2022 read the FFN updates the same way): the
  model's own output head applied to every layer's hidden states (`lm_scores.layer_head`), scored
  exactly like the zero-shot rule, so `lens_acc` at the last layer equals `zero_shot_acc` (tested
  for every family). Per family: BERT-style masked LMs the MLM transform + decoder (ELECTRA: its
  generator's layers); GPT the final layer norm + unembedding; T5 and BART the DECODER's layers at
  the answer positions (T5: the decoder's final layer norm + rescaled `lm_head`; BART, post-LN with
  no final norm: `lm_head` + `final_logits_bias`), rows with stack `decoder`; no lens on a
  seq2seq encoder, whose states never meet the head (the decoder reads them through
  cross-attention); ELMo the shared softmax on each layer's forward and backward halves (layer 0:
  the token encoder's output, the same vector for both directions); with the language control,
  the lens on the nonsense items as well (`lens_nonsense_acc`) and the paired per-item gap
  (`lens_nonsense_gap`, CI over items), so a layer that reads the content can be told from one that
  prefers a candidate word;
- a linear probe on the blank's vector at every layer (`probes.core.fitting.fit_probe`, batched over
  layers; the blank is written as the tokenizer's mask token, T5's first sentinel, or "_"; causal
  stacks read the last word, the only one that has seen the whole sentence): `probe_acc` with its
  CI, Hewitt & Liang (2019) `control_acc` (labels drawn per lexical item, `key`) and
  `selectivity`; tasks with fixed choices only (taxonomy's choices change per item);
- optionally (`curve_sizes`), learning curves (the paper's protocol): the MC head fine-tuned on 62,
  125, ... training items with several seeds; per size the mean, standard deviation and maximum
  test accuracy, and the weighted score `weighted_score` (see `weighted_score`).

Differences from the paper: see `probes.cloze.tasks` for the data; the paper's
MC-MLM fine-tunes RoBERTa/BERT-large for a fixed number of epochs with model selection on dev;
here every size gets the same number of updates (`curve_steps`, batches sampled with replacement
from the N items), evaluated at the end on test (no model selection), so curves of different
sizes compare the data, not the compute.

The random-init twin's LM head is random, so its zero-shot accuracy is the chance reference of the
architecture (an ELECTRA twin has no generator: zero-shot rows are skipped for it, with a note).
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from probes.cloze import tasks as ct
from probes.core import baselines, fitting, runner
from probes.core import statistics
from workbench import logit_lens
from workbench.errors import CheckpointError, ConfigError
from workbench.lm_scores import BLANK, LMScorer, filled_items, lm_scorer, mlm_head
from workbench.loop import (
    NO_HOOKS,
    TrainingHooks,
    adamw,
    apply_param_filter,
    evaluating,
    loss_terms,
    optimizer_step,
    prepare_teacher,
)

NAME = "cloze"
TASKS = ct.TASKS
FIXED_CHOICE_TASKS = tuple(t for t in TASKS if t in ct.CHOICES)
PAPER_SIZES = (62, 125, 250, 500, 1000, 2000)


# --------------------------------------------------------------------------- items -> texts


def contexts_of(items) -> tuple[list[str], list[list[str]], np.ndarray]:
    return [it.text for it in items], [list(it.choices) for it in items], np.array([it.answer for it in items])


def accuracy_ci(correct, n_boot: int = statistics.N_BOOT, seed: int = 0):
    """Accuracy [...] with a percentile bootstrap CI over items, each its own unit (`correct`: [..., N]
    bool, or a paired difference of two correctness vectors)."""
    return statistics.ratio_bootstrap(np.asarray(correct, dtype=np.float64), None, None, n_boot=n_boot, seed=seed)


def zero_shot(scorer: LMScorer, items, batch_size: int = 32):
    """(correct [N] bool, CandidateScores) of the model's own head on `items`."""
    ctx, cands, answers = contexts_of(items)
    scores = scorer.score_candidates(ctx, cands, batch_size=batch_size)
    return np.asarray(scores.best()) == answers, scores


# --------------------------------------------------------------------------- logit lens


def lens_scores(scorer: LMScorer, items, batch_size: int = 32) -> np.ndarray:
    """Candidate scores [L+1, N, K] of the items at every layer (the logit lens,
    `workbench.logit_lens.candidate_scores`, the one implementation the app's explorer reads too)."""
    ctx, cands, _ = contexts_of(items)
    return logit_lens.candidate_scores(scorer, ctx, cands, batch_size)


# --------------------------------------------------------------------------- fine-tuning (MC-MLM)


class MCHead:
    """The multiple-choice head of Talmor et al. (2020) as a differentiable scorer: masked LMs
    score a candidate by its log-probability at the mask (several pieces: all masked at once,
    log-probs summed; the paper's choice for fine-tuning), causal LMs by the filled sentence's
    log-likelihood. Encodings are made once with the scorer's tokenisation; candidates whose
    masked inputs are identical (same number of pieces) share one row."""

    def __init__(self, scorer: LMScorer, items):
        if scorer.kind not in ("mlm", "causal"):
            raise ConfigError(f"fine-tuning the MC head is provided for masked and causal LMs, not {scorer.kind!r}")
        self.kind = scorer.kind
        self.pad = scorer.pad
        self.head = mlm_head(scorer.model) if self.kind == "mlm" else None
        self.answers = torch.tensor([it.answer for it in items])
        self.k = len(items[0].choices) if items else 0
        self.rows = []  # per item: list of unique row ids
        self.queries = []  # per item: list of (row within item, position, target, candidate)
        ctx, cands, _ = contexts_of(items)
        per_item = [[] for _ in items]
        for it in filled_items(ctx, cands):
            per_item[it[0]].append(it)
        for i, filled in enumerate(per_item):
            rows, queries, seen = [], [], {}
            for j, it in enumerate(filled):
                ids, special, pos = scorer.encode_filled(*it)
                if self.kind == "mlm":
                    row = ids.copy()
                    row[pos] = scorer.mask_id
                    tgt_pos, tgt = pos, ids[pos]
                else:
                    row = scorer.causal_row(ids, special, f"item {i}")
                    tgt_pos, tgt = np.arange(len(row) - 1), row[1:]  # logits at t predict t+1
                key = row.tobytes()
                if key not in seen:
                    seen[key] = len(rows)
                    rows.append(row)
                queries += [(seen[key], int(p), int(t), j) for p, t in zip(tgt_pos, tgt)]
            self.rows.append(rows)
            self.queries.append(np.array(queries, dtype=np.int64))

    def scores(self, model, index) -> torch.Tensor:
        """[B, K] candidate scores of items `index` (with gradients)."""
        rows, q = [], []
        for b, i in enumerate(index):
            qi = self.queries[i].copy()
            qi[:, 0] += len(rows)
            q.append(np.column_stack([qi, np.full(len(qi), b)]))
            rows += self.rows[i]
        q = np.concatenate(q)
        ids, att = self.pad(rows)
        dev = ids.device
        r, p, t = (torch.as_tensor(q[:, c], device=dev) for c in range(3))
        if self.head is not None:  # the head at the queried positions only
            hidden = model.base_model(input_ids=ids, attention_mask=att, return_dict=True).last_hidden_state
            logits = self.head(model, hidden[r, p])
        else:
            logits = model(input_ids=ids, attention_mask=att, return_dict=True).logits[r, p]
        lp = torch.log_softmax(logits.float(), -1).gather(1, t[:, None])[:, 0]
        flat = torch.as_tensor(q[:, 4] * self.k + q[:, 3], device=dev)
        out = torch.zeros(len(index) * self.k, device=dev, dtype=lp.dtype).index_add(0, flat, lp)
        return out.view(len(index), self.k)


def finetune_mc(scorer: LMScorer, train_items, eval_items, *, steps: int = 200, lr: float = 1e-4,
                batch_size: int = 16, seed: int = 0, eval_batch: int = 64, hooks: TrainingHooks | None = None) -> dict:
    """Fine-tune a copy of the LM (all weights, AdamW, constant lr) on the MC objective
    (cross-entropy over the candidate scores) for `steps` updates of `batch_size` items drawn
    with replacement from `train_items`; returns {"accuracy", "train_loss"} on `eval_items`, and
    which parameters trained ("trainable").

    The step is the workbench's shared one (`workbench.loop`): `hooks` may add an after-step hook,
    a parameter filter, or a teacher (scored with the same MC head) and a loss
    `loss(student_scores, item_indices, teacher_scores)`; then "train_terms" holds the mean of
    every term over the last 20 steps."""
    hooks = hooks or NO_HOOKS
    train, evals = MCHead(scorer, train_items), MCHead(scorer, eval_items)

    def mc_loss(scores, index) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.cross_entropy(scores, train.answers[index].to(scores.device))}

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = copy.deepcopy(scorer.model).train()
        trainable = apply_param_filter(model, hooks.trainable)
        opt = adamw(model.named_parameters(), lr, weight_decay=0.0)
        prepare_teacher(hooks, model.device)
        gen = torch.Generator().manual_seed(seed)
        steps_terms = []
        for step in range(steps):
            idx = torch.randint(len(train_items), (batch_size,), generator=gen).tolist()
            terms = loss_terms(model, idx, hooks, mc_loss, forward=train.scores)
            terms["loss"].backward()
            optimizer_step(model, opt, None, 0.0, hooks, step + 1)
            steps_terms.append({k: float(v.detach()) for k, v in terms.items()})
        with evaluating(model):
            pred = torch.cat([train_scores.argmax(1).cpu() for train_scores in
                              (evals.scores(model, list(range(b, min(b + eval_batch, len(eval_items)))))
                               for b in range(0, len(eval_items), eval_batch))])
    acc = float((pred == evals.answers).float().mean())
    last = steps_terms[-20:]
    out = {"accuracy": acc, "train_loss": float(np.mean([t["loss"] for t in last])) if last else float("nan"),
           "trainable": trainable}
    if hooks.loss is not None and last:
        out["train_terms"] = {k: float(np.mean([t[k] for t in last])) for k in last[0]}
    return out


def weighted_score(sizes, accuracies) -> float:
    """One number per learning curve that emphasises small training sizes (in the spirit of the
    paper's WS): the mean accuracy with weights falling linearly from the smallest size (weight
    K) to the largest (weight 1) over the K sizes, sizes taken in increasing order."""
    order = np.argsort(sizes)
    w = np.arange(len(order), 0, -1, dtype=np.float64)
    return float(np.sum(w * np.asarray(accuracies, dtype=np.float64)[order]) / w.sum())


# --------------------------------------------------------------------------- probe on the blank's vector


def blank_word(tokenizer) -> str:
    if tokenizer.mask_token:
        return tokenizer.mask_token
    vocab = tokenizer.get_vocab()
    for s in ("<extra_id_0>", "<sentinel_0>"):
        if s in vocab:
            return s
    return "_"


def probe_words(items, tokenizer, causal: bool) -> tuple[list[list[str]], np.ndarray]:
    """Word lists of the items (blank written as `blank_word`) and the word to read per item."""
    bw = blank_word(tokenizer)
    sents, where = [], []
    for it in items:
        words = it.text.replace(BLANK, f" {BLANK} ").split()
        k = words.index(BLANK)
        words[k] = bw
        sents.append(words)
        where.append(len(words) - 1 if causal else k)
    return sents, np.asarray(where)


# --------------------------------------------------------------------------- the probe module


@dataclass
class Settings(runner.Settings):
    baselines: tuple[str, ...] = field(default=("random_init", "majority", "control"), metadata={
        "help": "subset of random_init,majority,control ('' for none)"})
    BASELINES = ("random_init", "majority", "control")
    n_train: int = field(default=2000, metadata={"help": "train items per task (capped by the lexicon)"})
    n_test: int = field(default=500, metadata={"help": "dev and test items per task (capped by the lexicon)"})
    lens: bool = field(default=True, metadata={"help": "logit lens: the head on every layer"})
    probe: bool = field(default=True, metadata={"help": "linear probe on the blank's vector at every layer"})
    nonsense: bool = field(default=True, metadata={"help": "language control: nonsense words for content words"})
    curve_sizes: tuple[int, ...] = field(default=(), metadata={
        "help": "learning curve: fine-tune on these train sizes (paper: 62,125,250,500,1000,2000; '' = off)"})
    curve_seeds: int = field(default=3, metadata={"help": "fine-tuning seeds per learning-curve size"})
    curve_steps: int = field(default=200, metadata={"help": "fine-tuning updates per run"})
    curve_lr: float = field(default=1e-4, metadata={"help": "fine-tuning learning rate (AdamW)"})

    def validate(self, spec) -> None:
        super().validate(spec)
        if self.n_train < 2 or self.n_test < 10:
            raise ConfigError(f"cloze: n_train must be >= 2 and n_test >= 10, got {self.n_train}, {self.n_test}")
        if any(n < 2 for n in self.curve_sizes) or self.curve_seeds < 1 or self.curve_steps < 1 or self.curve_lr <= 0:
            raise ConfigError("cloze: curve_sizes must be >= 2, curve_seeds and curve_steps >= 1, curve_lr > 0")


def prepare(settings: Settings) -> runner.Prepared:
    from workbench.data.wordnet import wordnet_dir

    sizes = {"train": settings.n_train, "dev": settings.n_test, "test": settings.n_test}
    data, notes = {}, {"cloze_items": {}}
    for task in settings.tasks:
        items = ct.generate(task, seed=settings.seed, sizes=sizes)
        data[task] = {s: ct.split(items, s) for s in ct.SPLITS}
        data[task]["nonsense"] = ct.nonsense_control(data[task]["test"], seed=settings.seed)
        notes["cloze_items"][task] = {s: len(data[task][s]) for s in ct.SPLITS}
    files = []
    if {"antonym", "taxonomy"} & set(settings.tasks):
        files = sorted(p for p in wordnet_dir().iterdir() if p.name.startswith(("data.", "index.", "cntlist")))
    return runner.Prepared(data=data, files=files, notes=notes)


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
    seed, n_boot = settings.seed, settings.n_boot
    out: list[pd.DataFrame] = []
    # data-only and head-based rows once per model (with --stack all, on its first stack's unit)
    head_stack = unit.stack == unit.handle.stacks[0]
    scorer = _scorer(unit) if head_stack else None

    if not unit.is_twin and head_stack and "majority" in settings.baselines:
        _, maj = baselines.majority_baseline([it.answer for it in data["train"]], [it.answer for it in test])
        out.append(baselines.mark_baselines(unit.rows(task, {"majority_acc": [maj], "random_acc": [1.0 / K]}, split="test", layers=last,
                             n=len(test)), {"majority_acc": "majority", "random_acc": "chance"}))

    if scorer is not None and head_stack:
        correct, scores = zero_shot(scorer, test, settings.batch_size)
        acc, lo, hi = accuracy_ci(correct, n_boot, seed)
        methods = sorted({m for ms in scores.method for m in ms})
        multi = int(sum(any(n > 1 for n in ns) for ns in scores.n_pieces))
        metrics, ci = {"zero_shot_acc": [acc]}, {"zero_shot_acc": ([lo], [hi])}
        if settings.nonsense:
            c2, _ = zero_shot(scorer, data["nonsense"], settings.batch_size)
            a2, l2, h2 = accuracy_ci(c2, n_boot, seed)
            metrics["nonsense_acc"], ci["nonsense_acc"] = [a2], ([l2], [h2])
        out.append(unit.rows(task, metrics, split="test", layers=last, n=len(test), ci=ci,
                             extra={"methods": methods, "items_with_multipiece_candidates": multi,
                                    "head": scorer.kind}))
        if settings.lens:
            out.append(_lens_rows(unit, scorer, data, task, settings))
        if settings.curve_sizes:
            out.append(_learning_curve(unit, scorer, data, task, settings))

    if settings.probe and task in FIXED_CHOICE_TASKS:
        out.extend(_blank_probe(unit, data, task, settings))
    return out


def lens_correct(scorer: LMScorer, items, batch_size: int = 32) -> np.ndarray:
    """[L+1, N] bool: the logit lens' answer at every layer against the items' own answers."""
    answers = np.array([it.answer for it in items])
    return lens_scores(scorer, items, batch_size).argmax(-1) == answers[None]


def _lens_rows(unit, scorer, data, task, settings) -> pd.DataFrame:
    """Per layer: `lens_acc` on the test items and, with the language control, `lens_nonsense_acc`
    (the same items, nonsense words for the content words, answers unchanged) and
    `lens_nonsense_gap` = lens_acc - lens_nonsense_acc with a paired bootstrap CI over items (item i
    of the control is item i of the test set). A layer whose lens is above chance on the real items
    and at chance on the control reads the content; one that scores the same on both prefers a
    candidate word (or a surface cue) whatever the sentence says. At the last layer the two
    accuracies are zero_shot_acc and nonsense_acc (tested)."""
    test, seed, n_boot = data["test"], settings.seed, settings.n_boot
    lc = lens_correct(scorer, test, settings.batch_size)
    a, lo, hi = accuracy_ci(lc, n_boot, seed)
    metrics, ci = {"lens_acc": a}, {"lens_acc": (lo, hi)}
    if settings.nonsense:
        nc = lens_correct(scorer, data["nonsense"], settings.batch_size)
        metrics["lens_nonsense_acc"], l2, h2 = accuracy_ci(nc, n_boot, seed)
        ci["lens_nonsense_acc"] = (l2, h2)
        metrics["lens_nonsense_gap"], l3, h3 = accuracy_ci(lc.astype(np.float64) - nc, n_boot, seed)
        ci["lens_nonsense_gap"] = (l3, h3)
    # ELECTRA: the generator's layers (its own head), which may differ in number from the
    # discriminator's; T5/BART: the decoder's layers
    rows = unit.rows(task, metrics, split="test", n=len(test), ci=ci,
                     extra={"head_model": type(scorer.model).__name__})
    return rows.assign(stack="decoder") if scorer.kind == "seq2seq" else rows


def _learning_curve(unit, scorer, data, task, settings) -> pd.DataFrame:
    train, test = data["train"], data["test"]
    sizes = [n for n in settings.curve_sizes if n <= len(train)]
    if len(sizes) < len(settings.curve_sizes):
        unit.log(f"{task}: learning-curve sizes above {len(train)} train items skipped")
    means, sds, maxs, per_seed = [], [], [], []
    for n in sizes:
        accs = []
        for s in range(settings.curve_seeds):
            rng = np.random.default_rng([settings.seed, n, s])
            sub = [train[i] for i in sorted(rng.choice(len(train), size=n, replace=False))]
            accs.append(finetune_mc(scorer, sub, test, steps=settings.curve_steps, lr=settings.curve_lr,
                                    seed=settings.seed * 1000 + s)["accuracy"])
            unit.log(f"{task}: fine-tuned on {n} items (seed {s}): test accuracy {accs[-1]:.3f}")
        means.append(np.mean(accs)), sds.append(np.std(accs)), maxs.append(np.max(accs)), per_seed.append(accs)
    ws = weighted_score(sizes, means)
    L = unit.handle.num_layers[unit.stack]
    frames = [unit.rows(task, {"curve_acc_mean": [m], "curve_acc_sd": [sd], "curve_acc_max": [mx]}, split="test",
                        layers=[L], n=len(test), extra={"train_size": n, "seeds": settings.curve_seeds,
                                                        "steps": settings.curve_steps, "accuracies": a})
              for n, m, sd, mx, a in zip(sizes, means, sds, maxs, per_seed)]
    frames.append(unit.rows(task, {"weighted_score": [ws]}, split="test", layers=[L], n=len(test),
                            extra={"train_sizes": sizes}))
    return pd.concat(frames, ignore_index=True)


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


def summary(rows: pd.DataFrame) -> str:
    """Per model and task: zero-shot accuracy [CI], nonsense control, majority/random, and the best
    layer of the lens and of the probe."""
    if rows.empty:
        return "(no rows)"
    lines = []
    header = ["model", "task", "zero-shot [95% CI]", "nonsense", "majority", "random", "lens best (layer)",
              "lens nonsense there", "probe best (layer)", "weighted score"]
    table = [header]
    def one(g, metric, ci=False):
        r = g[g.metric == metric]
        if r.empty:
            return "-"
        r = r.iloc[-1]
        return f"{r.value:.3f} [{r.ci_low:.2f}, {r.ci_high:.2f}]" if ci and pd.notna(r.ci_low) else f"{r.value:.3f}"

    def best(g, metric):
        r = g[g.metric == metric]
        if r.empty:
            return "-"
        r = r.loc[r.value.idxmax()]
        return f"{r.value:.3f} ({int(r.layer)})"

    def at_lens_best(g):
        lens, ctl = g[g.metric == "lens_acc"], g[g.metric == "lens_nonsense_acc"]
        if lens.empty or ctl.empty:
            return "-"
        r = ctl[ctl.layer == lens.loc[lens.value.idxmax(), "layer"]]
        return f"{r.value.iloc[-1]:.3f}" if len(r) else "-"

    for (model, task), g in rows.groupby(["model", "task"], sort=False):
        maj = rows[(rows.task == task) & (rows.metric == "majority_acc")]
        rnd = rows[(rows.task == task) & (rows.metric == "random_acc")]
        table.append([model, task, one(g, "zero_shot_acc", True), one(g, "nonsense_acc"),
                      f"{maj.value.iloc[0]:.3f}" if len(maj) else "-", f"{rnd.value.iloc[0]:.3f}" if len(rnd) else "-",
                      best(g, "lens_acc"), at_lens_best(g), best(g, "probe_acc"), one(g, "weighted_score")])
    lines.append(runner.aligned(table))
    lens = lens_layer_table(rows)
    if len(lens) > 1:
        lines += ["", "Logit lens by layer, real items vs the nonsense-word control (gap: paired, 95% CI):",
                  runner.aligned(lens)]
    return "\n".join(lines)


def lens_layer_table(rows: pd.DataFrame) -> list[list[str]]:
    """Text cells, one line per (model, task, stack, layer) with lens rows: lens_acc [CI],
    lens_nonsense_acc [CI], lens_nonsense_gap [CI] (header first)."""
    def cell(r):
        if r is None:
            return "-"
        ci = f" [{r.ci_low:.2f}, {r.ci_high:.2f}]" if pd.notna(r.ci_low) else ""
        return f"{r.value:.3f}{ci}"

    table = [["model", "task", "stack", "layer", "lens [95% CI]", "nonsense control", "lens - control"]]
    sub = rows[rows.metric.isin(("lens_acc", "lens_nonsense_acc", "lens_nonsense_gap")) & rows.layer.notna()]
    for (model, task, stack, layer), g in sub.groupby(["model", "task", "stack", "layer"], sort=False):
        get = {m: g[g.metric == m].iloc[-1] for m in g.metric.unique()}
        table.append([model, task, str(stack), str(int(layer)), cell(get.get("lens_acc")),
                      cell(get.get("lens_nonsense_acc")), cell(get.get("lens_nonsense_gap"))])
    return table


PROBE = runner.ProbeSpec(name=NAME, tasks=TASKS, settings=Settings, prepare=prepare, run_task=run_task,
                         description="oLMpics cloze (Talmor et al. 2020): zero-shot with the model's own head, "
                                     "logit lens, blank probe, learning curves",
                         summary=summary, twin_once_per_run=True)
