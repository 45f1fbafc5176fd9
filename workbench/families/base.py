"""What every model family tells the training loop: `FamilySpec`, plus small shared helpers.

A family module (`workbench/families/<name>.py`) defines `FAMILY = FamilySpec(...)`. The one
training loop (`workbench/drivers/train.py`) only ever talks to a family through this spec:

- `tokenizer_kind` + `special_tokens` (+ optional `special_roles`, `template`): how
  `workbench.tokenization` trains and wraps the tokenizer on the corpus' train split;
- `make_examples(corpus, max_len, rng)`: the stream of training examples of one epoch, cut from the
  pre-tokenised corpus (`workbench.data_cache.TokenizedCorpus`, ids WITHOUT special tokens);
- `make_collator(objective, tokenizer)`: turns a list of examples into a batch of tensors, drawing
  every random choice (masks, spans, noise) from the `torch.Generator` it is given;
- `build_model(model_config, tokenizer)`: a `PretrainingModel` whose `forward(**batch)` returns a
  `PretrainingOutput` and whose `save_pretrained(dir)` writes a plain transformers checkpoint;
- `truncate_example(example, length, tokenizer, generator)` (optional): the example cut so that the
  collator makes a sequence of at most `length` tokens, for the sequence-length warm-up
  (`seq_len_warmup` in `workbench.config`); None where truncation would change the objective.

Beside the spec, a family module's `load_pretrainer(path)` gives the training module back from a
saved folder, its weights read by the one loader (`workbench.running.model_loading.load_weights`);
`workbench.running.model_loading.load_pretrainer(path)` finds it from the folder's manifest (a
family whose training module is a plain transformers model, ELMo, needs none: `auto_class` opens it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

import numpy as np
import torch
from torch import nn

if TYPE_CHECKING:  # pragma: no cover - typing only
    from transformers import PreTrainedTokenizerFast

    from workbench.data_cache import TokenizedCorpus

TOKENIZER_KINDS = ("wordpiece", "bytelevel_bpe", "unigram", "word")
PRESET_NAMES = ("tiny", "small", "base")
ATTENTION_DROPOUT_KINDS = ("functional", "module", None)
LM_HEAD_KINDS = ("own", "bilm", "generator")


@dataclass
class PretrainingOutput:
    """What a pretraining model's forward returns: the loss to optimise and its named parts.

    `loss_terms` values are scalar tensors (detached or not); the loop logs each as a float.
    Families may put anything else (logits, hidden states) in `extra`.
    """

    loss: torch.Tensor
    loss_terms: dict[str, torch.Tensor] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class PretrainingModel(Protocol):
    """An `nn.Module` with `forward(**batch) -> PretrainingOutput` and `save_pretrained(dir)`."""

    def __call__(self, **batch: torch.Tensor) -> PretrainingOutput: ...

    def save_pretrained(self, save_directory, **kwargs) -> None: ...


Collator = Callable[[list, torch.Generator], dict]
Truncator = Callable[[Any, int, "PreTrainedTokenizerFast", torch.Generator], Any]


def truncate_block(example: list[int], length: int, tokenizer: "PreTrainedTokenizerFast",
                   generator: torch.Generator | None = None) -> list[int]:
    """The first `length` minus the family's special tokens (`[CLS] ... [SEP]`: 2) ids of a token
    block, so that the collated sequence, specials included, has at most `length` tokens."""
    keep = length - tokenizer.num_special_tokens_to_add(pair=False)
    if keep < 1:
        raise ValueError(f"length {length} leaves no room for tokens after the special tokens")
    return list(example[:keep])


def contiguous_blocks(corpus: "TokenizedCorpus", max_len: int, rng: np.random.Generator) -> Iterator[list[int]]:
    """Default `make_examples`: the flat token stream cut into blocks, in a shuffled order.

    Documents are joined with the tokenizer's separator id (`corpus.separator_id`: [SEP] for BERT,
    </s> or <|endoftext|> for BPE models) and the stream is cut into blocks of
    `max_len - corpus.num_special` ids, so that the collator can add the family's special tokens
    (e.g. [CLS] ... [SEP]) and still fit in `max_len`; nothing is padded (GPT-2's contiguous
    blocks, Radford et al. 2019). Blocks cut through sentences; RoBERTa's FULL-SENTENCES packing,
    which keeps sentences whole, is `workbench.families.roberta.full_sentences`. `rng` (seeded by the loop
    from (seed, epoch)) picks a random start offset in the first block and the order of blocks,
    so each epoch sees different cuts. The last incomplete block is dropped.
    """
    block = max_len - corpus.num_special
    if block < 1:
        raise ValueError(f"max_len={max_len} leaves no room for tokens after {corpus.num_special} special tokens")
    stream = corpus.stream_with_separators()
    offset = int(rng.integers(0, block)) if len(stream) > 2 * block else 0
    n_blocks = (len(stream) - offset) // block
    for b in rng.permutation(n_blocks):
        start = offset + int(b) * block
        yield stream[start : start + block].tolist()


@dataclass
class FamilySpec:
    """How to tokenise, batch and build one model family for pretraining (see module docstring).

    Optional fields:
    - `special_roles`: role -> token string ("pad", "unk", "cls", "sep", "mask", "bos", "eos"),
      where the defaults guessed from common spellings ([PAD], <pad>, </s>, ...) are not right;
    - `template`: (single, pair) post-processor templates in HF `tokenizers` TemplateProcessing
      syntax, e.g. ("[CLS] $A [SEP]", "[CLS] $A [SEP] $B:1 [SEP]:1"); None = infer from the specials;
    - `objective`: default objective settings (merged under the config's `objective:` section,
      passed to `make_collator` and written into every checkpoint manifest);
    - `auto_class`: the transformers Auto class that opens the saved checkpoint with its head
      (e.g. "AutoModelForMaskedLM"); `AutoModel` must open it too;
    - `examples_take_objective`: `make_examples` takes `objective=` (the merged objective settings);
      the loop calls `examples(...)`, which passes them only to such families;
    - `truncate_example`: cuts one example for the sequence-length warm-up (`truncate_block` for
      plain token blocks, `bert.truncate_pair_example` for sentence pairs); None = unsupported.

    What the rest of the workbench asks about a family, answered here and nowhere else (the
    defaults describe a BERT-like encoder; a new family sets what differs):
    - `hf_model_types`: the `config.model_type` its checkpoints are saved as, first, then other
      releases' types that open as this family (GPT: "gpt2", "openai-gpt"); a checkpoint without
      our manifest is named by it (`workbench.running.models`), and the PEFT sites below apply to
      the first. Empty: its checkpoints are another family's architecture (SpanBERT saves a BERT);
    - `causal`: a left-to-right LM (its stack is "decoder", its LM head causal:
      `workbench.running.runner.CAUSAL_MODEL_TYPES`);
    - `poolings`: the sentence classifier kinds it supports, the first is "auto"
      (`workbench.drivers.finetune.choose_pooling`); `classifier_heads`: pooling (or "token") ->
      the workbench head class for it, a `HeadClass` or an `EncoderMeanHead` (imported when asked;
      missing: transformers' Auto class, `workbench.running.classifier_loading.classifier_class`);
    - PEFT (`workbench.running.peft_methods`): `peft_methods` it supports (None: all);
      `adapter_sites` (regexes of the modules an adapter follows: after attention, after the
      feed-forward block) and `adapter_sites_before_dropout` (where checkpoints saved before the
      adapters moved after the dropout have them); `lora_targets` (query, value module names; None:
      peft's default for the model type); `fused_qkv` (the fused Q,K,V projection and its layout,
      "blocks" or "per_head"); `lora_fan_in_fan_out` (Conv1D weights, GPT-2);
    - `attention_dropout`: how its attention-probability dropout is applied, "functional" (inside
      the attention function), "module" (an `nn.Dropout`) or None (no attention): `workbench.dropout`;
    - cost (`workbench.cost`; the formulas to build them from: `workbench.families.flops`):
      `flops(model_config, vocab, seq_len, objective)` the pretraining
      forward's matmul FLOPs per input token by part (None: no count); `classifier_flops(model_config,
      seq_len, classifier)` the (parts, hidden width) of the body a classifier of that kind runs
      (None: a BERT-like encoder); `non_embedding_params(model_config, classifier)` Kaplan et al.'s N
      (None: a BERT-like encoder); an unknown classifier kind raises `workbench.families.flops.UnknownClassifier`;
    - `attention_patterns`: its blocks have attention patterns to hook (ELMo's LSTMs do not);
      `padding_offset_positions`: its learned positions start at padding_idx + 1 (RoBERTa), so it
      reads `max_position_embeddings - pad - 1` tokens (`workbench.running.word_alignment`);
    - `lm_head`: where LM scores come from, "own" (the checkpoint's LM head), "bilm" (ELMo's
      softmax) or "generator" (ELECTRA's generator: `workbench.running.lm_scores`);
    - distillation: `distill_student` the family of a pretraining-distillation student of this
      teacher (None: cannot teach; `workbench.drivers.distill_pretraining`), `distill_unsupported`
      why a fine-tuned model of it cannot be cut into a student (`workbench.drivers.distill`),
      `teacher_converters` teacher model type -> the function that turns layers cut from such a
      teacher into this family's model (DistilBERT: `bert_to_distilbert` for a BERT's layers).
    """

    name: str
    tokenizer_kind: str
    special_tokens: list[str]
    presets: dict[str, dict]
    build_model: Callable[[dict, "PreTrainedTokenizerFast"], nn.Module]
    make_collator: Callable[[dict, "PreTrainedTokenizerFast"], Collator]
    packing: str = "contiguous"
    make_examples: Callable[["TokenizedCorpus", int, np.random.Generator], Iterator[Any]] = contiguous_blocks
    special_roles: dict[str, str] | None = None
    template: tuple[str, str | None] | None = None
    objective: dict = field(default_factory=dict)
    auto_class: str = "AutoModel"
    description: str = ""
    examples_take_objective: bool = False  # make_examples(..., objective=settings): see `examples`
    truncate_example: Truncator | None = None  # for seq_len_warmup: see the module docstring
    # ---- what the rest of the workbench asks a family by name (the "knowledge" fields below)
    hf_model_types: tuple[str, ...] = ()
    causal: bool = False
    poolings: tuple[str, ...] = ("first", "encoder_mean")
    classifier_heads: dict[str, "HeadClass | EncoderMeanHead"] = field(default_factory=dict)
    peft_methods: tuple[str, ...] | None = None
    adapter_sites: tuple[str, str] | None = None
    adapter_sites_before_dropout: tuple[str, str] | None = None
    lora_targets: tuple[str, str] | None = None
    fused_qkv: tuple[str, str] | None = None
    lora_fan_in_fan_out: bool = False
    attention_dropout: str | None = "functional"
    flops: Callable[[dict, int, int, dict], dict] | None = None
    classifier_flops: Callable[[dict, int, str | None], tuple[dict, int]] | None = None
    non_embedding_params: Callable[[dict, str | None], int] | None = None
    attention_patterns: bool = True
    padding_offset_positions: bool = False
    lm_head: str = "own"
    distill_student: str | None = None
    distill_unsupported: str | None = None
    teacher_converters: dict[str, Callable[[nn.Module], nn.Module]] = field(default_factory=dict)

    def __post_init__(self):
        if self.tokenizer_kind not in TOKENIZER_KINDS:
            raise ValueError(f"family {self.name}: tokenizer_kind {self.tokenizer_kind!r} not in {TOKENIZER_KINDS}")
        missing = [p for p in PRESET_NAMES if p not in self.presets]
        if missing:
            raise ValueError(f"family {self.name}: presets {missing} missing (need {PRESET_NAMES})")
        if self.attention_dropout not in ATTENTION_DROPOUT_KINDS:
            raise ValueError(f"family {self.name}: attention_dropout {self.attention_dropout!r} not in "
                             f"{ATTENTION_DROPOUT_KINDS}")
        if self.lm_head not in LM_HEAD_KINDS:
            raise ValueError(f"family {self.name}: lm_head {self.lm_head!r} not in {LM_HEAD_KINDS}")
        if not self.poolings:
            raise ValueError(f"family {self.name}: poolings is empty")

    def examples(self, corpus: "TokenizedCorpus", max_len: int, rng: np.random.Generator,
                 objective: dict | None = None) -> Iterator[Any]:
        """One epoch of `make_examples`, given the merged objective settings when the family's
        examples depend on them (T5: the corrupted input must fit `max_len` at any noise density;
        DeBERTa: `random_next`)."""
        if self.examples_take_objective:
            return self.make_examples(corpus, max_len, rng, objective=objective)
        return self.make_examples(corpus, max_len, rng)

    def model_config(self, preset: str, overrides: dict | None = None) -> dict:
        """The preset's hyper-parameters with `overrides` on top (a fresh dict)."""
        if preset not in self.presets:
            raise KeyError(f"family {self.name} has no preset {preset!r} (has {sorted(self.presets)})")
        return {**self.presets[preset], **(overrides or {})}


@dataclass(frozen=True)
class HeadClass:
    """A `FamilySpec.classifier_heads` entry: the class `module.name`, imported when asked
    (`workbench.running.classifier_heads.head_class`)."""

    module: str
    name: str


@dataclass(frozen=True)
class EncoderMeanHead:
    """A `FamilySpec.classifier_heads["encoder_mean"]` entry: the mean-pooling sentence head `name`
    over the body class `module.body` (a subclass of `module.pretrained` whose body attribute is
    `prefix`), made by `workbench.running.classifier_heads.encoder_mean_head` when asked."""

    name: str
    module: str
    pretrained: str
    body: str
    prefix: str


# adapter-bert's sites (after the attention output's and the feed-forward output's dropout) in a
# BERT-like block, and where checkpoints saved before the adapters moved after the dropout have them
BERT_ADAPTER_SITES = (r"attention\.output\.dropout$", r"layer\.\d+\.output\.dropout$")
BERT_ADAPTER_SITES_BEFORE_DROPOUT = (r"attention\.output\.dense$", r"layer\.\d+\.output\.dense$")


def t5_sentinels(n: int = 100) -> list[str]:
    """T5's span-corruption sentinel tokens `<extra_id_0>` ... `<extra_id_{n-1}>` (Raffel et al. 2020)."""
    return [f"<extra_id_{i}>" for i in range(n)]


def special_tokens_mask(input_ids: torch.Tensor, tokenizer: "PreTrainedTokenizerFast") -> torch.Tensor:
    """Bool tensor, True where `input_ids` holds one of the tokenizer's special tokens (incl. padding).

    Masking objectives use it so that [CLS]/[SEP]/<pad>/sentinels are never chosen for masking.
    """
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=input_ids.dtype, device=input_ids.device)
    return torch.isin(input_ids, special)


def pad_sequences(
    sequences: list[list[int]], pad_id: int, max_len: int | None = None, dtype=torch.long
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a list of id lists to the longest (or `max_len`): (ids [B, T], attention_mask [B, T])."""
    width = max((len(s) for s in sequences), default=0) if max_len is None else max_len
    ids = torch.full((len(sequences), width), pad_id, dtype=dtype)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        s = list(s)[:width]
        ids[i, : len(s)] = torch.as_tensor(s, dtype=dtype)
        mask[i, : len(s)] = 1
    return ids, mask


def _templates(tokenizer: "PreTrainedTokenizerFast") -> dict:
    """The backend post-processor's TemplateProcessing as {"single": [...], "pair": [...]} of
    ("A"|"B"|token id, type_id) items, parsed once per tokenizer and cached on it."""
    cached = getattr(tokenizer, "_workbench_templates", None)
    if cached is not None:
        return cached
    post = json.loads(tokenizer.backend_tokenizer.to_str()).get("post_processor")
    out: dict[str, list] = {"single": [("A", 0)], "pair": [("A", 0), ("B", 1)]}
    if post is not None:
        if post.get("type") != "TemplateProcessing":
            raise ValueError(f"post-processor {post.get('type')} is not a TemplateProcessing; cannot add specials to ids")
        for key in ("single", "pair"):
            items = []
            for piece in post[key]:
                if "Sequence" in piece:
                    items.append((piece["Sequence"]["id"], piece["Sequence"]["type_id"]))
                else:
                    tok = piece["SpecialToken"]["id"]
                    items.append((post["special_tokens"][tok]["ids"][0], piece["SpecialToken"]["type_id"]))
            out[key] = items
    tokenizer._workbench_templates = out
    return out


def add_special_tokens(
    tokenizer: "PreTrainedTokenizerFast",
    ids_a: list[int],
    ids_b: list[int] | None = None,
    return_type_ids: bool = False,
):
    """The family's special tokens around raw ids, exactly as the tokenizer's post-processor adds
    them to text: [CLS] a [SEP] b [SEP] (BERT), <s> a </s></s> b </s> (RoBERTa), a </s> (T5).

    Returns the id list, or (ids, token_type_ids) with `return_type_ids=True`.
    """
    items = _templates(tokenizer)["single" if ids_b is None else "pair"]
    ids: list[int] = []
    types: list[int] = []
    for item, type_id in items:
        seq = list(ids_a) if item == "A" else list(ids_b) if item == "B" else [item]
        ids.extend(seq)
        types.extend([type_id] * len(seq))
    return (ids, types) if return_type_ids else ids


class PretrainingWrapper(nn.Module):
    """Wraps a transformers model whose own forward computes the loss (e.g. `GPT2LMHeadModel` with
    `labels`), so that it returns a `PretrainingOutput`; `save_pretrained` writes the plain model.
    """

    def __init__(self, model: nn.Module, term: str = "lm"):
        super().__init__()
        self.model = model
        self.term = term

    @property
    def config(self):
        return self.model.config

    def forward(self, **batch) -> PretrainingOutput:
        out = self.model(**batch)
        # the logits ride along for a loss hook that reads them (distillation, workbench.loop)
        return PretrainingOutput(loss=out.loss, loss_terms={self.term: out.loss.detach()}, extra={"logits": out.logits})

    def save_pretrained(self, save_directory, **kwargs) -> None:
        self.model.save_pretrained(save_directory, **kwargs)
