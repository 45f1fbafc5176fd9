"""DeBERTa-style encoder: BERT's masked LM with relative-position attention (He et al. 2021).

Why it is here: on a CPU budget a BERT with learned absolute position embeddings stays on the
masked LM's plateau. A [MASK] carries no information, so the loss only falls once attention looks
at the neighbours of a masked token, and with absolute positions every (position, position) pair
has to learn that separately; after 10M tokens the reference BERT still had no head attending to
its neighbours (docs/evidence/training-plateau.md). DeBERTa's disentangled attention scores content against
*relative* positions (content-to-position and position-to-content terms, one embedding per
offset bucket shared by every position), so "look one to the left" is one thing to learn: the
same recipe leaves the plateau within a few hundred updates and has previous/next-token heads by
update 1,000.

What is trained is a controlled swap: the BERT recipe unchanged (WordPiece, `[CLS] a [SEP] b
[SEP]` sentence-pair examples, 80/10/10 masking with every `objective` setting of BERT's masked
LM, no NSP) with `DebertaV2ForMaskedLM` as the network: no absolute position embeddings
(`position_biased_input` False; `model: {position_biased_input: true}` adds them at the input, as in
DeBERTa v1, for the fake-language position ablation), relative offsets up to +-`position_buckets`/2 exactly and
log-bucketed beyond. Not implemented: DeBERTa's enhanced mask decoder (absolute positions added
before the MLM head; transformers has no class for it) and DeBERTa-v3's ELECTRA-style objective.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from transformers import DebertaV2Config, DebertaV2ForMaskedLM

from workbench.families import flops
from workbench.data.fake_language import separate_position_ids, shifted_vocabulary_mask
from workbench.errors import ConfigError
from workbench.families.base import (BERT_ADAPTER_SITES, BERT_ADAPTER_SITES_BEFORE_DROPOUT, FamilySpec,
                                     PretrainingOutput, PretrainingWrapper, EncoderMeanHead)
from workbench.families.bert import (
    BERT_SHAPES,
    MLM_DEFAULTS,
    SPECIAL_TOKENS,
    apply_mlm,
    collate_pairs,
    masked_lm_logits,
    mlm_options,
    nsp_examples,
    objective_options,
    truncate_pair_example,
)
from workbench.running.lm_scores import deberta_mlm_logits
from workbench.objectives.mlm import IGNORE_INDEX
from workbench.running.model_loading import load_weights

# Relative attention as in DeBERTa-v3 (shared key projections, log buckets, layer-normed
# relative embeddings), no absolute positions. 64 buckets: exact offsets within +-32 tokens,
# which covers most EWT sentences (DeBERTa-v3 uses 256 buckets for 512-token inputs).
RELATIVE = dict(relative_attention=True, position_biased_input=False, pos_att_type=["p2c", "c2p"],
                max_relative_positions=-1, position_buckets=64, norm_rel_ebd="layer_norm", share_att_key=True,
                type_vocab_size=2)
PRESETS = {name: {**shape, **RELATIVE} for name, shape in BERT_SHAPES.items()}
PRESETS["base"]["position_buckets"] = 256

# `shifted_position_offset` > 0: the fake-language ablation "separate position embeddings" (K et al.
# 2020): segments spelled in the shifted alphabet read absolute positions offset by this much
# (`workbench.data.fake_language.separate_position_ids`); needs `model: {position_biased_input: true}`.
# `random_next`: the probability that an example's second segment comes from another document. 0.5
# is BERT's pipeline kept as is (the controlled swap; no objective uses the pair label); 0 gives
# contiguous text only, which a multilingual or fake-language corpus needs: with 0.5 a quarter of the
# fake-English model's sequences pair an English segment with a fake one (code-switching).
OBJECTIVE = {"objective": "mlm", **MLM_DEFAULTS, "shifted_position_offset": 0, "random_next": 0.5}


def make_examples(corpus, max_len: int, rng, objective: dict | None = None):
    """BERT's sentence-pair examples, the second segment random with probability `random_next`."""
    p = float((objective or {}).get("random_next", 0.5))
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"objective.random_next must be a probability in [0, 1], got {p}")
    return nsp_examples(corpus, max_len, rng, random_prob=p)


