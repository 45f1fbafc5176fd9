"""GPT-2: a decoder-only causal language model over byte-level BPE (Radford et al. 2019).

The reference family of the training loop: contiguous packed blocks, no special tokens inside a
block except `<|endoftext|>` between documents, loss = next-token cross-entropy (HF
`GPT2LMHeadModel` shifts the labels itself).
"""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from workbench.families import flops
from workbench.families.base import FamilySpec, PretrainingWrapper, add_special_tokens, pad_sequences, truncate_block
from workbench.objectives.causal import causal_lm_labels
from workbench.running.model_loading import load_weights

EOT = "<|endoftext|>"

PRESETS = {
    # 2 layers, hidden 64: for tests (seconds on a CPU).
    "tiny": dict(n_layer=2, n_embd=64, n_head=2, n_positions=256),
    # 4 layers, hidden 256: the README's ten-minute CPU model.
    "small": dict(n_layer=4, n_embd=256, n_head=4, n_positions=512),
    # GPT-2 small's shape.
    "base": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),
}


def build_model(model_config: dict, tokenizer) -> PretrainingWrapper:
    eot = tokenizer.convert_tokens_to_ids(EOT)
    config = GPT2Config(vocab_size=len(tokenizer), bos_token_id=eot, eos_token_id=eot, pad_token_id=eot, **model_config)
    return PretrainingWrapper(GPT2LMHeadModel(config), term="lm")


def load_pretrainer(path) -> PretrainingWrapper:
    """The training module back from a checkpoint folder (to evaluate it or train on)."""
    return PretrainingWrapper(load_weights(GPT2LMHeadModel, path), term="lm")


def make_collator(objective: dict, tokenizer):
    pad_id = tokenizer.pad_token_id

    def collate(examples: list[list[int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        # Causal LM draws no random numbers; `generator` is part of the collator contract.
        ids, mask = pad_sequences([add_special_tokens(tokenizer, ex) for ex in examples], pad_id)
        # Padding is found from the mask, not the pad id: <|endoftext|> doubles as pad and as the
        # document separator, which must stay a target.
        labels = causal_lm_labels(ids, attention_mask=mask)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return collate


FAMILY = FamilySpec(
    name="gpt",
    tokenizer_kind="bytelevel_bpe",
    special_tokens=[EOT],
    special_roles={"bos": EOT, "eos": EOT, "unk": EOT, "pad": EOT},
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    truncate_example=truncate_block,
    packing="contiguous",
    objective={"objective": "causal_lm"},
    auto_class="AutoModelForCausalLM",
    hf_model_types=("gpt2", "openai-gpt"),
    causal=True,
    poolings=("last",),  # the last non-pad token (GPT2ForSequenceClassification)
    adapter_sites=(r"attn\.resid_dropout$", r"mlp\.dropout$"),
    adapter_sites_before_dropout=(r"attn\.c_proj$", r"mlp\.c_proj$"),
    fused_qkv=("c_attn", "blocks"),  # Q, K, V from one Conv1D, [Q | K | V]
    lora_fan_in_fan_out=True,
    flops=flops.gpt_flops,
    classifier_flops=flops.gpt_classifier_flops,
    non_embedding_params=flops.gpt_params,
    description="GPT-2 causal LM (Radford et al. 2019)",
)
