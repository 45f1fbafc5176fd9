"""BERT: masked LM + next-sentence prediction over WordPiece (Devlin et al. 2019).

Also the home of the masked-LM machinery the other encoder families reuse (RoBERTa, SpanBERT,
ALBERT, ELECTRA): which subwords start a word (for whole-word and span masking), the static /
dynamic mask switch, and `masked_lm_loss`, which projects only the predicted positions onto the
vocabulary (projecting every token is most of a small model's compute).

Objective settings (`FAMILY.objective`, overridable in a config's `objective:` section):
- `mlm_rate` 0.15, `mask_prob` 0.8, `random_prob` 0.1: BERT's 80/10/10; every chosen token is predicted.
- `whole_word` (False): BERT-WWM, all pieces of a word are chosen together.
- `masking` "dynamic" | "static": dynamic draws a new mask each time a sequence is seen (Liu et
  al. 2019); static makes the mask a deterministic function of the sequence's ids (a content
  hash) and a duplicate index in `[0, dupe_factor)` drawn per example, the way BERT's
  `create_pretraining_data.py` masked each of its `dupe_factor` copies once. With
  `dupe_factor` 1 a sequence gets the same mask in every epoch.
- `nsp` (True): next-sentence prediction; False trains MLM only on the same sentence pairs (the
  pooler and NSP head then get no gradient: `BertPretrainer.unused_parameters` names them and the
  training loop freezes them, so DDP does not wait for their gradients).

Examples (`make_examples`): NSP pairs built with `workbench.objectives.nsp_pair` from every
document with at least two sentences, about one pair per `max_len - 3` tokens of the document.
As in BERT, where `create_pretraining_data.py` writes the pairs once, the pairs (and their random
second segments) are the same every epoch: each is drawn from a generator seeded by its
(document, index), and the epoch's generator only shuffles their order. Masks are drawn by the
collator (dynamic or static, above).
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForPreTraining

from workbench.families import flops
from workbench.errors import CheckpointError, ConfigError
from workbench.families.base import (BERT_ADAPTER_SITES, BERT_ADAPTER_SITES_BEFORE_DROPOUT, FamilySpec,
                                     PretrainingOutput, PretrainingWrapper, add_special_tokens, EncoderMeanHead,
                                     pad_sequences, special_tokens_mask)
from workbench.objectives.mlm import IGNORE_INDEX, default_candidate_ids, mask_tokens
from workbench.objectives.sentence_pairs import nsp_pair, truncate_pair
from workbench.running.model_loading import load_weights

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Seed of the fixed sentence-pair instances (NSP here, SOP in ALBERT); see module docstring.
PAIR_SEED = 20190524

MLM_DEFAULTS = {
    "mlm_rate": 0.15,
    "mask_prob": 0.8,
    "random_prob": 0.1,
    "whole_word": False,
    "masking": "dynamic",
    "dupe_factor": 1,
}
BERT_DEFAULTS = {**MLM_DEFAULTS, "nsp": True}

BERT_SHAPES = {
    # 2 layers, hidden 64: for tests (seconds on a CPU).
    "tiny": dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128,
                 max_position_embeddings=256),
    # 4 layers, hidden 256: the ten-minute CPU model (~1,500 tokens/s training, MACHINE-FACTS).
    "small": dict(num_hidden_layers=4, hidden_size=256, num_attention_heads=4, intermediate_size=1024,
                  max_position_embeddings=512),
    # BERT-base (Devlin et al. 2019), for GPU users.
    "base": dict(num_hidden_layers=12, hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                 max_position_embeddings=512),
}


# ---- tokenizer facts ---------------------------------------------------------------------------


def word_start_table(tokenizer) -> torch.Tensor:
    """Bool [len(tokenizer)]: True where a token begins a word (False for word continuations).

    WordPiece marks continuations with `##`; byte-level BPE marks word starts with `Ġ` (a leading
    space); SentencePiece-style Unigram marks them with `▁`. Special tokens count as word starts.
    Cached on the tokenizer.
    """
    cached = getattr(tokenizer, "_workbench_word_starts", None)
    if cached is not None:
        return cached
    vocab = tokenizer.get_vocab()
    table = torch.ones(len(tokenizer), dtype=torch.bool)
    tokens = list(vocab)
    if any(t.startswith("##") for t in tokens):
        for tok, i in vocab.items():
            table[i] = not tok.startswith("##")
    else:
        marker = "▁" if sum(t.startswith("▁") for t in tokens) > sum(t.startswith("Ġ") for t in tokens) else "Ġ"
        for tok, i in vocab.items():
            table[i] = tok.startswith(marker)
    for i in tokenizer.all_special_ids:
        table[i] = True
    tokenizer._workbench_word_starts = table
    return table


def word_ids(input_ids: torch.Tensor, special_mask: torch.Tensor, tokenizer) -> torch.Tensor:
    """Word index of every token [B, T] (-1 at special tokens), from `word_start_table`.

    A block cut from the packed stream may start inside a word; its leading pieces then form a
    word of their own.
    """
    starts = word_start_table(tokenizer)[input_ids.cpu()] | special_mask.cpu()
    ids = torch.cumsum(starts.long(), dim=1)
    return torch.where(special_mask.cpu(), torch.full_like(ids, -1), ids).to(input_ids.device)


def candidate_ids(tokenizer) -> torch.Tensor:
    """Pool of random replacements: every id but the special tokens (batch-independent, cached)."""
    cached = getattr(tokenizer, "_workbench_candidates", None)
    if cached is None:
        cached = default_candidate_ids(len(tokenizer), tokenizer.all_special_ids)
        tokenizer._workbench_candidates = cached
    return cached


def content_seed(ids: torch.Tensor, salt: int = 0) -> int:
    """A 63-bit seed that is a deterministic function of a sequence's ids and `salt`."""
    data = np.asarray(ids.cpu(), dtype=np.int64).tobytes() + int(salt).to_bytes(8, "little", signed=True)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1


