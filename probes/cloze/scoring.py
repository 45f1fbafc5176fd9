"""Zero-shot multiple choice with the model's own head, and the logit lens scored the same way."""

from __future__ import annotations

import numpy as np

from probes.core import statistics
from workbench import logit_lens
from workbench.lm_scores import LMScorer


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



def lens_correct(scorer: LMScorer, items, batch_size: int = 32) -> np.ndarray:
    """[L+1, N] bool: the logit lens' answer at every layer against the items' own answers."""
    answers = np.array([it.answer for it in items])
    return lens_scores(scorer, items, batch_size).argmax(-1) == answers[None]
