"""BART: a denoising encoder-decoder trained with text infilling + sentence permutation over
byte-level BPE (Lewis et al. 2020).

- Examples (`make_examples`) keep sentence boundaries: each document is cut into chunks of whole
  consecutive sentences of at most `max_len - 2` tokens (a longer sentence is cut into pieces of
  that size, each treated as a sentence); chunks come in an order drawn by the epoch's generator.
- Noise (`workbench.objectives.bart_noise`): the chunk's sentences are shuffled, then spans with
  Poisson(3) lengths covering 30% of the tokens are each replaced by ONE `<mask>` (a zero-length
  span inserts a `<mask>`).
- The encoder reads `<s> noised </s>`, the decoder reconstructs `<s> original </s>` (teacher
  forcing from `</s>`, BART's decoder start token); loss = token cross-entropy of the
  reconstruction.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from transformers import BartConfig, BartForConditionalGeneration

from workbench.families import flops
from workbench.families.base import (FamilySpec, PretrainingWrapper, add_special_tokens, HeadClass, pad_sequences)
from workbench.families.bert import objective_options
from workbench.objectives.mlm import IGNORE_INDEX
from workbench.objectives.seq2seq import bart_noise
from workbench.running.model_loading import load_weights

SPECIAL_TOKENS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

PRESETS = {
    # 2 + 2 layers, d_model 64: for tests.
    "tiny": dict(encoder_layers=2, decoder_layers=2, d_model=64, encoder_attention_heads=2, decoder_attention_heads=2,
                 encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=256),
    # 4 + 4 layers, d_model 256: the CPU demo size.
    "small": dict(encoder_layers=4, decoder_layers=4, d_model=256, encoder_attention_heads=4, decoder_attention_heads=4,
                  encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_position_embeddings=512),
    # BART-base (Lewis et al. 2020): 6 + 6 layers, d_model 768.
    "base": dict(encoder_layers=6, decoder_layers=6, d_model=768, encoder_attention_heads=12, decoder_attention_heads=12,
                 encoder_ffn_dim=3072, decoder_ffn_dim=3072, max_position_embeddings=1024),
}

OBJECTIVE = {"objective": "text_infilling+sentence_permutation", "mask_ratio": 0.3, "poisson_lambda": 3.0,
             "permute_sentences": True}


def sentence_chunks(corpus, budget: int) -> list[tuple[int, int, int]]:
    """(document, first sentence, end sentence) of every chunk of whole sentences of <= `budget`
    tokens; a sentence longer than `budget` is a chunk of its own (cut into pieces later)."""
    sent_off = np.asarray(corpus.sentence_offsets)
    doc_off = np.asarray(corpus.document_offsets)
    lengths = np.diff(sent_off)
    chunks = []
    for d in range(corpus.num_documents):
        start, size = int(doc_off[d]), 0
        for s in range(int(doc_off[d]), int(doc_off[d + 1])):
            n = int(lengths[s])
            if size and size + n > budget:
                chunks.append((d, start, s))
                start, size = s, 0
            size += n
        if size:
            chunks.append((d, start, int(doc_off[d + 1])))
    return chunks


def make_examples(corpus, max_len: int, rng: np.random.Generator) -> Iterator[list[list[int]]]:
    """Chunks of whole sentences (each example: a list of sentences' ids), shuffled by `rng`."""
    budget = max_len - 2  # <s> ... </s>
    if budget < 1:
        raise ValueError(f"max_len={max_len} leaves no room for tokens")
    chunks = sentence_chunks(corpus, budget)
    for j in rng.permutation(len(chunks)):
        _, first, end = chunks[int(j)]
        sentences: list[list[int]] = []
        for s in range(first, end):
            ids = corpus.sentence(s).tolist()
            sentences.extend(ids[i : i + budget] for i in range(0, len(ids), budget) if ids[i : i + budget])
        if len(sentences) > 1 and sum(map(len, sentences)) > budget:  # an overlong sentence: one piece per example
            for piece in sentences:
                yield [piece]
        elif sentences:
            yield sentences


def make_collator(objective: dict, tokenizer):
    opts = objective_options("bart", OBJECTIVE, objective)

    def collate(examples: list[list[list[int]]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        inputs, targets = [], []
        for sentences in examples:
            noised, target = bart_noise(
                sentences, mask_token_id=tokenizer.mask_token_id, generator=generator,
                mask_ratio=float(opts["mask_ratio"]), poisson_lambda=float(opts["poisson_lambda"]),
                permute_sentences=bool(opts["permute_sentences"]),
            )
            inputs.append(add_special_tokens(tokenizer, noised.tolist()))
            targets.append(add_special_tokens(tokenizer, target.tolist()))
        ids, mask = pad_sequences(inputs, tokenizer.pad_token_id)
        labels, _ = pad_sequences(targets, IGNORE_INDEX)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return collate


def build_model(model_config: dict, tokenizer) -> PretrainingWrapper:
    config = BartConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.eos_token_id,
        forced_eos_token_id=tokenizer.eos_token_id,
        **model_config,
    )
    return PretrainingWrapper(BartForConditionalGeneration(config), term="denoise")


def load_pretrainer(path) -> PretrainingWrapper:
    """The training module back from a checkpoint folder (to evaluate it or train on)."""
    return PretrainingWrapper(load_weights(BartForConditionalGeneration, path), term="denoise")

FAMILY = FamilySpec(
    name="bart",
    tokenizer_kind="bytelevel_bpe",
    special_tokens=SPECIAL_TOKENS,
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    make_examples=make_examples,
    packing="sentences",
    objective=OBJECTIVE,
    auto_class="AutoModelForSeq2SeqLM",
    hf_model_types=("bart", "mbart"),
    poolings=("decoder_last", "encoder_mean"),
    classifier_heads={"encoder_mean": HeadClass("workbench.running.classifier_heads",
                                                 "BartEncoderMeanForSequenceClassification"),
                      "token": HeadClass("workbench.running.classifier_heads", "BartEncoderForTokenClassification")},
    # BART applies its dropout as a function: the adapter follows the projection
    adapter_sites=(r"self_attn\.out_proj$", r"fc2$"),
    adapter_sites_before_dropout=(r"self_attn\.out_proj$", r"fc2$"),
    flops=flops.bart_flops,
    classifier_flops=flops.seq2seq_classifier_flops(flops.bart_shape),
    non_embedding_params=flops.seq2seq_params(flops.bart_shape),
    distill_unsupported="an encoder-decoder (two stacks)",
    description="BART: text infilling (Poisson 3, 30%) + sentence permutation, denoising seq2seq (Lewis et al. 2020)",
)
