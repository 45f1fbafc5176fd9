"""T5: an encoder-decoder trained on span corruption over a Unigram vocabulary with sentinel tokens
(Raffel et al. 2020).

- Span corruption (`workbench.objectives.t5_span_corruption`): 15% of the tokens in spans of mean
  length 3; each dropped span is replaced by one sentinel `<extra_id_j>` in the input, and the
  target lists every sentinel followed by the tokens it replaced; `</s>` ends both.
- Examples are contiguous blocks (across documents, separated by `</s>`) whose length L is the
  largest for which the corrupted input, L - noise + spans + `</s>`, fits `max_len` (T5's
  `random_spans_helper` does the same sizing), computed from the run's own `noise_density` and
  `mean_span_length`, so no setting overflows `max_len` (the collator checks it too).
- Model: `T5ForConditionalGeneration` as in the original T5 (ReLU feed-forward, tied input and
  output embeddings, relative position buckets); decoding starts from `<pad>` as in T5.
"""

from __future__ import annotations

import torch
from transformers import T5Config, T5ForConditionalGeneration

from workbench.families import flops
from workbench.families.base import (FamilySpec, PretrainingWrapper, contiguous_blocks, HeadClass, pad_sequences,
                                     t5_sentinels)
from workbench.families.bert import objective_options
from workbench.objectives.mlm import IGNORE_INDEX
from workbench.objectives.seq2seq import random_spans_noise_mask, t5_span_corruption
from workbench.running.model_loading import load_weights

N_SENTINELS = 100
SPECIAL_TOKENS = ["<pad>", "</s>", "<unk>", *t5_sentinels(N_SENTINELS)]

PRESETS = {
    # 2 + 2 layers, d_model 64: for tests.
    "tiny": dict(num_layers=2, d_model=64, d_kv=32, d_ff=128, num_heads=2),
    # 4 + 4 layers, d_model 256: the CPU demo size.
    "small": dict(num_layers=4, d_model=256, d_kv=64, d_ff=1024, num_heads=4),
    # T5-base (Raffel et al. 2020): 12 + 12 layers, d_model 768.
    "base": dict(num_layers=12, d_model=768, d_kv=64, d_ff=3072, num_heads=12),
}

OBJECTIVE = {"objective": "span_corruption", "noise_density": 0.15, "mean_span_length": 3.0}


def corrupted_lengths(length: int, noise_density: float = 0.15, mean_span_length: float = 3.0) -> tuple[int, int]:
    """(input length, target length) after span corruption of `length` tokens, `</s>` included."""
    g = torch.Generator().manual_seed(0)  # the counts do not depend on the draw
    noise = random_spans_noise_mask(length, generator=g, noise_density=noise_density, mean_span_length=mean_span_length)
    n_noise = int(noise.sum())
    n_spans = int((noise[1:] & ~noise[:-1]).sum()) + int(noise[0])
    return length - n_noise + n_spans + 1, n_noise + n_spans + 1


def block_length(max_len: int, noise_density: float = 0.15, mean_span_length: float = 3.0) -> int:
    """The longest raw block whose corrupted input (with `</s>`) fits in `max_len` tokens."""
    length = max_len
    while length > 2 and corrupted_lengths(length + 1, noise_density, mean_span_length)[0] <= max_len:
        length += 1
    while length > 2 and corrupted_lengths(length, noise_density, mean_span_length)[0] > max_len:
        length -= 1
    return length


def make_examples(corpus, max_len: int, rng, objective: dict | None = None):
    """Contiguous blocks sized by `block_length` for the objective's settings (module docstring)."""
    opts = objective_options("t5", OBJECTIVE, objective or {})
    length = block_length(max_len, float(opts["noise_density"]), float(opts["mean_span_length"]))
    return contiguous_blocks(corpus, length + corpus.num_special, rng)


def sentinel_ids(tokenizer) -> list[int]:
    ids = tokenizer.convert_tokens_to_ids(t5_sentinels(N_SENTINELS))
    if tokenizer.unk_token_id in ids:
        raise ValueError("the tokenizer lacks T5's sentinel tokens <extra_id_0>..")
    return ids


def make_collator(objective: dict, tokenizer):
    opts = objective_options("t5", OBJECTIVE, objective)
    sentinels = sentinel_ids(tokenizer)
    eos = tokenizer.eos_token_id
    max_len = opts.get("max_len")

    def collate(examples: list[list[int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        inputs, targets = [], []
        for ex in examples:
            inp, tgt = t5_span_corruption(
                torch.as_tensor(ex, dtype=torch.long), sentinel_ids=sentinels, generator=generator,
                noise_density=float(opts["noise_density"]), mean_span_length=float(opts["mean_span_length"]), eos_id=eos,
            )
            if max_len is not None and len(inp) > int(max_len):
                raise ValueError(f"T5 example of {len(ex)} tokens corrupts to {len(inp)} > max_len={max_len} "
                                 f"tokens (make_examples sizes blocks with the same objective settings)")
            inputs.append(inp.tolist())
            targets.append(tgt.tolist())
        ids, mask = pad_sequences(inputs, tokenizer.pad_token_id)
        labels, label_mask = pad_sequences(targets, IGNORE_INDEX)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "decoder_attention_mask": label_mask}

    return collate


def build_model(model_config: dict, tokenizer) -> PretrainingWrapper:
    config = T5Config(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
        **model_config,
    )
    return PretrainingWrapper(T5ForConditionalGeneration(config), term="span_corruption")


def load_pretrainer(path) -> PretrainingWrapper:
    """The training module back from a checkpoint folder (to evaluate it or train on)."""
    return PretrainingWrapper(load_weights(T5ForConditionalGeneration, path), term="span_corruption")

FAMILY = FamilySpec(
    name="t5",
    tokenizer_kind="unigram",
    special_tokens=SPECIAL_TOKENS,
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    make_examples=make_examples,
    examples_take_objective=True,
    packing="contiguous",
    objective=OBJECTIVE,
    auto_class="AutoModelForSeq2SeqLM",
    hf_model_types=("t5", "mt5"),
    poolings=("decoder_last", "encoder_mean"),
    classifier_heads={"encoder_mean": HeadClass("workbench.running.classifier_heads",
                                                 "T5EncoderMeanForSequenceClassification")},
    adapter_sites=(r"block\.\d+\.layer\.0\.dropout$", r"(encoder\.block\.\d+\.layer\.1|decoder\.block\.\d+\.layer\.2)\.dropout$"),
    adapter_sites_before_dropout=(r"SelfAttention\.o$", r"DenseReluDense\.wo$"),
    flops=flops.t5_flops,
    classifier_flops=flops.seq2seq_classifier_flops(flops.t5_shape),
    non_embedding_params=flops.seq2seq_params(flops.t5_shape),
    distill_unsupported="an encoder-decoder (two stacks)",
    description="T5: encoder-decoder span corruption with sentinels (Raffel et al. 2020)",
)
