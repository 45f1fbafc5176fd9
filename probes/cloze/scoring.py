"""Zero-shot multiple choice with the model's own head, and the logit lens scored the same way.

Two scoring rules (`SCORING`, the probe's `scoring` setting):

- "raw": the candidate's score under the family's own rule (`LMScorer.score_candidates`: the
  log-probability at the mask, the PLL, the filled sentence's log-likelihood, the sentinel or
  infilling target); the candidate with the highest score is the answer.
- "pmi": domain-conditional pointwise mutual information (Holtzman et al. 2021, "Surface Form
  Competition: Why the Highest Probability Answer Isn't Always Right"):
  PMI_DC(a, x) = log P(a | x) - log P(a | x_domain), where x_domain, the "domain premise", is the
  task's prompt without the item's content (theirs: e.g. " the answer is:" for CommonsenseQA, the
  connective " because" / " so" for COPA). A candidate that is likely in any sentence of the task
  (a frequent surface form, or the word the template itself favours) no longer wins for that
  alone: only how much the item's content raises its score counts. Here x_domain is the item's
  own template with every content word replaced by one neutral word (`probes.cloze.tasks.content_free`,
  the nonsense control's slots), and the candidate's score in it is computed by exactly the raw rule
  of the head type, so for every head type
      score_pmi(a | x) = score_raw(a | x) - score_raw(a | x_content_free)   (tested, exactly).
  The neutral word (`content_free_word`) is the content-free input of Zhao et al. (2021, "Calibrate
  Before Use"): the tokenizer's mask token for a masked LM ("[MASK]": a masked LM was trained to
  read a masked word as "unknown", so at the blank it gives P(a | template, content unknown)),
  "N/A" for every other head (causal LMs, ELMo, T5's sentinel and BART's infilling targets, whose
  one blank the mask / sentinel already marks). One wart, left as it is: when a candidate of a
  masked LM has several pieces, the raw rule is the filled sentence's PLL, and the tokenizer does
  not flag a mask token written in the text as special, so the content-free PLL also scores each
  [MASK] slot as a token (log p("[MASK]"), the same input masked or not); with one-piece
  candidates (method "mask") only the blank is scored.
  Differences from Holtzman et al., on purpose: (1) their x_domain is a hand-written string per
  dataset and only the answer's tokens are scored; the oLMpics blank sits inside the sentence and
  the raw rule of every head scores the words around it too (the filled sentence, the PLL, BART's
  whole target), so the domain premise keeps the template's words on both sides of the blank,
  scored by the same rule, and the log P(left context) terms cancel in the comparison; (2) the
  premise is derived from the template, not written per task, so every task and the nonsense
  control (same templates, so the same premise) get it without hand choices.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from probes.cloze import tasks as ct
from probes.core import statistics
from workbench.running import logit_lens
from workbench.errors import ConfigError
from workbench.running.lm_scores import CandidateScores, LMScorer

SCORING = ("raw", "pmi")
CONTENT_FREE_WORD = "N/A"  # Zhao et al. (2021)'s content-free input, for heads without a mask token of their own


def metric_name(metric: str, scoring: str) -> str:
    """The row metric of `metric` under a scoring rule: raw keeps today's names (zero_shot_acc,
    lens_nonsense_gap, ...); pmi puts "_pmi" before the last part (zero_shot_pmi_acc,
    lens_nonsense_pmi_gap), so the two rules never share a row key."""
    if scoring == "raw":
        return metric
    head, _, tail = metric.rpartition("_")
    return f"{head}_{scoring}_{tail}"


def content_free_word(scorer: LMScorer) -> str:
    """The neutral word that replaces the content words in the domain premise (module docstring):
    the mask token for a masked LM (ELECTRA's generator included), "N/A" otherwise."""
    if scorer.kind == "mlm":
        return scorer.handle.tokenizer.mask_token
    return CONTENT_FREE_WORD


def _content_free_unique(scorer: LMScorer, items):
    """(unique content-free contexts, their candidate lists, index of each item's among them): a
    one-template task has one domain premise per candidate list, scored once."""
    cf = ct.content_free(items, content_free_word(scorer))
    keys = [(it.text, tuple(it.choices)) for it in cf]
    index: dict = {}
    where = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)
    uniq = list(index)
    return [t for t, _ in uniq], [list(c) for _, c in uniq], where


