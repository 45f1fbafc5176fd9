"""Pretraining objectives as pure, seeded functions over token-id tensors (no model code).

One home per objective; every random choice takes a CPU ``torch.Generator``; ``labels`` use -100
for "not predicted"; ``special_mask`` marks tokens that are never masked (CLS/SEP/PAD/BOS/EOS).

- :mod:`.mlm`: BERT masked LM, 80/10/10, whole-word masking (Devlin et al. 2019).
- :mod:`.spans`: SpanBERT span masking + SBO targets (Joshi et al. 2020).
- :mod:`.sentence_pairs`: NSP (Devlin et al. 2019) and SOP (Lan et al. 2020) pairs.
- :mod:`.electra`: replaced-token detection inputs/labels (Clark et al. 2020).
- :mod:`.seq2seq`: T5 span corruption (Raffel et al. 2020), BART infilling + permutation (Lewis et al. 2020).
- :mod:`.causal`: next-token labels and ELMo biLM targets (Peters et al. 2018).
"""

from workbench.objectives.causal import bilm_targets, causal_lm_labels, shift_labels
from workbench.objectives.electra import replaced_token_detection
from workbench.objectives.mlm import IGNORE_INDEX, default_candidate_ids, mask_tokens
from workbench.objectives.sentence_pairs import nsp_pair, sop_pair, truncate_pair
from workbench.objectives.seq2seq import (
    bart_noise,
    bart_infilling_plan,
    bart_sentence_permutation,
    bart_text_infilling,
    random_spans_noise_mask,
    t5_reconstruct,
    t5_span_corruption,
)
from workbench.objectives.spans import (
    SpanMasking,
    clipped_geometric_mean,
    clipped_geometric_pmf,
    sample_span_lengths,
    span_mask,
)

__all__ = [
    "IGNORE_INDEX",
    "SpanMasking",
    "bart_noise",
    "bart_infilling_plan",
    "bart_sentence_permutation",
    "bart_text_infilling",
    "bilm_targets",
    "causal_lm_labels",
    "clipped_geometric_mean",
    "clipped_geometric_pmf",
    "default_candidate_ids",
    "mask_tokens",
    "nsp_pair",
    "random_spans_noise_mask",
    "replaced_token_detection",
    "sample_span_lengths",
    "shift_labels",
    "sop_pair",
    "span_mask",
    "t5_reconstruct",
    "t5_span_corruption",
    "truncate_pair",
]
