"""ALBERT: factorised embeddings, cross-layer parameter sharing, sentence-order prediction over a
SentencePiece-style Unigram vocabulary (Lan et al. 2020).

- Factorised embedding parametrisation: tokens are embedded in `embedding_size` E (< hidden H)
  and projected to H (`AlbertTransformer.embedding_hidden_mapping_in`).
- Cross-layer sharing: transformers' `AlbertTransformer` holds `num_hidden_groups` layer groups
  and runs layer i with group `i // (L / num_hidden_groups)`; with `num_hidden_groups=1` and
  `inner_group_num=1` every one of the L layers is the same `AlbertLayer`, so the parameter
  count does not depend on `num_hidden_layers` (tests check this).
- Sentence-order prediction: two consecutive segments of one document, swapped with probability
  0.5 (`workbench.objectives.sop_pair`; label 1 = swapped). Pairs are fixed across epochs like
  BERT's NSP pairs (see `workbench.families.bert`).
- Masking: ALBERT's n-gram masking picks n-grams of n <= 3 words with p(n) proportional to 1/n
  (6/11, 3/11, 2/11). Here it is `workbench.objectives.span_mask` with span lengths in words from
  a geometric(0.5) renormalised on 1..3 (4/7, 2/7, 1/7): the same shape with a little less mass
  on trigrams, 80/10/10 decided per n-gram. `objective.ngram: false` gives BERT's token-level
  80/10/10 MLM instead (with BERT's `whole_word` / `masking` options).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AlbertConfig, AlbertForPreTraining

from workbench.families import flops
from workbench.families.base import (FamilySpec, PretrainingOutput, PretrainingWrapper, EncoderMeanHead,
                                     special_tokens_mask)
from workbench.families.bert import (
    objective_options,
    MLM_DEFAULTS,
    apply_mlm,
    candidate_ids,
    collate_pairs,
    masked_lm_loss,
    mlm_options,
    sentence_pair_examples,
    truncate_pair_example,
    word_ids,
)
from workbench.objectives.sentence_pairs import sop_pair
from workbench.objectives.spans import span_mask
from workbench.running.model_loading import load_weights

SPECIAL_TOKENS = ["<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]"]

PRESETS = {
    # hidden 64 with E = 32: for tests.
    "tiny": dict(num_hidden_layers=2, embedding_size=32, hidden_size=64, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=256),
    # hidden 256 with E = 128: the CPU demo size.
    "small": dict(num_hidden_layers=4, embedding_size=128, hidden_size=256, num_attention_heads=4,
                  intermediate_size=1024, max_position_embeddings=512),
    # ALBERT-base (Lan et al. 2020, Table 1): 12 shared layers, H 768, E 128.
    "base": dict(num_hidden_layers=12, embedding_size=128, hidden_size=768, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512),
}

OBJECTIVE = {"objective": "ngram_mlm+sop", **MLM_DEFAULTS, "ngram": True, "ngram_max": 3, "ngram_p": 0.5}


def sop_examples(corpus, max_len: int, rng):
    """Sentence-order pairs (label 1 = swapped) from every document with >= 2 sentences."""

    def make_pair(d, sentences, g, max_tokens, document):
        return sop_pair(sentences, max_tokens=max_tokens, generator=g)

    return sentence_pair_examples(corpus, max_len, rng, make_pair)


def make_collator(objective: dict, tokenizer):
    opts = mlm_options(objective_options("albert", OBJECTIVE, objective))

    def collate(examples: list[dict], generator: torch.Generator) -> dict[str, torch.Tensor]:
        batch = collate_pairs(examples, tokenizer)
        ids, mask = batch["input_ids"], batch["attention_mask"]
        if opts["ngram"]:
            special = special_tokens_mask(ids, tokenizer) | (mask == 0)
            out = span_mask(
                ids, special, word_ids=word_ids(ids, special, tokenizer), mask_token_id=tokenizer.mask_token_id,
                vocab_size=len(tokenizer), generator=generator, rate=float(opts["mlm_rate"]),
                geometric_p=float(opts["ngram_p"]), max_span=int(opts["ngram_max"]),
                mask_prob=float(opts["mask_prob"]), random_prob=float(opts["random_prob"]),
                candidate_ids=candidate_ids(tokenizer),
            )
            batch["input_ids"], batch["labels"] = out.input_ids, out.labels
        else:
            batch["input_ids"], batch["labels"] = apply_mlm(ids, mask, tokenizer, opts, generator)
        batch["sentence_order_label"] = batch.pop("pair_label")
        return batch

    return collate


class AlbertPretrainer(PretrainingWrapper):
    """`AlbertForPreTraining` with loss terms mlm and sop (MLM logits at masked positions only)."""

    def forward(self, input_ids, attention_mask, token_type_ids, labels, sentence_order_label=None, **_):
        out = self.model.albert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        mlm = masked_lm_loss(self.model.predictions, out.last_hidden_state, labels)
        terms = {"mlm": mlm.detach()}
        loss = mlm
        if sentence_order_label is not None:
            logits = self.model.sop_classifier(out.pooler_output)
            sop = F.cross_entropy(logits.float(), sentence_order_label)
            terms["sop"] = sop.detach()
            terms["sop_acc"] = (logits.argmax(-1) == sentence_order_label).float().mean().detach()
            loss = loss + sop
        return PretrainingOutput(loss=loss, loss_terms=terms)


def build_model(model_config: dict, tokenizer) -> AlbertPretrainer:
    cfg = {"num_hidden_groups": 1, "inner_group_num": 1, **model_config}
    config = AlbertConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
        **cfg,
    )
    return AlbertPretrainer(AlbertForPreTraining(config), term="mlm")


def load_pretrainer(path) -> AlbertPretrainer:
    """The training module back from a checkpoint folder (to evaluate it or train on)."""
    return AlbertPretrainer(load_weights(AlbertForPreTraining, path), term="mlm")

FAMILY = FamilySpec(
    name="albert",
    tokenizer_kind="unigram",
    special_tokens=SPECIAL_TOKENS,
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    truncate_example=truncate_pair_example,
    make_examples=sop_examples,
    packing="sentences",
    objective=OBJECTIVE,
    auto_class="AutoModelForPreTraining",
    hf_model_types=("albert",),
    classifier_heads={"encoder_mean": EncoderMeanHead("AlbertEncoderMeanForSequenceClassification",
                                                        "transformers.models.albert.modeling_albert",
                                                        "AlbertPreTrainedModel", "AlbertModel", "albert")},
    # no dropout module after ALBERT's feed-forward block: the adapter follows its projection
    adapter_sites=(r"attention\.output_dropout$", r"ffn_output$"),
    adapter_sites_before_dropout=(r"attention\.dense$", r"ffn_output$"),
    lora_targets=("query", "value"),
    flops=flops.mlm_family_flops,
    distill_unsupported="ALBERT shares one layer across depth",
    description="ALBERT: factorised embeddings, shared layers, n-gram MLM + sentence-order prediction (Lan et al. 2020)",
)