def objective_options(family: str, defaults: dict, objective: dict) -> dict:
    """`defaults` with `objective` on top; a key the family does not know is a ConfigError (a typo
    such as `mask_rate` must not silently train with the default)."""
    unknown = sorted(set(objective) - set(defaults) - {"objective", "max_len"})
    if unknown:
        raise ConfigError(f"objective: unknown setting(s) {unknown} for family {family} (known: {sorted(defaults)})")
    return {**defaults, **objective}


def mlm_options(objective: dict) -> dict:
    """Masked-LM settings (MLM_DEFAULTS under `objective`), checked."""
    opts = {**MLM_DEFAULTS, **objective}
    if opts["masking"] not in ("dynamic", "static"):
        raise ValueError(f"objective.masking must be 'dynamic' or 'static', got {opts['masking']!r}")
    if int(opts["dupe_factor"]) < 1:
        raise ValueError(f"objective.dupe_factor must be >= 1, got {opts['dupe_factor']}")
    return opts


def apply_mlm(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    tokenizer,
    opts: dict,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked_input_ids, labels) for a padded batch, dynamic or static per `opts` (see module docstring)."""
    special = special_tokens_mask(input_ids, tokenizer) | (attention_mask == 0)
    kwargs = dict(
        mask_token_id=tokenizer.mask_token_id,
        vocab_size=len(tokenizer),
        rate=float(opts["mlm_rate"]),
        mask_prob=float(opts["mask_prob"]),
        random_prob=float(opts["random_prob"]),
        candidate_ids=candidate_ids(tokenizer),
    )
    wids = word_ids(input_ids, special, tokenizer) if opts["whole_word"] else None
    if opts["masking"] == "dynamic":
        return mask_tokens(input_ids, special, generator=generator, word_ids=wids, **kwargs)
    # static: one generator per sequence, seeded from its real (unpadded) ids and a duplicate index
    dupes = torch.randint(int(opts["dupe_factor"]), (len(input_ids),), generator=generator).tolist()
    masked, labels = input_ids.clone(), torch.full_like(input_ids, IGNORE_INDEX)
    for i, dupe in enumerate(dupes):
        n = int(attention_mask[i].sum())
        g = torch.Generator().manual_seed(content_seed(input_ids[i, :n], dupe))
        m, lab = mask_tokens(
            input_ids[i : i + 1, :n], special[i : i + 1, :n], generator=g,
            word_ids=None if wids is None else wids[i : i + 1, :n], **kwargs,
        )
        masked[i, :n], labels[i, :n] = m[0], lab[0]
    return masked, labels


# ---- sentence-pair examples (NSP here; SOP in albert.py) ----------------------------------------


def document_sentences(corpus, d: int) -> list[np.ndarray]:
    """The non-empty sentences of document `d` of a `TokenizedCorpus` as int64 arrays: one read of
    the memory map split into views (one `TokenizedCorpus.sentence` call per sentence dominated
    example building for long documents). The pair builders drop empty sentences anyway."""
    first, end = int(corpus.document_offsets[d]), int(corpus.document_offsets[d + 1])
    offsets = np.asarray(corpus.sentence_offsets[first : end + 1], dtype=np.int64)
    ids = np.asarray(corpus.ids[offsets[0] : offsets[-1]], dtype=np.int64)
    return [s for s in np.split(ids, offsets[1:-1] - offsets[0]) if len(s)]


def _pair_generator(doc: int, k: int) -> torch.Generator:
    return torch.Generator().manual_seed(PAIR_SEED * 1_000_003 + doc * 1009 + k)


def sentence_pair_examples(corpus, max_len: int, rng: np.random.Generator, make_pair) -> Iterator[dict]:
    """Fixed sentence-pair instances of every document with >= 2 non-empty sentences, in an order
    drawn from `rng`. `make_pair(doc_index, sentences, generator, max_tokens, document) -> (a, b, label)`.

    A document of n tokens gives max(1, round(n / (max_len - 3))) instances (BERT sweeps each
    document into instances of about max_len tokens); each instance is drawn from a generator
    seeded by (document, instance index), so the set is the same every epoch. `make_pair` also
    gets `document(j)`, a cached `document_sentences` reader for other documents.
    """
    max_tokens = max_len - 3  # [CLS] a [SEP] b [SEP]
    if max_tokens < 2:
        raise ValueError(f"max_len={max_len} is too short for sentence pairs")
    sent_off = np.asarray(corpus.sentence_offsets)
    doc_off = np.asarray(corpus.document_offsets)
    lengths = np.diff(sent_off)
    jobs = []
    for d in range(corpus.num_documents):
        sl = lengths[doc_off[d] : doc_off[d + 1]]
        if int((sl > 0).sum()) >= 2:
            jobs.extend((d, k) for k in range(max(1, int(round(sl.sum() / max_tokens)))))
    document = functools.lru_cache(maxsize=64)(lambda d: document_sentences(corpus, d))
    for j in rng.permutation(len(jobs)):
        d, k = jobs[int(j)]
        a, b, label = make_pair(d, document(d), _pair_generator(d, k), max_tokens, document)
        yield {"a": a, "b": b, "label": int(label)}


def nsp_examples(corpus, max_len: int, rng: np.random.Generator, random_prob: float = 0.5) -> Iterator[dict]:
    """NSP pairs (label 1 = random next, 0 = real next, as `BertForPreTraining` expects); the second
    segment comes from another document with probability `random_prob` (BERT: 0.5)."""
    doc_off = np.asarray(corpus.document_offsets)
    nonempty = np.flatnonzero(np.asarray(corpus.sentence_offsets)[doc_off[1:]] > np.asarray(corpus.sentence_offsets)[doc_off[:-1]])
    if len(nonempty) < 2:
        raise ValueError("next-sentence prediction needs a corpus of at least two non-empty documents")

    def make_pair(d, sentences, g, max_tokens, document):
        def other(gen):
            while True:
                j = int(nonempty[int(torch.randint(len(nonempty), (1,), generator=gen))])
                if j != d:
                    return document(j)

        return nsp_pair(sentences, other, max_tokens=max_tokens, generator=g, random_prob=random_prob)

    return sentence_pair_examples(corpus, max_len, rng, make_pair)


def truncate_pair_example(example: dict, length: int, tokenizer, generator: torch.Generator) -> dict:
    """A sentence-pair example cut to `[CLS] a [SEP] b [SEP]` of at most `length` tokens with
    BERT's `truncate_seq_pair` (longer segment first, front or back at random, both segments kept
    non-empty), for the sequence-length warm-up; the label (NSP/SOP) stays the pair's."""
    a, b = truncate_pair(example["a"], example["b"], length - tokenizer.num_special_tokens_to_add(pair=True),
                         generator=generator)
    return {**example, "a": a, "b": b}


