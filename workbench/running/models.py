"""The model handle: the one place that knows how to run a checkpoint.

`ModelHandle.load(folder)` opens any local transformers checkpoint (our own `save_pretrained`
folders and plain HF ones such as BERT or GPT-2) with its tokenizer, and gives every probe the
same three things: subword tokenisation of pre-split words with word alignment, hidden states of
every layer (and stack) pooled to words, and raw hidden states/attentions of a batch. Scores with
the model's own LM head (token log-probs, pseudo-log-likelihood, cloze candidates) live in
`workbench.running.lm_scores`.

Conventions (the HF `hidden_states` convention, as in Tenney et al. 2019 and Liu et al. 2019):
layer 0 is the embedding output, layers 1..L the blocks. Stacks are "encoder" (bidirectional
encoders, ELMo), "decoder" (causal LMs) or both for encoder-decoders (T5, BART).

Word alignment. Words are joined into running text `" " + " ".join(words)` and tokenised in one
piece; every subword is given to the word whose characters it starts in (a piece made only of the
space marker, such as SentencePiece's lone "▁", goes to the word that follows it). So a word gets
exactly the pieces it has in running text with a space before it — the `add_prefix_space=True`
convention of RoBERTa/GPT-2 (every word, the first included, gets "Ġ"/"▁") — whatever flags the
tokenizer was saved with, and without relying on `is_split_into_words`, whose behaviour differs
between pre-tokenizers. Special tokens the tokenizer's post-processor adds ([CLS] ... [SEP],
<s> ... </s>, ... </s>) are added around every sequence (and every window).

ELMo reads characters (Peters et al. 2018): a word its closed vocabulary maps to [UNK] is given an
id past the vocabulary that names its spelling (`WordTokenizer.encode`), carried through windows and batches
like any id; `run_ids` turns it back (`WordTokenizer.characters`) into [UNK] plus the word's characters (`char_ids`), so every
word, in the vocabulary or not, is read from its own spelling.

A word that yields no subword (e.g. a soft hyphen or zero-width space that the BERT normaliser
deletes) gets the representation of the nearest preceding subword (the last piece of the
previous word), or of the next subword when it opens the sentence, and is counted in
`stats["no_subword_words"]`.

Encoder-decoders: the "decoder" stack is a teacher-forced run over the same sentence (decoder
input = decoder_start_token_id + the encoder input shifted right, see `word_alignment.decoder_inputs`); a
word's decoder state is read where its pieces are the decoder's input, so it has seen the
sentence up to and including the word (as a causal LM's states have).

Models made from models (`derive`): a masked head, quantized or low-rank weights, a distilled
student, the random-init twin are new handles over a transformed copy, never a change to a handle
in place. A handle's `checkpoint_hash` (which keys the activation cache, resume units and rows) is
what it runs: the weight files of a loaded checkpoint, the state dict's content for an in-memory or
derived model, recomputed if a tensor is changed in place after all. `lineage` says where a derived
model comes from; `save` writes it as an ordinary checkpoint folder whose manifest records it.

Long sentences: sliding windows of `max_length` tokens (a checkpoint trained here: the `max_len` it
trained on, from its manifest), half a window apart by default; each word
is read from the window where it is most central (causal stacks: where it has most left
context). `stats` (a Counter, never reset by the handle) counts sentences, words,
empty_sentences, windowed_sentences, windows, words_cut_by_window, no_subword_words and
truncated_tokens (only `forward(..., truncate=True)` truncates).
"""

from __future__ import annotations

import copy
import warnings
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from workbench.store.checkpoints import MANIFEST_NAME, derived_manifest
from workbench.cost import derived_cost
from workbench.data.fake_language import shifted_vocabulary_mask
from workbench.errors import CheckpointError
from workbench.families import ModelTypeTable
from workbench.hf_quiet import quiet_transformers
from workbench.store.identity import state_dict_hash, weights_hash
from workbench.io import atomic_dir, atomic_write_json
from workbench.running.handle_running import WordForwards
from workbench.running.model_loading import Lineage, derive_model, open_checkpoint, read_tokenizer
from workbench.precision import resolve_compute_dtype
from workbench.running.runner import ModelRunner, stack_names
from workbench.running.word_alignment import (EncodedSentence, WordBatch, WordTokenizer, first_not_none,
                                              model_max_length)

