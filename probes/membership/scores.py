"""Per-example statistics: each family's own likelihood of a text, a classifier's confidence (`Stats`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from probes.membership import attacks as ma
from probes.membership.samples import Sample


# --------------------------------------------------------------------------- per-example statistics
@dataclass
class Stats:
    """Per example: mean NLL, and (language models) token log-probs and Min-K%++ moments; phi is
    LiRA's logit-scaled confidence."""

    nll: np.ndarray
    phi: np.ndarray
    logprobs: list | None = None
    mu: list | None = None
    sigma: list | None = None


def scored_by(handle, electra_head: str = "generator") -> str:
    """What scores a model's texts: the LM kind, and for ELECTRA which of its two heads."""
    from workbench.running.lm_scores import is_electra, lm_scorer

    kind = lm_scorer(handle, electra_head if is_electra(handle) else "generator").kind
    return f"{kind} ({electra_head})" if is_electra(handle) else kind


def lm_stats(handle, texts: list[str], batch_size: int, moments: bool = True, progress: bool = False,
             electra_head: str = "generator") -> Stats:
    """The family's own likelihood of each text (see the module docstring); `electra_head` picks
    ELECTRA's generator or discriminator and is ignored for other families (`scored_by` says which)."""
    from workbench.running.lm_scores import is_electra, lm_scorer

    scorer = lm_scorer(handle, electra_head if is_electra(handle) else "generator")
    if scorer.kind == "seq2seq":
        scores = scorer.seq2seq_logprobs(texts, texts, batch_size=batch_size, moments=moments, progress=progress)
    else:
        scores = scorer.text_logprobs(texts, batch_size=batch_size * (2 if scorer.kind == "mlm" else 1),
                                      moments=moments, progress=progress)
    nll = np.array([ma.mean_nll(s.logprobs) for s in scores])
    return Stats(nll, ma.scaled_logit_from_mean_logprob(-nll), [s.logprobs for s in scores],
                 [s.mu for s in scores] if moments else None, [s.sigma for s in scores] if moments else None)


def classifier_stats(checkpoint, handle, data, sample: Sample, batch_size: int) -> Stats:
    """Cross-entropy on the true label and Carlini et al.'s logit-scaled confidence of a fine-tuned classifier."""
    from workbench.store.checkpoints import read_manifest
    from workbench.drivers.finetune import (
        collate,
        encode,
        load_classifier,
        load_finetune_config,
    )

    cfg = load_finetune_config(read_manifest(checkpoint)["finetune"]["config"])
    model = load_classifier(checkpoint)
    enc = encode(handle, data, [int(i) for i in sample.task_index], min(cfg.max_len, handle.max_length))
    logits = []
    with torch.inference_mode():
        for b0 in range(0, len(enc.ids), batch_size):
            batch = collate(enc, list(range(b0, min(b0 + batch_size, len(enc.ids)))), handle.pad_id)
            batch.pop("labels")
            logits.append(model(**batch).logits.float().cpu().numpy())
    z = np.concatenate(logits).astype(np.float64)
    y = sample.labels
    logp = z - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True)) - z.max(1, keepdims=True)
    return Stats(-logp[np.arange(len(y)), y], ma.scaled_logit_from_logits(z, y))
