"""RoBERTa: BERT's encoder trained with dynamic masking, no NSP and FULL-SENTENCES packing over
byte-level BPE (Liu et al. 2019).

Examples are the base `contiguous_blocks`: the token stream cut into blocks of `max_len - 2`
ids that run across sentence and document boundaries, documents separated by `</s>` (the paper's
FULL-SENTENCES input format); the collator wraps each block as `<s> block </s>` and masks 15% of
it with 80/10/10, a new mask every time the block is seen. The special tokens follow fairseq's
dictionary order (`<s>`=0, `<pad>`=1, `</s>`=2, `<unk>`=3), so position ids start at 2 as in the
released checkpoints and `max_position_embeddings` is `max_len + 2`.
"""

from __future__ import annotations

import torch
from transformers import RobertaConfig, RobertaForMaskedLM

from workbench.families.base import FamilySpec, PretrainingOutput, PretrainingWrapper, add_special_tokens, pad_sequences
from workbench.families.bert import BERT_SHAPES, apply_mlm, masked_lm_loss, mlm_options

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

# BERT's shapes; two extra positions because RoBERTa counts positions from pad_token_id + 1.
PRESETS = {name: {**shape, "max_position_embeddings": shape["max_position_embeddings"] + 2} for name, shape in BERT_SHAPES.items()}

OBJECTIVE = {"objective": "mlm", "mlm_rate": 0.15, "mask_prob": 0.8, "random_prob": 0.1, "whole_word": False,
             "masking": "dynamic", "dupe_factor": 1}


def make_collator(objective: dict, tokenizer):
    opts = mlm_options({**OBJECTIVE, **objective})

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
    return RobertaPretrainer(RobertaForMaskedLM.from_pretrained(str(path)), term="mlm")

FAMILY = FamilySpec(
    name="roberta",
    tokenizer_kind="bytelevel_bpe",
    special_tokens=SPECIAL_TOKENS,
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    packing="contiguous",
    objective=OBJECTIVE,
    auto_class="AutoModelForMaskedLM",
    description="RoBERTa: dynamic masked LM, no NSP, FULL-SENTENCES packing, byte-level BPE (Liu et al. 2019)",
)