def make_collator(objective: dict, tokenizer):
    opts = mlm_options(objective_options("deberta", OBJECTIVE, objective))
    offset = int(opts["shifted_position_offset"])
    shifted = shifted_vocabulary_mask(tokenizer) if offset > 0 else None

    def collate(examples: list[dict], generator: torch.Generator) -> dict[str, torch.Tensor]:
        batch = collate_pairs(examples, tokenizer)
        batch.pop("pair_label")  # pairs as BERT builds them, no next-sentence objective
        if shifted is not None:  # before masking: a [MASK] hides a piece's alphabet
            batch["position_ids"] = separate_position_ids(batch["input_ids"], batch["attention_mask"],
                                                          batch["token_type_ids"], shifted, offset)
        batch["input_ids"], batch["labels"] = apply_mlm(batch["input_ids"], batch["attention_mask"], tokenizer, opts, generator)
        return batch

    return collate


class DebertaPretrainer(PretrainingWrapper):
    """`DebertaV2ForMaskedLM`, loss computed at the masked positions only (term: mlm), through either
    of its MLM heads (`deberta_mlm_logits`: the legacy BERT-style one by default, or `legacy: false`)."""

    def forward(self, input_ids, attention_mask, token_type_ids, labels, position_ids=None, **_):
        if position_ids is not None:
            check_position_ids(self.model.config, position_ids)
        hidden = self.model.deberta(input_ids=input_ids, attention_mask=attention_mask,
                                    token_type_ids=token_type_ids, position_ids=position_ids).last_hidden_state
        head = lambda h: deberta_mlm_logits(self.model, h)  # noqa: E731
        logits = masked_lm_logits(head, hidden, labels)
        mlm = F.cross_entropy(logits.float(), labels[labels != IGNORE_INDEX])
        # the logits at the masked positions, the last hidden states and the MLM head ride along for
        # a distillation loss (workbench.drivers.distill_pretraining)
        return PretrainingOutput(loss=mlm, loss_terms={"mlm": mlm.detach()},
                                 extra={"logits": logits, "hidden": hidden, "mlm_head": head})


def check_position_ids(config, position_ids: torch.Tensor) -> None:
    """Separate position embeddings need absolute positions that exist: else they would be ignored
    (relative-only model) or index past the table."""
    if not getattr(config, "position_biased_input", False):
        raise ConfigError("objective.shifted_position_offset needs absolute positions: set "
                          "model: {position_biased_input: true}")
    if int(position_ids.max()) >= config.max_position_embeddings:
        raise ConfigError(f"objective.shifted_position_offset: position {int(position_ids.max())} is past the "
                          f"model's max_position_embeddings {config.max_position_embeddings}")


def build_model(model_config: dict, tokenizer) -> DebertaPretrainer:
    config = DebertaV2Config(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **model_config)
    return DebertaPretrainer(DebertaV2ForMaskedLM(config), term="mlm")


def load_pretrainer(path) -> DebertaPretrainer:
    """The training module back from a checkpoint folder (to evaluate it or train on)."""
    return DebertaPretrainer(load_weights(DebertaV2ForMaskedLM, path), term="mlm")


FAMILY = FamilySpec(
    name="deberta",
    tokenizer_kind="wordpiece",
    special_tokens=SPECIAL_TOKENS,
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    make_examples=make_examples,
    examples_take_objective=True,
    truncate_example=truncate_pair_example,
    packing="sentences",
    objective=OBJECTIVE,
    auto_class="AutoModelForMaskedLM",
    hf_model_types=("deberta-v2",),
    classifier_heads={"encoder_mean": EncoderMeanHead("DebertaV2EncoderMeanForSequenceClassification",
                                                        "transformers.models.deberta_v2.modeling_deberta_v2",
                                                        "DebertaV2PreTrainedModel", "DebertaV2Model", "deberta")},
    adapter_sites=BERT_ADAPTER_SITES,
    adapter_sites_before_dropout=BERT_ADAPTER_SITES_BEFORE_DROPOUT,
    attention_dropout="module",  # an nn.Dropout module on the attention probabilities
    flops=functools.partial(flops.mlm_family_flops, deberta=True),
    distill_student="deberta",
    description="DeBERTa-style: BERT's masked LM with relative-position (disentangled) attention (He et al. 2021)",
)
