"""The ELMo family (Peters et al., 2018): a character-CNN biLSTM language model, pretrained as a biLM.

The nn.Modules and transformers classes live in `elmo_modules.py`; this module registers them with
the Auto classes on import (so `AutoModel.from_pretrained(path)` opens an ELMo checkpoint once
`workbench.families` is imported) and defines `FAMILY` for the training loop.

Training examples are sentences, as in the paper (the 1B Word Benchmark is shuffled sentences):
each epoch visits the corpus' sentences in a shuffled order, the collator wraps each in <S> ... </S>
and pads the batch. A sentence longer than max_len - 2 words is cut into consecutive pieces (every
word is trained on; none is dropped). Empty sentences carry no LM target and are skipped.
Open-vocabulary input as in the paper: the tokenised corpus keeps the spelling of every word the
closed softmax vocabulary maps to [UNK] (`TokenizedCorpus.unknown_words`), each example carries
them, and the collator passes their characters (`char_ids`), so the character CNN reads every
word's own spelling while the LM targets stay over the closed vocabulary ([UNK] for those words).
Differences from the paper (no clipping, full softmax, no state carried across batches) are
listed in `elmo_modules.py`.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining, PreTrainedTokenizerFast

from workbench.families import flops
from workbench.errors import ConfigError
from workbench.families.base import (FamilySpec, HeadClass, pad_sequences)
from workbench.families.elmo_modules import (
    CharCNNEncoder,
    ElmoBiLMOutput,
    ElmoConfig,
    ElmoForBiLM,
    ElmoModel,
    ScalarMix,
    batch_characters,
    char_table,
    word_characters,
)
from workbench.objectives.causal import bilm_targets

__all__ = [
    "FAMILY", "PRESETS", "SPECIAL_TOKENS", "CharCNNEncoder", "ElmoBiLMOutput", "ElmoConfig", "ElmoForBiLM",
    "ElmoModel", "ScalarMix", "batch_characters", "build_model", "char_table", "make_collator", "sentence_examples", "word_characters",
]

AutoConfig.register("elmo", ElmoConfig, exist_ok=True)
AutoModel.register(ElmoConfig, ElmoModel, exist_ok=True)
AutoModelForPreTraining.register(ElmoConfig, ElmoForBiLM, exist_ok=True)

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "<S>", "</S>"]
SPECIAL_ROLES = {"pad": "[PAD]", "unk": "[UNK]", "bos": "<S>", "eos": "</S>"}

PRESETS: dict[str, dict] = {
    # Unit tests and CI: a few thousand parameters outside the softmax.
    "tiny": dict(
        char_embed_dim=16, char_filters=[[1, 16], [2, 16], [3, 32]], num_highway=1, max_chars=20,
        projection_dim=32, lstm_dim=64, num_hidden_layers=2, dropout=0.1,
    ),
    # CPU demo: trains at a useful speed on 2 cores.
    "small": dict(
        char_embed_dim=16, char_filters=[[1, 32], [2, 32], [3, 64], [4, 64], [5, 64]], num_highway=1, max_chars=30,
        projection_dim=128, lstm_dim=512, num_hidden_layers=2, dropout=0.1,
    ),
    # The paper's model (Peters et al., 2018, Sec. 3.4 / the released "original" options): 2048 char
    # filters, 2 highway layers, 2 biLSTM layers of 4096 cells with 512-d projections.
    "base": dict(
        char_embed_dim=16,
        char_filters=[[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        num_highway=2, max_chars=50, projection_dim=512, lstm_dim=4096, num_hidden_layers=2, dropout=0.1,
    ),
}


def _special_id(tokenizer: PreTrainedTokenizerFast, role: str) -> int:
    tok_id = getattr(tokenizer, f"{role}_token_id")
    if tok_id is None:
        raise ConfigError(f"ELMo needs a {role} token in the tokenizer (special tokens {SPECIAL_TOKENS})")
    return int(tok_id)


def build_model(model_config: dict, tokenizer: PreTrainedTokenizerFast) -> ElmoForBiLM:
    """A fresh ElmoForBiLM sized for `tokenizer`, its character table filled from the vocabulary."""
    config = ElmoConfig(
        **model_config,
        vocab_size=len(tokenizer),
        pad_token_id=_special_id(tokenizer, "pad"),
        bos_token_id=_special_id(tokenizer, "bos"),
        eos_token_id=_special_id(tokenizer, "eos"),
    )
    model = ElmoForBiLM(config)
    model.elmo.set_vocabulary(tokenizer)
    return model


def make_collator(objective: dict, tokenizer: PreTrainedTokenizerFast):
    """Collator for sentence examples: <S> ids </S>, right-padded, with both LM targets.

    An example is a list of ids or {"input_ids": ids, "unknown": spellings} where spellings[i] is
    the word behind an [UNK] id (None for vocabulary words); their characters go into `char_ids`
    (all zero elsewhere: the encoder spells those positions from its vocabulary table).
    Deterministic (the biLM has no masking), so the generator is accepted and unused.
    """
    pad, bos, eos = (_special_id(tokenizer, r) for r in ("pad", "bos", "eos"))

    def collate(examples: list, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        seqs, spellings = [], []
        for ex in examples:
            ids = ex["input_ids"] if isinstance(ex, dict) else ex
            unknown = ex.get("unknown") if isinstance(ex, dict) else None
            seqs.append([bos, *(int(i) for i in ids), eos])
            spellings.append([None, *(unknown if unknown is not None else [None] * len(ids))])
        input_ids, attention_mask = pad_sequences(seqs, pad)
        forward_labels, backward_labels = bilm_targets(input_ids, pad)
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "char_ids": batch_characters(spellings, input_ids.shape[1]),
            "forward_labels": forward_labels,
            "backward_labels": backward_labels,
        }

    return collate


def sentence_examples(corpus, max_len: int, rng: np.random.Generator) -> Iterator[list[int] | dict]:
    """One epoch of sentences in a shuffled order, each at most max_len - 2 ids (room for <S>, </S>).

    Longer sentences are cut into consecutive pieces; empty sentences are skipped (no target).
    When the corpus keeps the spellings of its unknown words (`unknown_words(i)`), an example is
    {"input_ids": ids, "unknown": spellings} (see `make_collator`), else the id list.
    """
    piece = max_len - 2
    if piece < 1:
        raise ValueError(f"max_len={max_len} leaves no room for words between <S> and </S>")
    n = len(corpus.sentence_offsets) - 1
    spelled = getattr(corpus, "has_unknown_words", False)
    for i in rng.permutation(n):
        ids = np.asarray(corpus.sentence(int(i)))
        unknown = corpus.unknown_words(int(i)) if spelled else None
        for start in range(0, len(ids), piece):
            chunk = ids[start : start + piece].tolist()
            yield chunk if unknown is None else {"input_ids": chunk, "unknown": unknown[start : start + piece]}


FAMILY = FamilySpec(
    name="elmo",
    tokenizer_kind="word",
    special_tokens=SPECIAL_TOKENS,
    special_roles=SPECIAL_ROLES,
    template=("<S> $A </S>", None),
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    packing="sentences",
    make_examples=sentence_examples,
    objective={"name": "bilm"},
    auto_class="AutoModelForPreTraining",
    hf_model_types=("elmo",),
    poolings=("scalar_mix",),  # Peters et al. 2018: a task-specific scalar mix, mean over tokens
    classifier_heads={"scalar_mix": HeadClass("workbench.running.classifier_heads", "ElmoForSequenceClassification"),
                      "token": HeadClass("workbench.running.classifier_heads", "ElmoForTokenClassification")},
    peft_methods=("full", "head"),  # an LSTM: no attention or adapter sites
    attention_dropout=None,
    attention_patterns=False,
    lm_head="bilm",
    flops=flops.elmo_flops,
    classifier_flops=flops.elmo_classifier_flops,
    non_embedding_params=flops.elmo_params,
    distill_unsupported="ELMo's LSTMs are not transformer blocks",
    description="ELMo (Peters et al. 2018): char-CNN token encoder + forward/backward LSTM LMs, shared softmax",
)