def collate_pairs(examples: list[dict], tokenizer) -> dict[str, torch.Tensor]:
    """[CLS] a [SEP] b [SEP] with segment ids, padded; `pair_label` holds each example's label."""
    seqs, types = zip(*(add_special_tokens(tokenizer, ex["a"], ex["b"], return_type_ids=True) for ex in examples))
    ids, mask = pad_sequences(list(seqs), tokenizer.pad_token_id)
    token_type_ids, _ = pad_sequences(list(types), 0)
    labels = torch.tensor([int(ex["label"]) for ex in examples], dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": token_type_ids, "pair_label": labels}


def make_collator(objective: dict, tokenizer):
    opts = mlm_options(objective_options("bert", BERT_DEFAULTS, objective))

    def collate(examples: list[dict], generator: torch.Generator) -> dict[str, torch.Tensor]:
        batch = collate_pairs(examples, tokenizer)
        batch["input_ids"], batch["labels"] = apply_mlm(batch["input_ids"], batch["attention_mask"], tokenizer, opts, generator)
        label = batch.pop("pair_label")
        if opts["nsp"]:
            batch["next_sentence_label"] = label
        return batch

    return collate


# ---- model ----------------------------------------------------------------------------------------


def masked_lm_logits(head, sequence_output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """`head` (hidden -> vocabulary logits) at the predicted positions only, in their row-major order."""
    return head(sequence_output[labels != IGNORE_INDEX])


def masked_lm_loss(head, sequence_output: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of `head` (hidden -> vocabulary logits) at the predicted positions only."""
    logits = masked_lm_logits(head, sequence_output, labels)
    return F.cross_entropy(logits.float(), labels[labels != IGNORE_INDEX])


class BertPretrainer(PretrainingWrapper):
    """`BertForPreTraining` with loss terms mlm and nsp (a batch without `next_sentence_label`,
    i.e. `objective.nsp: false`, trains MLM only); `save_pretrained` writes the plain model."""

    def __init__(self, model: BertForPreTraining):
        super().__init__(model, term="mlm")

    def forward(self, input_ids, attention_mask, token_type_ids, labels, next_sentence_label=None, **_):
        out = self.model.bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        logits = masked_lm_logits(self.model.cls.predictions, out.last_hidden_state, labels)
        mlm = F.cross_entropy(logits.float(), labels[labels != IGNORE_INDEX])
        terms = {"mlm": mlm.detach()}
        loss = mlm
        if next_sentence_label is not None:
            logits = self.model.cls.seq_relationship(out.pooler_output)
            nsp = F.cross_entropy(logits.float(), next_sentence_label)
            terms["nsp"] = nsp.detach()
            terms["nsp_acc"] = (logits.argmax(-1) == next_sentence_label).float().mean().detach()
            loss = loss + nsp
        # what a distillation loss reads (workbench.drivers.distill_pretraining): the logits at the masked
        # positions, the last hidden states and the MLM head (for logits at every other position)
        return PretrainingOutput(loss=loss, loss_terms=terms, extra={"logits": logits, "hidden": out.last_hidden_state,
                                                                    "mlm_head": self.model.cls.predictions})

    def unused_parameters(self, objective: dict) -> list[torch.nn.Parameter]:
        """Parameters the objective never trains: without NSP, the pooler and the NSP classifier."""
        if objective.get("nsp", True):
            return []
        pooler = self.model.bert.pooler
        return [*(pooler.parameters() if pooler is not None else []), *self.model.cls.seq_relationship.parameters()]


def bert_config(model_config: dict, tokenizer, **extra) -> BertConfig:
    return BertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **{**model_config, **extra})


def build_model(model_config: dict, tokenizer) -> BertPretrainer:
    return BertPretrainer(BertForPreTraining(bert_config(model_config, tokenizer)))


def checkpoint_model_config(path) -> dict:
    """The `model_config` recorded in a checkpoint's `manifest.json` ({} without a manifest)."""
    manifest = Path(path) / "manifest.json"
    if not manifest.is_file():
        return {}
    try:
        return dict(json.loads(manifest.read_text(encoding="utf-8")).get("model_config") or {})
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{manifest}: unreadable manifest ({exc})") from exc


def load_pretrainer(path) -> BertPretrainer:
    """The training module back from a checkpoint folder (to evaluate it or train on)."""
    return BertPretrainer(load_weights(BertForPreTraining, path))

FAMILY = FamilySpec(
    name="bert",
    tokenizer_kind="wordpiece",
    special_tokens=SPECIAL_TOKENS,
    presets=BERT_SHAPES,
    build_model=build_model,
    make_collator=make_collator,
    make_examples=nsp_examples,
    truncate_example=truncate_pair_example,
    packing="sentences",
    objective={"objective": "mlm+nsp", **BERT_DEFAULTS},
    auto_class="AutoModelForPreTraining",
    hf_model_types=("bert",),
    classifier_heads={"encoder_mean": EncoderMeanHead("BertEncoderMeanForSequenceClassification",
                                                        "transformers.models.bert.modeling_bert",
                                                        "BertPreTrainedModel", "BertModel", "bert")},
    adapter_sites=BERT_ADAPTER_SITES,
    adapter_sites_before_dropout=BERT_ADAPTER_SITES_BEFORE_DROPOUT,
    flops=flops.mlm_family_flops,
    distill_student="distilbert",
    description="BERT: masked LM (80/10/10, optional whole-word, static or dynamic) + NSP (Devlin et al. 2019)",
)
