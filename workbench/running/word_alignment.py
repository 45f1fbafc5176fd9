"""Pre-split words -> subword ids with each word's token span: the tokenisation every probe reads.

`WordTokenizer` is `ModelHandle`'s tokenisation (`workbench.running.models`, whose module docstring states
the conventions): words joined into running text `" " + " ".join(words)` and tokenised in one piece,
every subword given to the word whose characters it starts in, special tokens of the tokenizer's
post-processor around every sequence, ELMo's unknown words named by spelling ids past the
vocabulary (Peters et al. 2018 read characters). `plan_windows` and `choose_windows` cut a long
sentence into sliding windows and pick, per word, the window that gives it most context.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from workbench.errors import CheckpointError, WorkbenchError
from workbench.families import ModelTypeTable


def first_not_none(*values):
    """The first value that is not None (None if all are)."""
    for v in values:
        if v is not None:
            return v
    return None


@dataclass
class WordBatch:
    """A padded batch (right padding). `word_ids[b, t]` = index of the word token t belongs to,
    -1 for special and padding tokens. Rows are NOT cut to `max_length` (see `forward`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    word_ids: torch.Tensor
    n_words: list[int] = field(default_factory=list)


@dataclass
class EncodedSentence:
    """One sentence as content tokens (no special tokens) and each word's token span."""

    ids: np.ndarray  # int64 [n_tokens]
    first: np.ndarray  # int64 [n_words] first token of each word (substitute token if none)
    last: np.ndarray  # int64 [n_words] last token of each word
    n_words: int
    own: np.ndarray  # bool [n_words]: the word has pieces of its own (False: a substitute)


def plan_windows(n_tokens: int, capacity: int, stride: int) -> list[int]:
    """Start offsets of sliding windows of `capacity` tokens, `stride` apart, the last one ending
    at the end of the sentence (so the last window may overlap its predecessor by more)."""
    if n_tokens <= capacity:
        return [0]
    starts = list(range(0, n_tokens - capacity, stride))
    if not starts or starts[-1] != n_tokens - capacity:
        starts.append(n_tokens - capacity)
    return starts


def choose_windows(first: np.ndarray, last: np.ndarray, starts: list[int], capacity: int, causal: bool):
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


def ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + c) for each (s, c), without a Python loop."""
    counts = np.asarray(counts, dtype=np.int64)
    offsets = np.cumsum(counts) - counts
    return np.arange(counts.sum(), dtype=np.int64) - np.repeat(offsets, counts) + np.repeat(starts, counts)


class WordTokenizer:
    """A fast tokenizer read word by word (module docstring): content ids and word spans, padded
    batches with word ids, ELMo's spelling ids and characters. `where` names the model in errors."""

    def __init__(self, tokenizer, config, device, where: str):
        from tokenizers import Tokenizer

        self.tokenizer = tokenizer
        self.device = device
        self.where = where
        # A private copy of the Rust tokenizer with truncation and padding off: a tokenizer saved
        # with truncation enabled must not cut sentences behind our back.
        self.backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        self.backend.no_truncation()
        self.backend.no_padding()
        self.prefix, self.suffix = self._special_template()
        # ELMo's character CNN: spellings of the unknown words seen so far, named by ids from
        # open_base on; reads_characters is False for models that read ids only.
        self.reads_characters = getattr(config, "token_encoder", "") == "char_cnn"  # ElmoConfig's setting
        self.max_chars = int(getattr(config, "max_chars", 0) or 0)
        self._spelling_ids: dict[str, int] = {}
        self._spellings: list[str] = []
        self.open_base = max(int(getattr(config, "vocab_size", 0) or 0), len(tokenizer))
        self.pad_id = first_not_none(tokenizer.pad_token_id, getattr(config, "pad_token_id", None), 0)

    def _special_template(self) -> tuple[list[int], list[int]]:
        """Special ids the post-processor puts before and after a single sequence."""
        enc = self.backend.encode(" a", add_special_tokens=True)
        mask = enc.special_tokens_mask
        content = [i for i, m in enumerate(mask) if not m]
        if not content:
            raise CheckpointError(f"{self.where}: the tokenizer turns plain text into special tokens only")
        return list(enc.ids[: content[0]]), list(enc.ids[content[-1] + 1:])

    def encode(self, sentences: Sequence[Sequence[str]]) -> list[EncodedSentence]:
        """Content tokens of each sentence and each word's token span (see `workbench.running.models`).

        Vectorised over the whole list: words and tokens of all sentences are numbered globally,
        so the character -> word and token -> word maps are a handful of numpy calls."""
        S = len(sentences)
        n_words = np.fromiter((len(ws) for ws in sentences), dtype=np.int64, count=S)
        nonempty = np.nonzero(n_words)[0]
        encs = self.backend.encode_batch([" " + " ".join(sentences[i]) for i in nonempty], add_special_tokens=False)
        unk = first_not_none(self.tokenizer.unk_token_id, self.pad_id)
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
        first, last = left - word_tok_base, right - word_tok_base
        empty = np.zeros(0, dtype=np.int64)
        out = [EncodedSentence(empty, empty, empty, 0, np.zeros(0, dtype=bool))] * S
        w0 = np.cumsum(n_words[nonempty]) - n_words[nonempty]
        for j, i in enumerate(nonempty.tolist()):
            t0, w, n = tok_base[j], w0[j], n_words[i]
            out[i] = EncodedSentence(all_ids[t0: t0 + n_tok[j]], first[w: w + n], last[w: w + n], int(n),
                                     ~missing[w: w + n])
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
                ids[t] = self.open_base + k
        return ids

    def characters(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ELMo: (ids with spelling ids turned back into [UNK], char_ids [B, T, max_chars])."""
        from workbench.families.elmo_modules import word_characters

        C = self.max_chars
        chars = torch.zeros(*ids.shape, C, dtype=torch.long, device=ids.device)
        open_ = ids >= self.open_base
        if bool(open_.any()):
            rows = [word_characters(self._spellings[k], C) for k in (ids[open_] - self.open_base).tolist()]
            chars[open_] = torch.tensor(rows, dtype=torch.long, device=ids.device)
            ids = torch.where(open_, torch.full_like(ids, self.tokenizer.unk_token_id), ids)
        return ids, chars

    def word_batch(self, sentences: Sequence[Sequence[str]], prefix: Sequence[int]) -> WordBatch:
        """Padded rows `prefix + content + suffix` with word ids; ELMo's unknown words keep their
        spelling ids (`characters` turns them back)."""
        encs = self.encode(sentences)
        rows, wids = [], []
        for e in encs:
            tok_word = np.full(len(e.ids), -1, dtype=np.int64)
            w = np.nonzero(e.own)[0]  # substitutes keep the word id of the piece they borrow
            counts = e.last[w] - e.first[w] + 1
            tok_word[ranges(e.first[w], counts)] = np.repeat(w, counts)
            rows.append(np.concatenate([prefix, e.ids, self.suffix]).astype(np.int64))
            wids.append(np.concatenate([np.full(len(prefix), -1), tok_word,
                                        np.full(len(self.suffix), -1)]).astype(np.int64))
        ids, mask, word_ids = self.pad(rows, wids)
        return WordBatch(ids, mask, word_ids, [e.n_words for e in encs])

    def pad(self, rows: list[np.ndarray], extra: list[np.ndarray] | None = None):
        """(ids, mask) of right-padded rows on the device, plus the padded `extra` (-1) if given."""
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

    def truncate(self, batch: WordBatch, max_length: int) -> tuple[WordBatch, int]:
        """Rows longer than `max_length` cut before their closing special tokens; (batch, tokens cut)."""
        rows, wids = [], []
        S = len(self.suffix)
        cut = 0
        for b in range(batch.input_ids.shape[0]):
            n = int(batch.attention_mask[b].sum())
            ids, w = batch.input_ids[b, :n].cpu().numpy(), batch.word_ids[b, :n].cpu().numpy()
            if n > max_length:
                cut += n - max_length
                keep = max_length - S
                ids = np.concatenate([ids[:keep], ids[n - S:]])
                w = np.concatenate([w[:keep], w[n - S:]])
            rows.append(ids)
            wids.append(w)
        ids, mask, word_ids = self.pad(rows, wids)
        return WordBatch(ids, mask, word_ids, batch.n_words), cut


# Models whose learned positions are offset by padding_idx + 1 (RoBERTa's create_position_ids): the
# families' (`FamilySpec.padding_offset_positions`) and foreign ones
_PADDING_OFFSET_POSITIONS = ModelTypeTable(dict.fromkeys(("xlm-roberta", "camembert", "longformer", "data2vec-text"), True),
                                           lambda spec: True if spec.padding_offset_positions else None, primary=False)
# No limit in config or tokenizer (T5's relative positions, ELMo's LSTMs): windows of this size.
DEFAULT_MAX_LENGTH = 512
# HF tokenizers without a real limit store a huge placeholder (1e30; the workbench's own: 1e6).
_NO_LIMIT = 1_000_000


def model_max_length(config, tokenizer) -> int:
    """The longest sequence a model reads: its position limit (RoBERTa-style positions less the
    padding offset), lowered to the tokenizer's `model_max_length` where that is a real limit;
    `DEFAULT_MAX_LENGTH` when neither says."""
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if limit is not None and getattr(config, "model_type", "") in _PADDING_OFFSET_POSITIONS:
        limit -= (getattr(config, "pad_token_id", None) or 0) + 1
    tok_limit = getattr(tokenizer, "model_max_length", None)
    if tok_limit is not None and tok_limit < _NO_LIMIT:
        # Positions past the length the model was trained at are untrained: respect the lower.
        limit = min(limit, tok_limit) if limit is not None else tok_limit
    return int(limit) if limit is not None else DEFAULT_MAX_LENGTH


def decoder_inputs(ids: torch.Tensor, mask: torch.Tensor, start: int, pad_id: int,
                   grows: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced decoder input for an encoder-decoder: the encoder input used as labels,
    shifted right behind `start` (`decoder_start_token_id`, HF `shift_tokens_right`): position t+1
    of the decoder reads token t, so it has seen tokens <= t of the sentence (and the whole
    encoder input through cross-attention). When the tokenizer adds a closing special token, it is
    the one dropped by the shift; otherwise (`grows`) the sequence grows by one position."""
    B = ids.shape[0]
    lengths = mask.sum(1)
    T = ids.shape[1] + (1 if grows else 0)
    dec = torch.full((B, T), pad_id, dtype=ids.dtype, device=ids.device)
    dec[:, 0] = start
    dec[:, 1: ids.shape[1] + 1] = ids[:, : T - 1]
    dec_len = lengths + (1 if grows else 0)
    dec_mask = (torch.arange(T, device=ids.device)[None, :] < dec_len[:, None]).long()
    dec = torch.where(dec_mask.bool(), dec, torch.full_like(dec, pad_id))
    return dec, dec_mask
