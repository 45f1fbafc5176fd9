"""Zero-shot multiple choice with the model's own head, and the logit lens scored the same way.

Three scoring rules (`SCORING`, the probe's `scoring` setting); the candidate with the highest
score is the answer:

- "raw": the candidate's score under the family's own rule (`LMScorer.score_candidates`: the
  log-probability at the mask, the PLL, the filled sentence's log-likelihood, the sentinel or
  infilling target).
- "contextual": contextual calibration against a content-free input (Zhao et al. 2021, "Calibrate
  Before Use"): score_raw(a | x) - score_raw(a | x_cf), where x_cf is the item's own template with
  every content word replaced by one neutral word (`probes.cloze.tasks.content_free`, the nonsense
  control's slots): the tokenizer's mask token for a masked LM (a masked LM reads a masked word as
  "unknown"), "N/A" (Zhao et al.'s own) for every other head. Both terms are the raw rule of the
  head, so the words around the blank are scored on both sides and cancel only in part. Where a
  masked LM scores a context by PLL (a candidate of several pieces), a mask token written in the
  text is context and not scored (`LMInputs.mlm_candidate_rows`: before issue 49 it was, and its
  log p depended on the candidate beside it). Until issue 49 this rule was called "pmi".
- "pmi_dc": domain-conditional PMI (Holtzman et al. 2021, "Surface Form Competition: Why the
  Highest Probability Answer Isn't Always Right"): log P(a | x) - log P(a | x_domain), only the
  answer's tokens scored in both terms (`score_candidates(..., answer_only=True)`, every head
  type). x is the item with its gap written "___" followed by the task's domain premise
  (`probes.cloze.tasks.DOMAIN_PREMISES`, e.g. "In age, the first person is <blank>."), x_domain
  that premise alone, as their " the answer is:". The answer comes after the whole item, so a
  causal LM reads all of it (in the item's own blank it would not see the words after the gap);
  the same frame for every head keeps the rule one rule. Whatever makes a candidate likely after
  the premise whatever the item (its frequency, its fit to the question's wording) is divided out;
  what is left is how much the item raises it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from probes.cloze import tasks as ct
from probes.core import statistics
from workbench.running import logit_lens
from workbench.errors import ConfigError
from workbench.running.lm_scores import CandidateScores, LMScorer

SCORING = ("raw", "contextual", "pmi_dc")
RENAMED = {"pmi": "'pmi' was two rules under one name; use 'contextual' (content-free template, Zhao et al. "
                  "2021: what 'pmi' computed) or 'pmi_dc' (domain premise, answer tokens only, Holtzman et al. 2021)"}
CONTENT_FREE_WORD = "N/A"  # Zhao et al. (2021)'s content-free input, for heads without a mask token of their own


def scoring_error(rules) -> str | None:
    """Why `rules` is not a valid `scoring` value (one line), or None: a non-empty subset of
    `SCORING`, each once; the retired name "pmi" gets its own message naming its two successors."""
    rules = tuple(rules)
    for r in rules:
        if r in RENAMED:
            return f"cloze: scoring {RENAMED[r]}"
    if not rules or len(set(rules)) != len(rules) or set(rules) - set(SCORING):
        return f"cloze: scoring must be a subset of {','.join(SCORING)} (each once), got {','.join(rules)!r}"
    return None


def _check_scoring(rules) -> None:
    why = scoring_error(rules)
    if why:
        raise ConfigError(why)


def metric_name(metric: str, scoring: str) -> str:
    """The row metric of `metric` under a scoring rule: raw keeps today's names (zero_shot_acc,
    lens_nonsense_gap, ...); any other rule goes before the last part (zero_shot_contextual_acc,
    lens_nonsense_pmi_dc_gap), so two rules never share a row key."""
    if scoring == "raw":
        return metric
    head, _, tail = metric.rpartition("_")
    return f"{head}_{scoring}_{tail}"


def content_free_word(scorer: LMScorer) -> str:
    """The neutral word that replaces the content words for the contextual rule (module
    docstring): the mask token for a masked LM (ELECTRA's generator included), "N/A" otherwise."""
    if scorer.kind == "mlm":
        return scorer.handle.tokenizer.mask_token
    return CONTENT_FREE_WORD


def reference_items(scorer: LMScorer, items, rule: str) -> list:
    """The items a calibrated rule divides by: contextual the content-free items, pmi_dc the
    domain premises alone."""
    return ct.content_free(items, content_free_word(scorer)) if rule == "contextual" else ct.domain_only(items)


def _unique(ref_items):
    """(unique contexts, their candidate lists, index of each item's among them): a task's
    reference texts repeat (one per template or task), and each is scored once."""
    keys = [(it.text, tuple(it.choices)) for it in ref_items]
    index: dict = {}
    where = np.array([index.setdefault(k, len(index)) for k in keys], dtype=np.int64)
    return [t for t, _ in index], [list(c) for _, c in index], where


def reference_scores(scorer: LMScorer, items, rule: str, batch_size: int = 32,
                     cache: dict | None = None) -> list[list[float]]:
    """Each item's candidates scored in the rule's reference context: contextual log P(a | x_cf)
    by the raw rule, pmi_dc log P(a | x_domain) answer tokens only. `cache` ({(rule, text,
    candidates): scores}, filled here) lets the nonsense control reuse the test items' references,
    which are the same texts."""
    ctx, cands, where = _unique(reference_items(scorer, items, rule))
    cache = {} if cache is None else cache
    keys = [(rule, t, tuple(c)) for t, c in zip(ctx, cands)]
    todo = [k for k in keys if k not in cache]
    if todo:
        got = scorer.score_candidates([t for _, t, _ in todo], [list(c) for _, _, c in todo], batch_size=batch_size,
                                      answer_only=rule == "pmi_dc").scores
        cache.update(zip(todo, got))
    return [cache[keys[w]] for w in where]


def calibrated(scores: CandidateScores, reference: list[list[float]]) -> CandidateScores:
    """Each candidate's score minus its score in the reference context."""
    return dataclasses.replace(scores, scores=[[a - b for a, b in zip(r, c, strict=True)]
                                               for r, c in zip(scores.scores, reference, strict=True)])


# --------------------------------------------------------------------------- items -> texts


def contexts_of(items) -> tuple[list[str], list[list[str]], np.ndarray]:
    return [it.text for it in items], [list(it.choices) for it in items], np.array([it.answer for it in items])


def accuracy_ci(correct, n_boot: int = statistics.N_BOOT, seed: int = 0):
    """Accuracy [...] with a percentile bootstrap CI over items, each its own unit (`correct`: [..., N]
    bool, or a paired difference of two correctness vectors)."""
    return statistics.ratio_bootstrap(np.asarray(correct, dtype=np.float64), None, None, n_boot=n_boot, seed=seed)


def zero_shot(scorer: LMScorer, items, batch_size: int = 32, scoring: str = "raw"):
    """(correct [N] bool, CandidateScores) of the model's own head on `items`, by the rule
    `scoring` (one of `SCORING`, module docstring)."""
    return zero_shot_rules(scorer, items, batch_size, (scoring,))[scoring]


def zero_shot_rules(scorer: LMScorer, items, batch_size: int = 32, scoring=("raw",), cache: dict | None = None) -> dict:
    """{rule: (correct [N] bool, CandidateScores)} for each rule of `scoring`: the raw scores
    computed once for raw and contextual (which is raw minus the content-free scores), the
    answer-only scores of the framed items once for pmi_dc (`cache`: see `reference_scores`)."""
    _check_scoring(scoring)
    ctx, cands, answers = contexts_of(items)
    raw = scorer.score_candidates(ctx, cands, batch_size=batch_size) if {"raw", "contextual"} & set(scoring) else None
    out = {}
    for rule in scoring:
        if rule == "raw":
            scores = raw
        elif rule == "contextual":
            scores = calibrated(raw, reference_scores(scorer, items, rule, batch_size, cache))
        else:
            framed, _, _ = contexts_of(ct.in_domain(items))
            premise = scorer.score_candidates(framed, cands, batch_size=batch_size, answer_only=True)
            scores = calibrated(premise, reference_scores(scorer, items, rule, batch_size, cache))
        out[rule] = (np.asarray(scores.best()) == answers, scores)
    return out


# --------------------------------------------------------------------------- logit lens


def lens_scores(scorer: LMScorer, items, batch_size: int = 32, scoring: str = "raw") -> np.ndarray:
    """Candidate scores [L+1, N, K] of the items at every layer (the logit lens,
    `workbench.running.logit_lens.candidate_scores`, the one implementation the app's explorer reads too);
    a calibrated rule subtracts the same layer's scores in its reference context, so the last
    layer is the zero-shot rule of the same name."""
    return lens_scores_rules(scorer, items, batch_size, (scoring,))[scoring]


def lens_scores_rules(scorer: LMScorer, items, batch_size: int = 32, scoring=("raw",)) -> dict[str, np.ndarray]:
    """{rule: lens scores [L+1, N, K]} for each rule of `scoring`, the raw lens computed once."""
    _check_scoring(scoring)
    ctx, cands, _ = contexts_of(items)
    raw = logit_lens.candidate_scores(scorer, ctx, cands, batch_size) if {"raw", "contextual"} & set(scoring) else None
    out = {}
    for rule in scoring:
        answer_only = rule == "pmi_dc"
        if rule == "raw":
            out[rule] = raw
            continue
        ref_ctx, ref_cands, where = _unique(reference_items(scorer, items, rule))
        ref = logit_lens.candidate_scores(scorer, ref_ctx, ref_cands, batch_size, answer_only)[:, where]
        base = raw if rule == "contextual" else logit_lens.candidate_scores(
            scorer, contexts_of(ct.in_domain(items))[0], cands, batch_size, answer_only=True)
        out[rule] = base - ref
    return out


def lens_correct(scorer: LMScorer, items, batch_size: int = 32, scoring: str = "raw") -> np.ndarray:
    """[L+1, N] bool: the logit lens' answer at every layer against the items' own answers."""
    return lens_correct_rules(scorer, items, batch_size, (scoring,))[scoring]


def lens_correct_rules(scorer: LMScorer, items, batch_size: int = 32, scoring=("raw",)) -> dict[str, np.ndarray]:
    """{rule: [L+1, N] bool}: each rule's logit-lens answer at every layer against the answers."""
    answers = np.array([it.answer for it in items])
    return {rule: s.argmax(-1) == answers[None] for rule, s in lens_scores_rules(scorer, items, batch_size, scoring).items()}
