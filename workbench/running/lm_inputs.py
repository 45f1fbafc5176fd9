"""The inputs of LM scoring (`workbench.running.lm_scores`): texts, cloze contexts cut at their blank and
filled with each candidate, as token rows of the handle's tokenizer, length-checked.

`LMInputs(handle)` builds them per head type: masked-LM rows with the positions to mask ("mask":
the candidate's one piece, Talmor et al. 2020; "pll": every content token, Salazar et al. 2020),
causal rows behind the start token the model's pretraining put before a document
(`workbench.running.models.causal_start_id`), seq2seq source/target rows (T5's sentinels, Raffel et al.
2020; BART's `<mask>` infilling, Lewis et al. 2020). The logit lens (`workbench.running.logit_lens`) reads
the same rows, so its last layer is the zero-shot score.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from workbench.errors import CheckpointError, ConfigError
from workbench.running.models import ModelHandle, causal_start_id, first_not_none

BLANK = "<blank>"


def filled_items(contexts: Sequence[str], candidates: Sequence[Sequence[str]]) -> list[tuple[int, str, str, str]]:
    """(context index, left, candidate, right) for every candidate of every context, in order: how
    a cloze context is cut at its one `<blank>` (anything else is a ConfigError naming the context)."""
    if len(contexts) != len(candidates):
        raise ConfigError(f"{len(contexts)} contexts but {len(candidates)} candidate lists")
    items = []
    for i, (ctx, cands) in enumerate(zip(contexts, candidates)):
        if ctx.count(BLANK) != 1:
            raise ConfigError(f"context {i} must hold exactly one {BLANK}: {ctx!r}")
        left, right = ctx.split(BLANK)
        items += [(i, left, c, right) for c in cands]
    return items


def where(handle: ModelHandle) -> str:
    """The handle's folder, or "in-memory model", for error messages."""
    return str(handle.path) if handle.path is not None else "in-memory model"


def sentinels(tokenizer) -> tuple[int, int] | None:
    """T5-style sentinel ids (`<extra_id_0>`, `<extra_id_1>`), or None."""
    vocab = tokenizer.get_vocab()
    for a, b in (("<extra_id_0>", "<extra_id_1>"), ("<sentinel_0>", "<sentinel_1>")):
        if a in vocab and b in vocab:
            return vocab[a], vocab[b]
    return None


def text_start(text: str, n: int = 40) -> str:
    """The start of a text, quoted, for error messages."""
    return repr(text if len(text) <= n else text[:n] + "...")