# config.model_type -> workbench family name (each family's `FamilySpec.hf_model_types`)
FAMILY_OF_MODEL_TYPE = ModelTypeTable({}, lambda spec: spec.name, primary=False)

DOCUMENT_SEPARATOR = "<|endoftext|>"


def causal_start_id(tokenizer) -> int | None:
    """The token a causal LM saw in front of a document's first word during pretraining.

    GPT-2-lineage byte-level BPE vocabularies (GPT-2, Radford et al. 2019; Pythia; StarCoder;
    SmolLM/SmolLM2, Allal et al. 2025) join pretraining documents with `<|endoftext|>`, so that token
    starts a text. An instruction-tuned model may declare another `bos_token` (SmolLM2-Instruct's is
    ChatML's `<|im_start|>`, which in training always opens a chat turn followed by a role name),
    so the separator wins when the vocabulary has it; otherwise the declared bos, else the eos."""
    sep = tokenizer.convert_tokens_to_ids(DOCUMENT_SEPARATOR) if DOCUMENT_SEPARATOR in tokenizer.get_vocab() else None
    return first_not_none(sep, tokenizer.bos_token_id, tokenizer.eos_token_id)


# ---------------------------------------------------------------------- models made from models


def _tensor_stamp(model) -> tuple:
    """A cheap stamp of a model's tensors: (name, tensor identity, data pointer, in-place version
    counter) for each. It moves when a tensor is replaced or changed in place (`mul_`, `copy_`,
    `load_state_dict`, `torch.nn.utils.prune`'s renamed tensors), so a fixed hash can be checked
    without rehashing the bytes."""
    out = []
    for name, t in model.state_dict(keep_vars=True).items():
        try:
            version = t._version
        except RuntimeError:  # an inference tensor (made under inference_mode) has no counter
            version = None
        out.append((name, id(t), t.data_ptr(), version))
    return tuple(out)


def random_init_twin(handle: "ModelHandle", seed: int = 0) -> "ModelHandle":
    """The randomly initialised twin of a handle: `handle.derive("random_init", {"seed": seed})`."""
    return handle.derive("random_init", {"seed": int(seed)})


