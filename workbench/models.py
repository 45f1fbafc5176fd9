"""The model handle: the one place that knows how to run a checkpoint.

`ModelHandle.load(folder)` opens any local transformers checkpoint (our own `save_pretrained`
folders and plain HF ones such as BERT or GPT-2) with its tokenizer, and gives every probe the
same three things: subword tokenisation of pre-split words with word alignment, hidden states of
every layer (and stack) pooled to words, and raw hidden states/attentions of a batch. Scores with
the model's own LM head (token log-probs, pseudo-log-likelihood, cloze candidates) live in
`workbench.lm_scores`.

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
id past the vocabulary that names its spelling (`_encode`), carried through windows and batches
like any id; `_run` turns it back into [UNK] plus the word's characters (`char_ids`), so every
word, in the vocabulary or not, is read from its own spelling.

A word that yields no subword (e.g. a soft hyphen or zero-width space that the BERT normaliser
deletes) gets the representation of the nearest preceding subword (the last piece of the
previous word), or of the next subword when it opens the sentence, and is counted in
`stats["no_subword_words"]`.

Encoder-decoders: the "decoder" stack is a teacher-forced run over the same sentence (decoder
input = decoder_start_token_id + the encoder input shifted right, see `_decoder_inputs`); a
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

import contextlib
import copy
import hashlib
import itertools
import json
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from workbench.checkpoints import (MANIFEST_NAME, derived_manifest, read_manifest, resolve_checkpoint, weight_files,
                                   weights_hash)
from workbench.data.fake_language import separate_position_ids, shifted_vocabulary_mask
from workbench.errors import CheckpointError, WorkbenchError
from workbench.io import atomic_dir, atomic_write_json
from workbench.precision import autocast, resolve_compute_dtype

# config.model_type -> workbench family name.
FAMILY_OF_MODEL_TYPE = {
    "bert": "bert",
    "roberta": "roberta",
    "albert": "albert",
    "electra": "electra",
    "deberta-v2": "deberta",
    "gpt2": "gpt",
    "openai-gpt": "gpt",
    "t5": "t5",
    "mt5": "t5",
    "bart": "bart",
    "mbart": "bart",
    "elmo": "elmo",
    "distilbert": "distilbert",
}
CAUSAL_MODEL_TYPES = {"gpt2", "openai-gpt", "gpt_neo", "gptj", "llama", "mistral", "qwen2", "opt", "bloom"}
# Models whose learned positions are offset by padding_idx + 1 (RoBERTa's create_position_ids).
_PADDING_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert", "longformer", "data2vec-text"}
# No limit in config or tokenizer (T5's relative positions, ELMo's LSTMs): windows of this size.
DEFAULT_MAX_LENGTH = 512
# HF tokenizers without a real limit store a huge placeholder (1e30; the workbench's own: 1e6).
_NO_LIMIT = 1_000_000
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
POOLINGS = ("first", "mean", "last")

DOCUMENT_SEPARATOR = "<|endoftext|>"


def causal_start_id(tokenizer) -> int | None:
    """The token a causal LM saw in front of a document's first word during pretraining.

    GPT-2-lineage byte-level BPE vocabularies (GPT-2, Radford et al. 2019; Pythia; StarCoder;
    SmolLM/SmolLM2, Allal et al. 2025) join pretraining documents with `<|endoftext|>`, so that token
    starts a text. An instruction-tuned model may declare another `bos_token` (SmolLM2-Instruct's is
    ChatML's `<|im_start|>`, which in training always opens a chat turn followed by a role name),
    so the separator wins when the vocabulary has it; otherwise the declared bos, else the eos."""
    sep = tokenizer.convert_tokens_to_ids(DOCUMENT_SEPARATOR) if DOCUMENT_SEPARATOR in tokenizer.get_vocab() else None
    return _first_not_none(sep, tokenizer.bos_token_id, tokenizer.eos_token_id)


@dataclass
class WordBatch:
    """A padded batch (right padding). `word_ids[b, t]` = index of the word token t belongs to,
    -1 for special and padding tokens. Rows are NOT cut to `max_length` (see `forward`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    word_ids: torch.Tensor
    n_words: list[int] = field(default_factory=list)


@dataclass
class ForwardOutput:
    """Raw states of one batch, per stack. `hidden_states[stack]` = L+1 tensors [B, T, H];
    `attentions[stack]` = L tensors [B, heads, T, T] (self-attention), `cross_attentions` for the
    decoder of an encoder-decoder; `word_ids[stack]` aligns positions of that stack to words
    (the decoder of an encoder-decoder is one position to the right of the encoder)."""

    batch: WordBatch
    hidden_states: dict[str, tuple[torch.Tensor, ...]]
    word_ids: dict[str, torch.Tensor]
    attentions: dict[str, tuple[torch.Tensor, ...]] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    decoder_input_ids: torch.Tensor | None = None


@dataclass
class _Encoded:
    """One sentence as content tokens (no special tokens) and each word's token span."""

    ids: np.ndarray  # int64 [n_tokens]
    first: np.ndarray  # int64 [n_words] first token of each word (substitute token if none)
    last: np.ndarray  # int64 [n_words] last token of each word
    n_words: int
    own: np.ndarray  # bool [n_words]: the word has pieces of its own (False: a substitute)


@dataclass
class _Segment:
    """One row of a batch: a sentence or one window of it, with the words read from it."""

    sentence: int
    ids: np.ndarray
    words: np.ndarray  # word indices (into the sentence) whose states come from this segment
    first: np.ndarray  # their first/last token, relative to the segment's content
    last: np.ndarray


def plan_windows(n_tokens: int, capacity: int, stride: int) -> list[int]:
    """Start offsets of sliding windows of `capacity` tokens, `stride` apart, the last one ending
    at the end of the sentence (so the last window may overlap its predecessor by more)."""
    if n_tokens <= capacity:
        return [0]
    starts = list(range(0, n_tokens - capacity, stride))
    if not starts or starts[-1] != n_tokens - capacity:
        starts.append(n_tokens - capacity)
    return starts


def _choose_windows(first: np.ndarray, last: np.ndarray, starts: list[int], capacity: int, causal: bool):
    """For each word, the window that gives it most context and contains all its subwords:
    for bidirectional stacks the window where it is most central (largest distance to the nearer
    edge), for causal stacks the one with most left context. Returns (window index per word,
    mask of words no window contains whole)."""
    s = np.asarray(starts)[None, :]
    a, b = first[:, None], last[:, None]
    contained = (s <= a) & (b <= s + capacity - 1)
    score = (a - s) if causal else np.minimum(a - s, s + capacity - 1 - b)
    score = np.where(contained, score, -(10**9))
    choice = score.argmax(axis=1)
    cut = ~contained.any(axis=1)
    if cut.any():  # a word longer than the overlap: take the window holding most of its pieces
        overlap = np.minimum(b, s + capacity - 1) - np.maximum(a, s)
        choice[cut] = overlap[cut].argmax(axis=1)
    return choice, cut


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' per-load report and progress bar: `ModelHandle.load` checks the
    loading info itself (missing body weights are an error, a missing LM head is recorded) and
    the unused pretraining heads it reports (NSP, pooler) are expected, once per checkpoint of a sweep."""
    from transformers.utils import logging as hf_logging

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


# ---------------------------------------------------------------------- models made from models


def state_dict_hash(model) -> str:
    """sha256 over a model's state dict: every tensor's name, dtype, shape and bytes, by name.
    The identity of an in-memory model (derived ones included): what it runs, nothing else."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().to("cpu").contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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


@dataclass(frozen=True)
class Lineage:
    """Where a derived model comes from: its parent (folder or None for an in-memory model), the
    parent's hash and own lineage, the transform and its parameters (JSON values)."""

    parent: str | None
    parent_hash: str
    transform: str
    params: dict
    parent_lineage: "Lineage | None" = None
    fresh_weights: bool = False  # the transform built new weights (random init), none of the parent's

    def record(self) -> dict[str, Any]:
        """The lineage as JSON values (a checkpoint manifest's `derived_from`)."""
        return {"parent": self.parent, "parent_sha256": self.parent_hash, "transform": self.transform,
                "params": self.params, "fresh_weights": self.fresh_weights,
                "parent_derived_from": self.parent_lineage.record() if self.parent_lineage else None}

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None, where: str = "manifest") -> "Lineage | None":
        if record is None:
            return None
        try:
            return cls(parent=record.get("parent"), parent_hash=str(record["parent_sha256"]),
                       transform=str(record["transform"]), params=dict(record.get("params") or {}),
                       parent_lineage=cls.from_record(record.get("parent_derived_from"), where),
                       fresh_weights=bool(record.get("fresh_weights", False)))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise CheckpointError(f"{where}: unreadable derived_from record ({type(e).__name__}: {e})") from None

    def describe(self) -> str:
        """One line, oldest ancestor first: `<parent> -> head_mask{...} -> quantize{...}`."""
        head = self.parent_lineage.describe() if self.parent_lineage else (self.parent or f"in-memory {self.parent_hash[:12]}")
        return f"{head} -> {self.transform}{json.dumps(self.params, sort_keys=True)}"


@dataclass(frozen=True)
class Derivation:
    """A named way of making a model from a model (`ModelHandle.derive`).

    `apply(model, **params)` returns the model to run. With `fresh_weights=False` it receives a deep
    copy of the parent's model (and may change it in place); with `fresh_weights=True` it receives
    the parent's model itself, reads only its class and config, and builds new weights (then the
    derived handle keeps none of what was learnt with the parent's weights)."""

    name: str
    apply: Callable[..., Any]
    fresh_weights: bool = False


def _random_init(model, seed: int):
    """Same class and config, fresh weights: the class's own `_init_weights` under
    `torch.manual_seed(seed)` inside a forked RNG (the global RNG is untouched)."""
    config = copy.deepcopy(model.config)
    devices = [p.device for p in model.parameters()][:1] or [torch.device("cpu")]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        twin = type(model)(config)
    return twin.to(devices[0])


# Registered derivations (a transform with its own `apply` needs no entry). random_init is the usual
# "is it the architecture or the training?" baseline of probing papers (Hewitt & Manning 2019's
# random BERT; Tenney et al. 2019): the runner's random-init twin.
DERIVATIONS: dict[str, Derivation] = {"random_init": Derivation("random_init", _random_init, fresh_weights=True)}


def random_init_twin(handle: "ModelHandle", seed: int = 0) -> "ModelHandle":
    """The randomly initialised twin of a handle: `handle.derive("random_init", {"seed": seed})`."""
    return handle.derive("random_init", {"seed": int(seed)})


class ModelHandle:
    """Run any checkpoint: word-aligned hidden states of every layer and LM-head scores.

    `ModelHandle(model, tokenizer)` wraps an in-memory model (tests); `ModelHandle.load(folder)`
    opens a checkpoint folder. The tokenizer must be a fast (Rust `tokenizers`) one: alignment
    uses its character offsets.
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
        causal_head = type(model).__name__.endswith(("ForCausalLM", "LMHeadModel"))
        if getattr(self.config, "is_encoder_decoder", False):
            self.stacks: tuple[str, ...] = ("encoder", "decoder")
        elif causal_head or model_type in CAUSAL_MODEL_TYPES or getattr(self.config, "is_decoder", False):
            self.stacks = ("decoder",)
        else:
            self.stacks = ("encoder",)

        # A private copy of the Rust tokenizer with truncation and padding off: a tokenizer saved
        # with truncation enabled must not cut sentences behind our back.
        from tokenizers import Tokenizer

        self._backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self._backend.no_truncation()
        self._backend.no_padding()
        self._prefix, self._suffix = self._special_template()
        # A decoder-only LM whose tokenizer adds nothing in front is read (`forward`, `word_states`)
        # behind the token its pretraining put before a document (`causal_start_id`), as
        # `workbench.lm_scores` scores it; the token belongs to no word, like [CLS]. Without it the
        # first word is the attention sink (Xiao et al. 2024) and carries the massive activations
        # (Sun et al. 2024): in SmolLM2's middle layers a max |x| of ~23,000 against ~100-300 for the
        # other words (docs/real-models.md). `tokenize_words` (fine-tuning's encoding) is unchanged,
        # and a checkpoint fine-tuned here is read as it was tuned (no start token).
        reads_as_tuned = self.manifest.get("kind") == "finetune"
        self.causal_start = (causal_start_id(tokenizer) if self.stacks == ("decoder",) and not self._prefix
                             and not reads_as_tuned else None)
        # ELMo's character CNN: spellings of the unknown words seen so far, named by ids from
        # _open_base on (see the module docstring); None for models that read ids only.
        self.reads_characters = model_type == "elmo" and getattr(self.config, "token_encoder", "") == "char_cnn"
        self._spelling_ids: dict[str, int] = {}
        self._spellings: list[str] = []
        self._open_base = max(int(getattr(self.config, "vocab_size", 0) or 0), len(tokenizer))
        self.pad_id = _first_not_none(tokenizer.pad_token_id, getattr(self.config, "pad_token_id", None), 0)
        self.max_length = int(max_length) if max_length is not None else self._max_length()
        self.capacity = self.max_length - len(self._read_prefix) - len(self._suffix)
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
        a Hub name from the local Hugging Face cache (`workbench.checkpoints.resolve_checkpoint`).

        Loads the LM head class the model was trained with (masked LM, causal LM or seq2seq LM) so
        that `workbench.lm_scores` can use it; families without one in the Auto registry (ELMo) fall
        back to the bare `AutoModel`. `attentions=True` loads eager attention (sdpa returns none).
        `dtype` ("fp32" | "bf16" | "auto", `workbench.precision`) is the precision the handle's
        forward passes compute in; the weights are loaded in fp32 either way.
        Every failure is a `CheckpointError` naming the folder. Never runs remote code.
        """
        import workbench.families  # noqa: F401  (registers custom families such as ELMo)
        from transformers import (AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM,
                                  AutoModelForSeq2SeqLM, AutoTokenizer)

        path = resolve_checkpoint(path)
        if not path.is_dir():
            raise CheckpointError(f"{path}: not a checkpoint folder")
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path}: no config.json (not a save_pretrained folder)")
        manifest = read_manifest(path) or {}
        family = manifest.get("family")
        if max_length is None:
            # A checkpoint trained here read `max_len` tokens at a time: positions (and relative
            # buckets) past that are untrained, so its windows are that long, not the config's limit.
            trained_len = (manifest.get("config") or {}).get("max_len")
            max_length = int(trained_len) if isinstance(trained_len, int) and trained_len > 0 else None
        weights = weight_files(path)
        if not weights:
            raise CheckpointError(f"{path}: no weight files (model.safetensors or pytorch_model.bin)")
        if not any((path / f).is_file() for f in TOKENIZER_FILES):
            raise CheckpointError(f"{path}: no tokenizer (tokenizer.json / tokenizer_config.json)")
        try:
            config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot read config.json ({type(e).__name__}: {e})") from e
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot load the tokenizer ({type(e).__name__}: {e})") from e

        archs = [a for a in (getattr(config, "architectures", None) or [])]
        if getattr(config, "is_encoder_decoder", False):
            head_cls = AutoModelForSeq2SeqLM
        elif config.model_type in CAUSAL_MODEL_TYPES or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
            head_cls = AutoModelForCausalLM
        else:
            head_cls = AutoModelForMaskedLM
        kwargs = dict(config=config, local_files_only=True, trust_remote_code=False, output_loading_info=True)
        if attentions:
            kwargs["attn_implementation"] = "eager"
        try:
            with _quiet_transformers():
                try:
                    model, info = head_cls.from_pretrained(path, **kwargs)
                except ValueError as e:
                    if "Unrecognized configuration class" not in str(e):
                        raise
                    model, info = AutoModel.from_pretrained(path, **kwargs)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot load weights ({type(e).__name__}: {e})") from e

        missing = list(info.get("missing_keys", []) or [])
        base = model.base_model
        prefix = model.base_model_prefix + "."
        in_base = [k for k in missing if base is model or k.startswith(prefix)]
        if in_base:
            raise CheckpointError(f"{path}: weights missing for {len(in_base)} tensors of the model body, "
                                  f"e.g. {in_base[:5]} (corrupt or mismatched checkpoint)")
        head_missing = [k for k in missing if k not in in_base and not k.endswith("final_logits_bias")]

        try:
            n_emb = model.get_input_embeddings().num_embeddings
        except (NotImplementedError, AttributeError):
            n_emb = getattr(config, "vocab_size", None)
        if n_emb is not None and len(tokenizer) > n_emb:
            raise CheckpointError(f"{path}: tokenizer has {len(tokenizer)} tokens but the model's embedding "
                                  f"matrix only {n_emb} rows (tokenizer does not belong to these weights)")
        # parameter-efficient fine-tuning (workbench.peft_methods): adapters back into the forward,
        # their file into the hash; a prompt-tuned model's prompt ids after the tokenizer's prefix
        from workbench.peft_methods import ADAPTER_FILE, reattach_saved

        model = reattach_saved(model, path, manifest)
        if (path / ADAPTER_FILE).is_file():
            weights = [*weights, path / ADAPTER_FILE]
        model.to(device)
        objective = (manifest.get("config") or {}).get("objective") or {}
        handle = cls(model, tokenizer, path, family=family, max_length=max_length,
                     head_trained=not head_missing, weight_files=weights,
                     shifted_position_offset=int(objective.get("shifted_position_offset", 0) or 0),
                     lineage=Lineage.from_record(manifest.get("derived_from"), str(path / MANIFEST_NAME)),
                     manifest=manifest, dtype=dtype)
        handle.insert_prompt((manifest.get("peft") or {}).get("prompt_ids") or [])
        return handle

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
        """A prompt-tuned checkpoint (Lester et al. 2021, `workbench.peft_methods`): its trained
        prompt ids follow the tokenizer's prefix in every sequence this handle runs, as in training;
        like the prefix they belong to no word."""
        if ids:
            self._prefix = [*self._prefix, *(int(i) for i in ids)]
            self.capacity -= len(ids)
            if self.capacity < 2:
                raise CheckpointError(f"{self.path}: max_length {self.max_length} leaves no room after the prompt")

    @property
    def _read_prefix(self) -> list[int]:
        """The ids in front of every text `forward` and `word_states` run: the tokenizer's prefix,
        behind the causal start token where there is one (see `__init__`)."""
        return [self.causal_start, *self._prefix] if self.causal_start is not None else self._prefix

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
        params = dict(params or {})
        try:
            canonical = json.loads(json.dumps(params, sort_keys=True, allow_nan=False))
        except (TypeError, ValueError) as e:
            raise WorkbenchError(f"derive {transform!r}: parameters must be JSON values ({e})") from None
        spec = DERIVATIONS.get(transform) if apply is None else Derivation(transform, apply)
        if spec is None:
            raise WorkbenchError(f"derive: unknown transform {transform!r} without an apply function; "
                                 f"registered: {sorted(DERIVATIONS)}")
        parent_stamp = _tensor_stamp(self.model)
        if spec.fresh_weights:
            model = spec.apply(self.model, **params)
        else:
            copied = copy.deepcopy(self.model)
            model = spec.apply(copied, **params)
            model = copied if model is None else model
        if model is self.model or _tensor_stamp(self.model) != parent_stamp:
            raise WorkbenchError(f"derive {transform!r}: the transform changed the parent model (it must "
                                 f"change the copy it is given, or return a new model)")
        model.eval()
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
        manifest = derived_manifest(self.manifest, self.lineage.record() if self.lineage else None,
                                    family=self.family, content_sha256=self.checkpoint_hash)
        with atomic_dir(folder) as tmp, _quiet_transformers():
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            atomic_write_json(tmp / MANIFEST_NAME, manifest)
        return folder

    # ------------------------------------------------------------------ tokenisation

    def _special_template(self) -> tuple[list[int], list[int]]:
        """Special ids the post-processor puts before and after a single sequence."""
        enc = self._backend.encode(" a", add_special_tokens=True)
        mask = enc.special_tokens_mask
        content = [i for i, m in enumerate(mask) if not m]
        if not content:
            raise CheckpointError(f"{self.path}: the tokenizer turns plain text into special tokens only")
        return list(enc.ids[: content[0]]), list(enc.ids[content[-1] + 1:])

    def _max_length(self) -> int:
        cfg = self.config
        limit = getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", None)
        if limit is not None and getattr(cfg, "model_type", "") in _PADDING_OFFSET_POSITIONS:
            limit -= (getattr(cfg, "pad_token_id", None) or 0) + 1
        tok_limit = getattr(self.tokenizer, "model_max_length", None)
        if tok_limit is not None and tok_limit < _NO_LIMIT:
            # Positions past the length the model was trained at are untrained: respect the lower.
            limit = min(limit, tok_limit) if limit is not None else tok_limit
        return int(limit) if limit is not None else DEFAULT_MAX_LENGTH

    def _encode(self, sentences: Sequence[Sequence[str]], count: bool = True) -> list[_Encoded]:
        """Content tokens of each sentence and each word's token span (see the module docstring).

        Vectorised over the whole list: words and tokens of all sentences are numbered globally,
        so the character -> word and token -> word maps are a handful of numpy calls."""
        S = len(sentences)
        n_words = np.fromiter((len(ws) for ws in sentences), dtype=np.int64, count=S)
        nonempty = np.nonzero(n_words)[0]
        encs = self._backend.encode_batch([" " + " ".join(sentences[i]) for i in nonempty], add_special_tokens=False)
        unk = _first_not_none(self.tokenizer.unk_token_id, self.pad_id)
        # every word vanished (all deleted by the normaliser): the unk token stands in for them
        ids_list = [e.ids or [unk] for e in encs]
        if self.reads_characters:
            ids_list = [self._spell_unknown(" " + " ".join(sentences[i]), e) if e.ids else ids
                        for i, e, ids in zip(nonempty.tolist(), encs, ids_list)]
        # character starts of the tokens: one flat array from the (start, end) pairs (C-level chaining:
        # per-token Python loops here were a measurable part of extraction's CPU time)
        offsets_list = [e.offsets or [(0, 0)] for e in encs]
        n_tok = np.fromiter((len(x) for x in ids_list), dtype=np.int64, count=len(encs))
        W = int(n_words.sum())
        lens = np.fromiter((len(w) for i in nonempty for w in sentences[i]), dtype=np.int64, count=W)
        # Character c of " w0 w1 ..." lies in group k = (space + characters of word k); the texts
        # of all sentences are laid end to end, words numbered globally.
        group = np.repeat(np.arange(W, dtype=np.int64), lens + 1)
        text_len = np.add.reduceat(lens + 1, np.cumsum(n_words[nonempty]) - n_words[nonempty]) if W else lens
        char_base = np.cumsum(text_len) - text_len
        all_ids = np.fromiter(itertools.chain.from_iterable(ids_list), dtype=np.int64, count=int(n_tok.sum()))
        starts = np.fromiter(itertools.chain.from_iterable(itertools.chain.from_iterable(offsets_list)), dtype=np.int64,
                             count=2 * int(n_tok.sum()))[0::2]
        starts = np.minimum(starts, np.repeat(text_len - 1, n_tok)) + np.repeat(char_base, n_tok)
        tok_word = group[starts]
        if np.any(np.diff(tok_word) < 0):
            bad = int(np.searchsorted(np.cumsum(n_tok), np.nonzero(np.diff(tok_word) < 0)[0][0], side="right"))
            raise WorkbenchError(f"tokenizer offsets go backwards in sentence {int(nonempty[bad])}: "
                                 f"{sentences[int(nonempty[bad])]!r}")
        ar = np.arange(W)
        left = np.searchsorted(tok_word, ar, side="left")
        right = np.searchsorted(tok_word, ar, side="right") - 1
        tok_base = np.cumsum(n_tok) - n_tok  # first token of each (non-empty) sentence
        word_tok_base = np.repeat(tok_base, n_words[nonempty])
        missing = right < left
        if missing.any():
            # nearest preceding subword of the same sentence (the piece just before), else the next
            sub = np.where(right >= word_tok_base, right, left)
            left = np.where(missing, sub, left)
            right = np.where(missing, sub, right)
            if count:
                self.stats["no_subword_words"] += int(missing.sum())
        first, last = left - word_tok_base, right - word_tok_base
        empty = np.zeros(0, dtype=np.int64)
        out = [_Encoded(empty, empty, empty, 0, np.zeros(0, dtype=bool))] * S
        w0 = np.cumsum(n_words[nonempty]) - n_words[nonempty]
        for j, i in enumerate(nonempty.tolist()):
            t0, w, n = tok_base[j], w0[j], n_words[i]
            out[i] = _Encoded(all_ids[t0: t0 + n_tok[j]], first[w: w + n], last[w: w + n], int(n), ~missing[w: w + n])
        return out

    def _spell_unknown(self, text: str, enc) -> list[int]:
        """ELMo: the ids of one encoding with each [UNK] replaced by the id naming its spelling."""
        unk = self.tokenizer.unk_token_id
        ids = list(enc.ids)
        for t, tok in enumerate(ids):
            if tok == unk:
                a, b = enc.offsets[t]
                word = text[a:b]
                k = self._spelling_ids.get(word)
                if k is None:
                    k = self._spelling_ids[word] = len(self._spellings)
                    self._spellings.append(word)
                ids[t] = self._open_base + k
        return ids

    def _characters(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ELMo: (ids with spelling ids turned back into [UNK], char_ids [B, T, max_chars])."""
        from workbench.families.elmo_modules import word_characters

        C = int(self.config.max_chars)
        chars = torch.zeros(*ids.shape, C, dtype=torch.long, device=ids.device)
        open_ = ids >= self._open_base
        if bool(open_.any()):
            rows = [word_characters(self._spellings[k], C) for k in (ids[open_] - self._open_base).tolist()]
            chars[open_] = torch.tensor(rows, dtype=torch.long, device=ids.device)
            ids = torch.where(open_, torch.full_like(ids, self.tokenizer.unk_token_id), ids)
        return ids, chars

    def tokenize_words(self, sentences: Sequence[Sequence[str]]) -> WordBatch:
        """Pre-split words -> padded subword batch with word alignment (special tokens added).

        Rows keep every token, also past `max_length`; `forward` checks the length."""
        batch = self._word_batch(sentences, self._prefix)
        if self.reads_characters:
            batch.input_ids = self._characters(batch.input_ids)[0]
        return batch

    def _word_batch(self, sentences: Sequence[Sequence[str]], prefix: Sequence[int]) -> WordBatch:
        """`tokenize_words` behind `prefix`, but ELMo's unknown words keep their spelling ids (for `_run`)."""
        encs = self._encode(sentences, count=False)
        rows, wids = [], []
        for e in encs:
            tok_word = np.full(len(e.ids), -1, dtype=np.int64)
            w = np.nonzero(e.own)[0]  # substitutes keep the word id of the piece they borrow
            counts = e.last[w] - e.first[w] + 1
            tok_word[_ranges(e.first[w], counts)] = np.repeat(w, counts)
            rows.append(np.concatenate([prefix, e.ids, self._suffix]).astype(np.int64))
            wids.append(np.concatenate([np.full(len(prefix), -1), tok_word,
                                        np.full(len(self._suffix), -1)]).astype(np.int64))
        ids, mask, word_ids = self._pad(rows, wids)
        return WordBatch(ids, mask, word_ids, [e.n_words for e in encs])

    def _pad(self, rows: list[np.ndarray], extra: list[np.ndarray] | None = None):
        T = max(len(r) for r in rows)
        ids = np.full((len(rows), T), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), T), dtype=np.int64)
        other = np.full((len(rows), T), -1, dtype=np.int64) if extra is not None else None
        for b, r in enumerate(rows):
            ids[b, : len(r)] = r
            mask[b, : len(r)] = 1
            if other is not None:
                other[b, : len(r)] = extra[b]
        t = lambda a: torch.from_numpy(a).to(self.device)  # noqa: E731
        return (t(ids), t(mask)) + ((t(other),) if other is not None else ())

    # ------------------------------------------------------------------ forward passes

    def _decoder_inputs(self, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Teacher-forced decoder input for an encoder-decoder: the encoder input used as labels,
        shifted right behind `decoder_start_token_id` (HF `shift_tokens_right`): position t+1 of
        the decoder reads token t, so it has seen tokens <= t of the sentence (and the whole
        encoder input through cross-attention). When the tokenizer adds a closing special token,
        it is the one dropped by the shift; otherwise the sequence grows by one position."""
        start = _first_not_none(getattr(self.config, "decoder_start_token_id", None), self.pad_id)
        B = ids.shape[0]
        lengths = mask.sum(1)
        keep_all = not self._suffix
        T = ids.shape[1] + (1 if keep_all else 0)
        dec = torch.full((B, T), self.pad_id, dtype=ids.dtype, device=ids.device)
        dec[:, 0] = start
        dec[:, 1: ids.shape[1] + 1] = ids[:, : T - 1]
        dec_len = lengths + (1 if keep_all else 0)
        dec_mask = (torch.arange(T, device=ids.device)[None, :] < dec_len[:, None]).long()
        dec = torch.where(dec_mask.bool(), dec, torch.full_like(dec, self.pad_id))
        return dec, dec_mask

    def _run(self, ids: torch.Tensor, mask: torch.Tensor, stacks: Sequence[str], attentions: bool = False) -> dict:
        """One forward (no LM head): {stack: (hidden_states, attentions)} and cross-attentions."""
        kw = {"output_hidden_states": True, "return_dict": True}
        if self.reads_characters:
            ids, kw["char_ids"] = self._characters(ids)
        if attentions:
            self._ensure_eager()
            kw["output_attentions"] = True
        out: dict = {}
        with torch.inference_mode(), autocast(self.compute_dtype, self.device):
            if "encoder" in self.stacks and "decoder" in self.stacks:
                enc = self.model.get_encoder()(input_ids=ids, attention_mask=mask, **kw)
                out["encoder"] = (enc.hidden_states, getattr(enc, "attentions", None))
                if "decoder" in stacks:
                    dec_ids, dec_mask = self._decoder_inputs(ids, mask)
                    dec = self.model.get_decoder()(input_ids=dec_ids, attention_mask=dec_mask,
                                                   encoder_hidden_states=enc.last_hidden_state,
                                                   encoder_attention_mask=mask, use_cache=False, **kw)
                    out["decoder"] = (dec.hidden_states, getattr(dec, "attentions", None))
                    out["cross"] = getattr(dec, "cross_attentions", None)
                    out["decoder_input_ids"] = dec_ids
            else:
                body = self.model.base_model
                if self._shifted_vocabulary is not None:
                    kw["position_ids"] = separate_position_ids(ids, mask, None, self._shifted_vocabulary,
                                                               self.shifted_position_offset)
                res = body(input_ids=ids, attention_mask=mask, **kw)
                out[self.stacks[0]] = (res.hidden_states, getattr(res, "attentions", None))
        if self.compute_dtype != "fp32":  # what leaves the handle is fp32 (a no-op for fp32 tensors)
            for key in ("encoder", "decoder"):
                if key in out:
                    out[key] = tuple(None if x is None else tuple(t.float() for t in x) for x in out[key])
            if out.get("cross") is not None:
                out["cross"] = tuple(t.float() for t in out["cross"])
        return out

    def _ensure_eager(self) -> None:
        if getattr(self.config, "_attn_implementation", "eager") != "eager":
            try:
                self.model.set_attn_implementation("eager")
            except Exception as e:  # pragma: no cover - depends on the model class
                raise WorkbenchError(f"{self.path}: cannot switch to eager attention ({e}); "
                                     f"load with attentions=True") from e

    def forward(self, sentences: Sequence[Sequence[str]], stack: str | None = None, attentions: bool = False,
                truncate: bool = False) -> ForwardOutput:
        """Raw hidden states (and attentions) of one batch, all stacks unless `stack` is given.

        No windowing here: a sentence longer than `max_length` raises ValueError, or with
        `truncate=True` is cut (the tokens cut are counted in `stats["truncated_tokens"]`).
        Use `word_states` for long text."""
        if not len(sentences):
            raise ValueError("forward needs at least one sentence")
        stacks = self._stacks(stack) if stack is not None else self.stacks
        self.model.eval()
        batch = self._word_batch(sentences, self._read_prefix)
        lengths = batch.attention_mask.sum(1)
        too_long = (lengths > self.max_length).nonzero().flatten().tolist()
        if too_long:
            if not truncate:
                raise ValueError(f"sentences {too_long[:10]} exceed max_length={self.max_length} tokens; "
                                 f"use word_states (sliding windows) or truncate=True")
            batch = self._truncate(batch)
        out = self._run(batch.input_ids, batch.attention_mask, stacks, attentions)
        if self.reads_characters:
            batch.input_ids = self._characters(batch.input_ids)[0]
        word_ids = {}
        for s in stacks:
            if s == "decoder" and "encoder" in self.stacks:
                T = out["decoder_input_ids"].shape[1]
                w = torch.full((batch.word_ids.shape[0], T), -1, dtype=torch.long, device=self.device)
                w[:, 1: batch.word_ids.shape[1] + 1] = batch.word_ids[:, : T - 1]
                word_ids[s] = w
            else:
                word_ids[s] = batch.word_ids
        return ForwardOutput(
            batch=batch,
            hidden_states={s: out[s][0] for s in stacks},
            word_ids=word_ids,
            attentions={s: out[s][1] for s in stacks} if attentions else None,
            cross_attentions=out.get("cross") if attentions else None,
            decoder_input_ids=out.get("decoder_input_ids"),
        )

    def _truncate(self, batch: WordBatch) -> WordBatch:
        rows, wids = [], []
        S = len(self._suffix)
        for b in range(batch.input_ids.shape[0]):
            n = int(batch.attention_mask[b].sum())
            ids, w = batch.input_ids[b, :n].cpu().numpy(), batch.word_ids[b, :n].cpu().numpy()
            if n > self.max_length:
                self.stats["truncated_tokens"] += n - self.max_length
                keep = self.max_length - S
                ids = np.concatenate([ids[:keep], ids[n - S:]])
                w = np.concatenate([w[:keep], w[n - S:]])
            rows.append(ids)
            wids.append(w)
        ids, mask, word_ids = self._pad(rows, wids)
        return WordBatch(ids, mask, word_ids, batch.n_words)

    def _stacks(self, stack: str | None) -> tuple[str, ...]:
        if stack is None:
            return (self.stacks[0],)
        if stack not in self.stacks:
            raise ValueError(f"stack {stack!r} not in this model's stacks {self.stacks}")
        return (stack,)

    # ------------------------------------------------------------------ word states

    def word_states(self, sentences: Sequence[Sequence[str]], pooling: str = "first", stack: str | None = None,
                    batch_size: int = 32, chunk_size: int | None = None, stride: int | None = None,
                    progress: bool = False) -> Iterator[np.ndarray]:
        """Yield one float32 array [L+1, n_words, H] per sentence, in input order (a view into its
        batch's pooled array, not necessarily contiguous: copy it to keep it apart).

        Subwords are pooled to words by `pooling` ("first", "mean" or "last" piece). `stack`
        defaults to the first stack ("encoder" for encoder-decoders). Sentences are taken in chunks
        of `chunk_size` (default 8 batches), sorted by length within the chunk so that batches pad
        little, and restored to input order. A sentence longer than `max_length` is split into
        windows of `max_length` tokens (special tokens included) whose starts are `stride` content
        tokens apart (default half a window); each word is read from the window that gives it most
        context (`_choose_windows`). Counts go to `stats`: sentences, words, empty_sentences,
        windowed_sentences, windows, no_subword_words, words_cut_by_window.
        """
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        (stack,) = self._stacks(stack)
        causal = stack == "decoder"
        L, H = self.num_layers[stack], self.hidden_size
        chunk_size = chunk_size or batch_size * 8
        stride = stride or max(1, self.capacity // 2)
        self.model.eval()
        bar = None
        if progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(sentences), desc="word states", unit="sent")
        chunks = [sentences[c0: c0 + chunk_size] for c0 in range(0, len(sentences), chunk_size)]
        # The tokenizer runs one chunk ahead in a thread (the Rust encoder releases the GIL), so
        # tokenisation overlaps the forward pass instead of adding to it. It counts nothing: the
        # stats are updated here, in chunk order, as the chunk is processed.
        prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="word-states-tokenizer") if len(chunks) > 1 else None
        upcoming = None
        try:
            for k, chunk in enumerate(chunks):
                encs = upcoming.result() if upcoming is not None else self._encode(chunk, count=False)
                upcoming = prefetch.submit(self._encode, chunks[k + 1], False) if k + 1 < len(chunks) else None
                yield from self._chunk_states(chunk, encs, stack, pooling, batch_size, stride, causal, L, H)
                if bar is not None:
                    bar.update(len(chunk))
        finally:
            if prefetch is not None:
                prefetch.shutdown(wait=True, cancel_futures=True)
            if bar is not None:
                bar.close()

    def _chunk_states(self, chunk, encs, stack, pooling, batch_size, stride, causal, L, H) -> Iterator[np.ndarray]:
        """`word_states` for one chunk of already encoded sentences (`_encode(..., count=False)`)."""
        results: list[np.ndarray | None] = [None] * len(chunk)
        segments: list[_Segment] = []
        self.stats["sentences"] += len(chunk)
        self.stats["words"] += sum(e.n_words for e in encs)
        self.stats["no_subword_words"] += int(sum(int((~e.own).sum()) for e in encs))
        for i, e in enumerate(encs):
            if e.n_words == 0:
                self.stats["empty_sentences"] += 1
                results[i] = np.zeros((L + 1, 0, H), dtype=np.float32)
                continue
            n = len(e.ids)
            if n <= self.capacity:
                segments.append(_Segment(i, e.ids, np.arange(e.n_words), e.first, e.last))
                continue
            starts = plan_windows(n, self.capacity, stride)
            self.stats["windowed_sentences"] += 1
            self.stats["windows"] += len(starts)
            results[i] = np.empty((L + 1, e.n_words, H), dtype=np.float32)
            choice, cut = _choose_windows(e.first, e.last, starts, self.capacity, causal)
            self.stats["words_cut_by_window"] += int(cut.sum())
            for k, s in enumerate(starts):
                words = np.nonzero(choice == k)[0]
                if len(words):
                    f = np.clip(e.first[words] - s, 0, self.capacity - 1)
                    la = np.clip(e.last[words] - s, 0, self.capacity - 1)
                    segments.append(_Segment(i, e.ids[s: s + self.capacity], words, f, la))
        order = sorted(range(len(segments)), key=lambda j: -len(segments[j].ids))
        for b0 in range(0, len(order), batch_size):
            batch = [segments[j] for j in order[b0: b0 + batch_size]]
            pooled = self._pool_batch(batch, stack, pooling)
            o = 0
            for seg in batch:
                m = len(seg.words)
                block = pooled[:, o: o + m]
                o += m
                if results[seg.sentence] is None:  # whole sentence in one segment: a view, no copy
                    results[seg.sentence] = block
                else:
                    results[seg.sentence][:, seg.words] = block
        yield from results

    def _pool_batch(self, batch: list[_Segment], stack: str, pooling: str) -> np.ndarray:
        """Run one batch and pool subwords to words for all layers at once -> [L+1, n_words, H]."""
        rows = [np.concatenate([self._read_prefix, s.ids, self._suffix]).astype(np.int64) for s in batch]
        ids, mask = self._pad(rows)
        out = self._run(ids, mask, (stack,))
        hs = out[stack][0]
        B, T = hs[0].shape[:2]
        # content token t of row b sits at position P + t (+1 in the decoder of an encoder-decoder)
        shift = len(self._read_prefix) + (1 if (stack == "decoder" and "encoder" in self.stacks) else 0)
        row_base = np.concatenate([np.full(len(s.words), b * T + shift) for b, s in enumerate(batch)])
        first = np.concatenate([s.first for s in batch]) + row_base
        last = np.concatenate([s.last for s in batch]) + row_base
        flat = [h.reshape(B * T, -1) for h in hs]
        if pooling == "first" or pooling == "last":
            idx = torch.from_numpy(first if pooling == "first" else last).to(hs[0].device)
            pooled = torch.empty(len(flat), len(idx), flat[0].shape[-1], dtype=torch.float32, device=flat[0].device)
            for layer, h in enumerate(flat):  # straight into place (no stack copy)
                torch.index_select(h, 0, idx, out=pooled[layer])
        else:
            counts = last - first + 1
            n = len(counts)
            slot = np.repeat(np.arange(n), counts)
            tok = _ranges(first, counts)
            slot_t = torch.from_numpy(slot).to(hs[0].device)
            tok_t = torch.from_numpy(tok).to(hs[0].device)
            denom = torch.from_numpy(counts).to(hs[0].device, torch.float32)[:, None]
            pooled = torch.stack([
                torch.zeros(n, h.shape[-1], dtype=torch.float32, device=h.device)
                .index_add_(0, slot_t, h.index_select(0, tok_t).float()) / denom for h in flat])
        return pooled.float().cpu().numpy()


def _ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + c) for each (s, c), without a Python loop."""
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    return np.arange(counts.sum(), dtype=np.int64) - np.repeat(offsets, counts) + np.repeat(starts, counts)


def _first_not_none(*values):
    for v in values:
        if v is not None:
            return v
    return None