def pad_rows(rows: list[np.ndarray], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, attention mask) of right-padded rows on `device`."""
    T = max(1, max(len(r) for r in rows))
    ids = np.full((len(rows), T), pad_id, dtype=np.int64)
    att = np.zeros((len(rows), T), dtype=np.int64)
    for b, r in enumerate(rows):
        ids[b, : len(r)] = r
        att[b, : len(r)] = 1
    return torch.from_numpy(ids).to(device), torch.from_numpy(att).to(device)


class LMInputs:
    """Token rows for LM scoring with `handle`'s tokenizer (module docstring)."""

    def __init__(self, handle: ModelHandle):
        self.handle = handle
        self.mask_id = handle.tokenizer.mask_token_id

    def pad(self, rows: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        return pad_rows(rows, self.handle.pad_id, self.handle.device)

    def mlm_candidate_rows(self, items, answer_only: bool = False):
        """The masked-LM cloze inputs of (context index, left, candidate, right) items: (filled rows,
        positions to mask and score one at a time per row, method per row, candidate pieces per
        row). A context whose candidates are all one piece reads that piece ("mask"); one with a
        longer candidate scores every filled sentence of that context by PLL ("pll"), where a mask
        token written in the text (a content-free slot) is context, never scored: its log p would
        depend on the candidate beside it. `answer_only`: the candidate's pieces alone, each masked
        in turn ("pll-answer" when several; one piece is "mask" either way)."""
        filled = [self.encode_filled(*it) for it in items]
        single = {}
        for (i, *_), (_, _, pos) in zip(items, filled):
            single[i] = single.get(i, True) and len(pos) == 1
        scored = [pos if single[i] or answer_only else np.nonzero(~special & (ids != self.mask_id))[0]
                  for (i, *_), (ids, special, pos) in zip(items, filled)]
        multi = "pll-answer" if answer_only else "pll"
        methods = ["mask" if single[i] else multi for i, *_ in items]
        return [ids for ids, _, _ in filled], scored, methods, [len(pos) for _, _, pos in filled]

    def causal_candidate_rows(self, items):
        """The causal cloze inputs of (context index, left, candidate, right) items: (filled rows
        behind the start token, candidate pieces per row, the pieces' positions in each row). The
        raw rule scores the whole filled sentence; an answer-only rule the pieces alone."""
        filled = [self.encode_filled(*it) for it in items]
        rows = [self.causal_row(ids, special, f"context {i} filled with {cand!r}")
                for (ids, special, _), (i, _, cand, _) in zip(filled, items)]
        answer = [pos + (len(r) - len(ids)) for r, (ids, _, pos) in zip(rows, filled)]
        return rows, [len(p) for _, _, p in filled], answer

    def seq2seq_candidate_rows(self, items):
        """The seq2seq cloze inputs of (context index, left, candidate, right) items: (source rows,
        target rows, index of the first scored target token per row, candidate pieces per row,
        method, the candidate's positions in each target). T5: source with the first sentinel,
        target sentinel0 + candidate + sentinel1 (sentinel0 given, not scored); BART: source with
        one <mask>, target the filled sentence. The decoder reads `decoder_start_id` + target[:-1]
        (teacher forcing). The raw rule scores the target from its first scored token (T5: the
        closing sentinel too); an answer-only rule the candidate's positions alone."""
        h, tok = self.handle, self.handle.tokenizer
        marks = sentinels(tok)
        if marks is None and tok.mask_token is None:
            raise CheckpointError(f"{where(h)}: seq2seq tokenizer has neither sentinel tokens nor a mask token")
        src_rows, tgt_rows, first, pieces, answer = [], [], [], [], []
        for i, left, cand, right in items:
            if marks is not None:
                s0 = tok.convert_ids_to_tokens(marks[0])
                src = h.words.backend.encode(left + s0 + right).ids
                piece_ids = h.words.backend.encode(" " + cand, add_special_tokens=False).ids
                target = [marks[0], *piece_ids, marks[1]]
                first.append(1)  # sentinel0 is given, not predicted
                pieces.append(len(piece_ids))
                answer.append(np.arange(1, 1 + len(piece_ids)))
            else:
                src = h.words.backend.encode(left + tok.mask_token + right).ids
                target, _, pos = self.encode_filled(i, left, cand, right)
                first.append(0)
                pieces.append(len(pos))
                answer.append(pos)
            src_rows.append(self.check_len(np.asarray(src, dtype=np.int64), f"context {i}"))
            tgt_rows.append(self.check_len(np.asarray(target, dtype=np.int64), f"context {i} (target)"))
        method = "seq2seq-sentinel" if marks is not None else "seq2seq-infill"
        return src_rows, tgt_rows, first, pieces, method, answer

    @property
    def decoder_start_id(self) -> int:
        """The token a seq2seq decoder starts from (config.decoder_start_token_id, else pad)."""
        return first_not_none(getattr(self.handle.config, "decoder_start_token_id", None), self.handle.pad_id)

    def encode_texts(self, texts: Sequence[str], what: str):
        """[(ids, special mask)] of each text with the tokenizer's special tokens, length-checked."""
        if isinstance(texts, str):
            raise ConfigError(f"expected a list of {what}s, got one string")
        encs = self.handle.words.backend.encode_batch(list(texts), add_special_tokens=True)
        rows = []
        for i, e in enumerate(encs):
            ids = self.check_len(np.asarray(e.ids, dtype=np.int64), f"{what} {i} ({text_start(texts[i])})")
            rows.append((ids, np.asarray(e.special_tokens_mask, dtype=bool)))
        self.handle.stats["lm_texts"] += len(rows)
        return rows

    def encode_filled(self, i: int, left: str, cand: str, right: str):
        """(ids, special mask, positions of the candidate's pieces) of left + cand + right, with
        special tokens; a piece that mixes candidate and context characters is an error."""
        text = left + cand + right
        enc = self.handle.words.backend.encode(text, add_special_tokens=True)
        a, b = len(left), len(left) + len(cand)
        nonspace = np.array([not ch.isspace() for ch in text] + [True])
        nxt = np.empty(len(text) + 1, dtype=np.int64)  # next non-space position at or after p
        nxt_val = len(text)
        for p in range(len(text), -1, -1):
            if nonspace[p]:
                nxt_val = p
            nxt[p] = nxt_val
        pos = []
        for t, ((s, e), special) in enumerate(zip(enc.offsets, enc.special_tokens_mask)):
            if special:
                continue
            chars = [p for p in range(s, e) if nonspace[p]] or [nxt[s]]
            inside = [a <= p < b for p in chars]
            if all(inside):
                pos.append(t)
            elif any(inside):
                raise ConfigError(f"context {i}: candidate {cand!r} shares a token with its context in {text!r}")
        if not pos:
            raise ConfigError(f"context {i}: candidate {cand!r} has no tokens in {text!r}")
        ids = self.check_len(np.asarray(enc.ids, dtype=np.int64), f"context {i} filled with {cand!r}")
        return ids, np.asarray(enc.special_tokens_mask, dtype=bool), np.asarray(pos, dtype=np.int64)

    def causal_row(self, ids: np.ndarray, special: np.ndarray, what: str) -> np.ndarray:
        start = causal_start_id(self.handle.tokenizer)
        if start is not None and (len(ids) == 0 or not special[0]):
            ids = np.concatenate([[start], ids]).astype(np.int64)
            self.check_len(ids, f"{what} behind its start token")
        return ids

    def check_len(self, ids: np.ndarray, what: str) -> np.ndarray:
        if len(ids) > self.handle.max_length:
            raise ConfigError(f"{what}: {len(ids)} tokens exceed max_length={self.handle.max_length} of "
                              f"{where(self.handle)}")
        return ids
