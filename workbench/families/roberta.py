"""RoBERTa: BERT's encoder trained with dynamic masking, no NSP and FULL-SENTENCES packing over
byte-level BPE (Liu et al. 2019).

- FULL-SENTENCES (`full_sentences`): each input is packed with whole sentences taken contiguously
  from one or more documents up to `max_len - 2` tokens; a block runs on across a document
  boundary, marked by the separator `</s>`. A sentence longer than a block on its own is cut into
  block-sized pieces (the paper does not say; fairseq's `complete` break mode does the same). The
  blocks are the same every epoch (as fairseq builds them once), in an order drawn per epoch.
- The collator wraps each block as `<s> block </s>` and masks 15% of it with 80/10/10, a new mask
  every time the block is seen (dynamic masking).
- The special tokens follow fairseq's dictionary order (`<s>`=0, `<pad>`=1, `</s>`=2,
  `<unk>`=3), so position ids start at 2 as in the released checkpoints and
  `max_position_embeddings` is `max_len + 2`.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from transformers import RobertaConfig, RobertaForMaskedLM

from workbench.families import flops
from workbench.families.base import (BERT_ADAPTER_SITES, BERT_ADAPTER_SITES_BEFORE_DROPOUT, FamilySpec,
                                     PretrainingOutput, PretrainingWrapper, add_special_tokens, EncoderMeanHead,
                                     pad_sequences, truncate_block)
from workbench.families.bert import BERT_SHAPES, apply_mlm, masked_lm_loss, mlm_options, objective_options
from workbench.running.model_loading import load_weights

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

# BERT's shapes; two extra positions because RoBERTa counts positions from pad_token_id + 1.
PRESETS = {name: {**shape, "max_position_embeddings": shape["max_position_embeddings"] + 2} for name, shape in BERT_SHAPES.items()}

OBJECTIVE = {"objective": "mlm", "mlm_rate": 0.15, "mask_prob": 0.8, "random_prob": 0.1, "whole_word": False,
             "masking": "dynamic", "dupe_factor": 1}


def full_sentence_blocks(corpus, budget: int) -> list[tuple[int, int]]:
    """(start, end) ranges of the FULL-SENTENCES blocks in `corpus.stream_with_separators()`."""
    if budget < 1:
        raise ValueError(f"blocks of {budget} tokens leave no room for text")
    sent_off = np.asarray(corpus.sentence_offsets, dtype=np.int64)
    doc_off = np.asarray(corpus.document_offsets, dtype=np.int64)
    has_sep = corpus.separator_id >= 0
    blocks: list[tuple[int, int]] = []
    start, size = 0, 0
    for d in range(corpus.num_documents):
        shift = d if has_sep else 0  # separators before document d in the stream
        for s in range(int(doc_off[d]), int(doc_off[d + 1])):
            p, n = int(sent_off[s]) + shift, int(sent_off[s + 1] - sent_off[s])
            if n == 0:
                continue
            if size and size + n > budget:
                blocks.append((start, start + size))
                size = 0
            while n > budget:  # an overlong sentence: block-sized pieces (size is 0 here)
                blocks.append((p, p + budget))
                p, n = p + budget, n - budget
            if size == 0:
                start = p
            size += n
        if has_sep and size:
            if size + 1 <= budget:
                size += 1  # the document separator
            else:
                blocks.append((start, start + size))
                size = 0
    if size:
        blocks.append((start, start + size))
    return blocks


def full_sentences(corpus, max_len: int, rng: np.random.Generator) -> Iterator[list[int]]:
    """FULL-SENTENCES examples (see module docstring), in an order drawn from `rng`."""
    stream = corpus.stream_with_separators()
    blocks = full_sentence_blocks(corpus, max_len - corpus.num_special)
    for j in rng.permutation(len(blocks)):
        a, b = blocks[int(j)]
        yield stream[a:b].tolist()


def make_collator(objective: dict, tokenizer):
    opts = mlm_options(objective_options("roberta", OBJECTIVE, objective))

    def collate(examples: list[list[int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        ids, mask = pad_sequences([add_special_tokens(tokenizer, ex) for ex in examples], tokenizer.pad_token_id)
        masked, labels = apply_mlm(ids, mask, tokenizer, opts, generator)
        return {"input_ids": masked, "attention_mask": mask, "labels": labels}

    return collate


class RobertaPretrainer(PretrainingWrapper):
    """`RobertaForMaskedLM`, loss computed at the masked positions only (term: mlm)."""

    def forward(self, input_ids, attention_mask, labels, **_):
        hidden = self.model.roberta(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mlm = masked_lm_loss(self.model.lm_head, hidden, labels)
        return PretrainingOutput(loss=mlm, loss_terms={"mlm": mlm.detach()})


def build_model(model_config: dict, tokenizer) -> RobertaPretrainer:
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        type_vocab_size=1,
        **model_config,
    )
    return RobertaPretrainer(RobertaForMaskedLM(config), term="mlm")


def load_pretrainer(path) -> RobertaPretrainer:
    """The training module back from a checkpoint folder (to evaluate it or train on)."""
    return RobertaPretrainer(load_weights(RobertaForMaskedLM, path), term="mlm")

FAMILY = FamilySpec(
    name="roberta",
    tokenizer_kind="bytelevel_bpe",
    special_tokens=SPECIAL_TOKENS,
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    truncate_example=truncate_block,
    make_examples=full_sentences,
    packing="sentences",
    objective=OBJECTIVE,
    auto_class="AutoModelForMaskedLM",
    hf_model_types=("roberta",),
    padding_offset_positions=True,  # positions from pad_token_id + 1 (create_position_ids)
    classifier_heads={"encoder_mean": EncoderMeanHead("RobertaEncoderMeanForSequenceClassification",
                                                        "transformers.models.roberta.modeling_roberta",
                                                        "RobertaPreTrainedModel", "RobertaModel", "roberta")},
    adapter_sites=BERT_ADAPTER_SITES,
    adapter_sites_before_dropout=BERT_ADAPTER_SITES_BEFORE_DROPOUT,
    flops=flops.mlm_family_flops,
    description="RoBERTa: dynamic masked LM, no NSP, FULL-SENTENCES packing, byte-level BPE (Liu et al. 2019)",
)