def content_free_scores(scorer: LMScorer, items, batch_size: int = 32, cache: dict | None = None) -> list[list[float]]:
    """Each item's candidates scored by the raw rule in the item's content-free context (the
    domain premise): log P(a | x_domain). `cache` ({(premise, candidates): scores}, filled here)
    lets the nonsense control reuse its test items' premises, which are the same texts."""
    ctx, cands, where = _content_free_unique(scorer, items)
    cache = {} if cache is None else cache
    todo = [k for k in zip(ctx, map(tuple, cands)) if k not in cache]
    if todo:
        got = scorer.score_candidates([t for t, _ in todo], [list(c) for _, c in todo], batch_size=batch_size).scores
        cache.update(zip(todo, got))
    keys = list(zip(ctx, map(tuple, cands)))
    return [cache[keys[w]] for w in where]


def calibrated(raw: CandidateScores, content_free: list[list[float]]) -> CandidateScores:
    """Domain-conditional PMI: each candidate's raw score minus its content-free score."""
    return dataclasses.replace(raw, scores=[[a - b for a, b in zip(r, c, strict=True)]
                                            for r, c in zip(raw.scores, content_free, strict=True)])


# --------------------------------------------------------------------------- items -> texts


def contexts_of(items) -> tuple[list[str], list[list[str]], np.ndarray]:
    return [it.text for it in items], [list(it.choices) for it in items], np.array([it.answer for it in items])


def accuracy_ci(correct, n_boot: int = statistics.N_BOOT, seed: int = 0):
    """Accuracy [...] with a percentile bootstrap CI over items, each its own unit (`correct`: [..., N]
    bool, or a paired difference of two correctness vectors)."""
    return statistics.ratio_bootstrap(np.asarray(correct, dtype=np.float64), None, None, n_boot=n_boot, seed=seed)


def zero_shot(scorer: LMScorer, items, batch_size: int = 32, scoring: str = "raw"):
    """(correct [N] bool, CandidateScores) of the model's own head on `items`, by the rule
    `scoring` ("raw" or "pmi", module docstring)."""
    return zero_shot_rules(scorer, items, batch_size, (scoring,))[scoring]


def zero_shot_rules(scorer: LMScorer, items, batch_size: int = 32, scoring=("raw",), cache: dict | None = None) -> dict:
    """{rule: (correct [N] bool, CandidateScores)} for each rule of `scoring`, the raw scores
    computed once (PMI is raw minus the content-free scores, so both rules share them; `cache`:
    see `content_free_scores`)."""
    for rule in scoring:
        _check_scoring(rule)
    ctx, cands, answers = contexts_of(items)
    raw = scorer.score_candidates(ctx, cands, batch_size=batch_size)
    out = {}
    for rule in scoring:
        scores = raw if rule == "raw" else calibrated(raw, content_free_scores(scorer, items, batch_size, cache))
        out[rule] = (np.asarray(scores.best()) == answers, scores)
    return out


def _check_scoring(scoring: str) -> None:
    if scoring not in SCORING:
        raise ConfigError(f"cloze: scoring must be one of {list(SCORING)}, got {scoring!r}")


# --------------------------------------------------------------------------- logit lens


def lens_scores(scorer: LMScorer, items, batch_size: int = 32, scoring: str = "raw") -> np.ndarray:
    """Candidate scores [L+1, N, K] of the items at every layer (the logit lens,
    `workbench.running.logit_lens.candidate_scores`, the one implementation the app's explorer reads too);
    with scoring "pmi", minus the same layer's scores in the content-free context, so the last
    layer is the zero-shot rule of the same name."""
    return lens_scores_rules(scorer, items, batch_size, (scoring,))[scoring]


def lens_scores_rules(scorer: LMScorer, items, batch_size: int = 32, scoring=("raw",)) -> dict[str, np.ndarray]:
    """{rule: lens scores [L+1, N, K]} for each rule of `scoring`, the raw lens computed once."""
    for rule in scoring:
        _check_scoring(rule)
    ctx, cands, _ = contexts_of(items)
    raw = logit_lens.candidate_scores(scorer, ctx, cands, batch_size)
    out = {}
    for rule in scoring:
        if rule == "raw":
            out[rule] = raw
        else:
            cf_ctx, cf_cands, where = _content_free_unique(scorer, items)
            out[rule] = raw - logit_lens.candidate_scores(scorer, cf_ctx, cf_cands, batch_size)[:, where]
    return out


def lens_correct(scorer: LMScorer, items, batch_size: int = 32, scoring: str = "raw") -> np.ndarray:
    """[L+1, N] bool: the logit lens' answer at every layer against the items' own answers."""
    return lens_correct_rules(scorer, items, batch_size, (scoring,))[scoring]


def lens_correct_rules(scorer: LMScorer, items, batch_size: int = 32, scoring=("raw",)) -> dict[str, np.ndarray]:
    """{rule: [L+1, N] bool}: each rule's logit-lens answer at every layer against the answers."""
    answers = np.array([it.answer for it in items])
    return {rule: s.argmax(-1) == answers[None] for rule, s in lens_scores_rules(scorer, items, batch_size, scoring).items()}