class ModelHandle(WordForwards):
    """Run any checkpoint: word-aligned hidden states of every layer and LM-head scores.

    `ModelHandle(model, tokenizer)` wraps an in-memory model (tests); `ModelHandle.load(folder)`
    opens a checkpoint folder. The tokenizer must be a fast (Rust `tokenizers`) one: alignment
    uses its character offsets. A facade: opening and deriving are `workbench.running.model_loading`'s,
    tokenisation `workbench.running.word_alignment.WordTokenizer` (`words`), forwards
    `workbench.running.ModelRunner` (`runner`), pooling to words `workbench.running.word_pooling`.
    """

    def __init__(self, model, tokenizer, path: str | Path | None = None, *, family: str | None = None,
                 max_length: int | None = None, head_trained: bool = True, weight_files: Sequence[Path] = (),
                 shifted_position_offset: int = 0, lineage: Lineage | None = None,
                 manifest: Mapping[str, Any] | None = None, dtype: str = "fp32"):
        if not getattr(tokenizer, "is_fast", False):
            raise CheckpointError(f"{path or 'in-memory model'}: needs a fast tokenizer (tokenizer.json); "
                                  f"got {type(tokenizer).__name__}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.path = Path(path) if path is not None else None
        self.config = model.config
        self.device = next(model.parameters()).device
        # The precision the forward passes compute in ("fp32" | "bf16"; "auto" resolved here by
        # `workbench.precision`): bf16 = autocast over the unchanged weights, so the checkpoint hash
        # stays the weights' and the activation cache key adds it (`activations.model_fingerprint`).
        self.compute_dtype = resolve_compute_dtype(dtype, self.device)
        self.stats: Counter = Counter()
        self._weight_files = [Path(p) for p in weight_files]
        self._hash: str | None = None  # `checkpoint_hash`, fixed with the stamp of the tensors it describes
        self._hash_stamp: tuple | None = None
        self.lineage = lineage  # a derived model: its parent, transform and parameters (`derive`)
        self.manifest = dict(manifest or {})  # the checkpoint's manifest.json ({} when none)
        self.head_trained = head_trained  # False: the LM head class loaded without its weights
        # A fake-language model trained with separate position embeddings (objective
        # `shifted_position_offset`) reads shifted-alphabet sentences at offset positions.
        self.shifted_position_offset = int(shifted_position_offset)
        self._shifted_vocabulary = shifted_vocabulary_mask(tokenizer) if self.shifted_position_offset > 0 else None
        model_type = getattr(self.config, "model_type", "")
        self.family = family or FAMILY_OF_MODEL_TYPE.get(model_type, model_type)
        self.stacks: tuple[str, ...] = stack_names(model)
        self.runner = ModelRunner(model)
        self.words = WordTokenizer(tokenizer, self.config, self.device, f"{self.path}")
        self._prefix = self.words.prefix
        # A decoder-only LM whose tokenizer adds nothing in front is read (`forward`, `word_states`)
        # behind the token its pretraining put before a document (`causal_start_id`), as
        # `workbench.running.lm_scores` scores it; the token belongs to no word, like [CLS]. Without it the
        # first word is the attention sink (Xiao et al. 2024) and carries the massive activations
        # (Sun et al. 2024): in SmolLM2's middle layers a max |x| of ~23,000 against ~100-300 for the
        # other words (docs/evidence/real-models.md). `tokenize_words` (fine-tuning's encoding) is unchanged,
        # and a checkpoint fine-tuned here is read as it was tuned (no start token).
        reads_as_tuned = self.manifest.get("kind") == "finetune"
        self.causal_start = (causal_start_id(tokenizer) if self.stacks == ("decoder",) and not self._prefix
                             and not reads_as_tuned else None)
        self.reads_characters = self.words.reads_characters  # ELMo's character CNN (module docstring)
        self.pad_id = self.words.pad_id
        self.max_length = int(max_length) if max_length is not None else model_max_length(self.config, tokenizer)
        self.capacity = self.max_length - len(self.read_prefix) - len(self._suffix)
        if self.capacity < 2:
            raise CheckpointError(f"{self.path}: max_length {self.max_length} leaves no room for tokens")
        # L and H from one tiny forward: robust across families (ELMo's 2H states, T5's d_model).
        self.num_layers: dict[str, int] = {}
        probe = self.forward([["a"]])
        for stack in self.stacks:
            self.num_layers[stack] = len(probe.hidden_states[stack]) - 1
        self.hidden_size = int(probe.hidden_states[self.stacks[0]][-1].shape[-1])

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu", attentions: bool = False,
             max_length: int | None = None, dtype: str = "fp32") -> "ModelHandle":
        """Open a checkpoint folder (config + weights + tokenizer; our `manifest.json` optional), or
        a Hub name from the local Hugging Face cache (`workbench.store.checkpoints.resolve_checkpoint`).

        Loads the LM head class the model was trained with (masked LM, causal LM or seq2seq LM) so
        that `workbench.running.lm_scores` can use it; families without one in the Auto registry (ELMo) fall
        back to the bare `AutoModel`. `attentions=True` loads eager attention (sdpa returns none).
        `dtype` ("fp32" | "bf16" | "auto", `workbench.precision`) is the precision the handle's
        forward passes compute in; the weights are loaded in fp32 either way.
        Every failure is a `CheckpointError` naming the folder. Never runs remote code
        (`workbench.running.model_loading.open_checkpoint`).
        """
        c = open_checkpoint(path, device, attentions, max_length)
        handle = cls(c.model, c.tokenizer, c.path, family=c.family, max_length=c.max_length,
                     head_trained=c.head_trained, weight_files=c.weight_files,
                     shifted_position_offset=c.shifted_position_offset, lineage=c.lineage, manifest=c.manifest,
                     dtype=dtype)
        handle.insert_prompt(c.prompt_ids)
        return handle

    @classmethod
    def load_classifier(cls, folder: str | Path, tokenizer=None) -> "ModelHandle":
        """A fine-tuned classifier folder as a handle over its classifier class
        (`workbench.running.classifier_loading.load_classifier`, not the LM class `load` opens),
        keeping the folder's identity (weight-file hash, manifest). `tokenizer`: the one it was
        tuned with when the caller has it (else the folder's)."""
        from workbench.running.classifier_loading import load_classifier
        from workbench.store.checkpoints import read_manifest, weight_files

        folder = Path(folder)
        model = load_classifier(folder)
        tokenizer = read_tokenizer(folder) if tokenizer is None else tokenizer
        manifest = read_manifest(folder) or {}
        return cls(model, tokenizer, folder, family=manifest.get("family"), weight_files=weight_files(folder),
                   manifest=manifest)

    def with_dtype(self, dtype: str) -> "ModelHandle":
        """This handle computing in another precision ("fp32" | "bf16" | "auto"): the same model,
        tokenizer and identity (a shallow copy, nothing reloaded or changed), its own `stats`. Itself
        when the precision is already that one."""
        resolved = resolve_compute_dtype(dtype, self.device)
        if resolved == self.compute_dtype:
            return self
        other = copy.copy(self)
        other.compute_dtype = resolved
        other.stats = Counter()
        return other

    def insert_prompt(self, ids: Sequence[int]) -> None:
        """A prompt-tuned checkpoint (Lester et al. 2021, `workbench.running.peft_methods`): its trained
        prompt ids follow the tokenizer's prefix in every sequence this handle runs, as in training;
        like the prefix they belong to no word."""
        if ids:
            self._prefix = [*self._prefix, *(int(i) for i in ids)]
            self.capacity -= len(ids)
            if self.capacity < 2:
                raise CheckpointError(f"{self.path}: max_length {self.max_length} leaves no room after the prompt")

    @property
    def read_prefix(self) -> list[int]:
        """The ids in front of every text `forward` and `word_states` run: the tokenizer's prefix,
        behind the causal start token where there is one (see `__init__`)."""
        return [self.causal_start, *self._prefix] if self.causal_start is not None else self._prefix

    _read_prefix = read_prefix

    @property
    def _suffix(self) -> list[int]:
        """The special ids the tokenizer puts after a sequence."""
        return self.words.suffix

    @property
    def _backend(self):
        """The handle's own copy of the Rust tokenizer (truncation and padding off)."""
        return self.words.backend

    @property
    def checkpoint_hash(self) -> str:
        """What this handle runs, as a sha256: over the weight files (names included) of a loaded
        checkpoint; over the state dict (names, dtypes, shapes, bytes: `state_dict_hash`) of an
        in-memory model, a derived one included. Keys the activation cache, resume units and rows.

        It cannot go stale: the hash is fixed together with a stamp of every tensor (identity, data
        pointer and in-place version counter, `_tensor_stamp`), and when a tensor was changed in
        place since (a head zeroed, weights quantized without `derive`), the hash is recomputed from
        the state dict, with a warning, so changed weights never read their parent's cache.
        (A write through `tensor.data` bypasses the version counter: change weights with `derive`.)"""
        stamp = _tensor_stamp(self.model)
        if self._hash is None or stamp != self._hash_stamp:
            if self._hash is not None:
                warnings.warn(f"{self.path or 'in-memory model'}: weights changed in place since the handle was "
                              f"made; its hash now follows the changed tensors (make models from models with "
                              f"ModelHandle.derive)", stacklevel=2)
                self._weight_files = []  # the files no longer describe what runs
            self._hash = weights_hash(self.path) if self._weight_files else state_dict_hash(self.model)
            self._hash_stamp = stamp
        return self._hash

    # ------------------------------------------------------------------ models made from this one

    def derive(self, transform: str, params: Mapping[str, Any] | None = None,
               apply: Callable[..., Any] | None = None) -> "ModelHandle":
        """A new handle over a model made from this one; this handle and its model are never modified.

        `transform` names the derivation and `params` (JSON values) are its parameters; `apply` is
        the function that makes the model: `apply(model, **params)` receives a deep copy of this
        handle's model and returns the model to run (the copy, changed, or a new module; None =
        the copy). Without `apply`, `transform` must be a registered derivation (`DERIVATIONS`, e.g.
        "random_init" with {"seed": s}).

        Identity: the derived handle's `checkpoint_hash` is the content hash of the tensors it runs
        (`state_dict_hash`), fixed at creation, not parent hash + parameters: two derivations that
        give the same weights share activations, and a transform whose code changes, or that is not
        deterministic, can never be read through another's cache. `lineage` records the parent
        (name, hash, its own lineage), the transform and its parameters for manifests and the app.
        The tokenizer and the reading conventions (family, window length) are the parent's.
        """
        model, canonical, spec = derive_model(self.model, transform, params, apply, _tensor_stamp)
        lineage = Lineage(parent=str(self.path) if self.path is not None else None, parent_hash=self.checkpoint_hash,
                          transform=transform, params=canonical, parent_lineage=self.lineage,
                          fresh_weights=spec.fresh_weights)
        keeps = not spec.fresh_weights
        derived = type(self)(model, self.tokenizer, path=None, family=self.family, max_length=self.max_length,
                              head_trained=self.head_trained if keeps else True,
                              shifted_position_offset=self.shifted_position_offset if keeps else 0,
                              lineage=lineage, manifest=self.manifest, dtype=self.compute_dtype)
        derived.checkpoint_hash  # noqa: B018  (identity fixed now, at creation)
        return derived

    def save(self, folder: str | Path, overwrite: bool = False) -> Path:
        """Write this handle's model as a plain checkpoint folder, atomically: `save_pretrained`
        weights and config, the tokenizer, and a `manifest.json` (`checkpoints.derived_manifest`:
        the parent's training record where the weights are the parent's, plus `derived_from`, the
        lineage). `ModelHandle.load(folder)` reads it back with the same hidden states; its
        `checkpoint_hash` is then the weight files' hash (another string for the same tensors)."""
        folder = Path(folder)
        if folder.exists() and not overwrite:
            raise CheckpointError(f"{folder}: already exists (pass overwrite=True to replace it)")
        lineage = self.lineage.record() if self.lineage else None
        # its cost: the transform trains nothing; the parent's total carries over (`workbench.cost`)
        cost = None if lineage is None else derived_cost(self.manifest, lineage.get("parent"), str(lineage.get("transform")),
                                                         bool(lineage.get("fresh_weights")))
        manifest = derived_manifest(self.manifest, lineage, family=self.family, content_sha256=self.checkpoint_hash,
                                    cost=cost)
        with atomic_dir(folder) as tmp, quiet_transformers():
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            atomic_write_json(tmp / MANIFEST_NAME, manifest)
        return folder

    # ------------------------------------------------------------------ tokenisation

    def encode_words(self, sentences: Sequence[Sequence[str]], count: bool = True) -> list[EncodedSentence]:
        """Content tokens of each sentence and each word's token span (`WordTokenizer.encode`);
        `count` adds the words without a subword of their own to `stats["no_subword_words"]`."""
        encs = self.words.encode(sentences)
        if count:
            self.stats["no_subword_words"] += int(sum(int((~e.own).sum()) for e in encs))
        return encs

    _encode = encode_words

    def tokenize_words(self, sentences: Sequence[Sequence[str]]) -> WordBatch:
        """Pre-split words -> padded subword batch with word alignment (special tokens added).

        Rows keep every token, also past `max_length`; `forward` checks the length."""
        batch = self.words.word_batch(sentences, self._prefix)
        if self.reads_characters:
            batch.input_ids = self.words.characters(batch.input_ids)[0]
        return batch
