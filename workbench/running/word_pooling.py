"""Hidden states of every layer pooled from subwords to words: `ModelHandle.word_states`.

Sentences are taken in chunks, sorted by length within a chunk so that batches pad little, and
given back in input order; a sentence longer than the handle's window is read in sliding windows
(`workbench.running.word_alignment.plan_windows`), each word from the window that gives it most context
(`choose_windows`). A word's vector is its first, last or mean subword's state ("first" is the
convention of Tenney et al. 2019 and Hewitt & Manning 2019; "mean" that of Liu et al. 2019).
Every function takes the `workbench.running.models.ModelHandle` whose states it pools (not imported here:
the handle imports this module).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from workbench.running.word_alignment import choose_windows, plan_windows, ranges

POOLINGS = ("first", "mean", "last")


@dataclass
class Segment:
    """One row of a batch: a sentence or one window of it, with the words read from it."""

    sentence: int
    ids: np.ndarray
    words: np.ndarray  # word indices (into the sentence) whose states come from this segment
    first: np.ndarray  # their first/last token, relative to the segment's content
    last: np.ndarray


def word_states(handle, sentences: Sequence[Sequence[str]], pooling: str, stack: str,
                batch_size: int, chunk_size: int | None, stride: int | None,
                progress: bool) -> Iterator[np.ndarray]:
    """`ModelHandle.word_states` (its docstring says what is yielded); `stack` already checked."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    chunk_size = chunk_size or batch_size * 8
    stride = stride or max(1, handle.capacity // 2)
    handle.model.eval()
    bar = None
    if progress:
        from workbench.progress import progress as progress_bar

        bar = progress_bar(total=len(sentences), desc="word states", unit="sent")
    chunks = [sentences[c0: c0 + chunk_size] for c0 in range(0, len(sentences), chunk_size)]
    # The tokenizer runs one chunk ahead in a thread (the Rust encoder releases the GIL), so
    # tokenisation overlaps the forward pass instead of adding to it. It counts nothing: the
    # stats are updated here, in chunk order, as the chunk is processed.
    prefetch = ThreadPoolExecutor(max_workers=1, thread_name_prefix="word-states-tokenizer") if len(chunks) > 1 else None
    upcoming = None
    try:
        for k, chunk in enumerate(chunks):
            encs = upcoming.result() if upcoming is not None else handle.encode_words(chunk, False)
            upcoming = prefetch.submit(handle.encode_words, chunks[k + 1], False) if k + 1 < len(chunks) else None
            yield from _chunk_states(handle, chunk, encs, stack, pooling, batch_size, stride)
            if bar is not None:
                bar.update(len(chunk))
    finally:
        if prefetch is not None:
            prefetch.shutdown(wait=True, cancel_futures=True)
        if bar is not None:
            bar.close()


def _segments(handle, encs, stack: str, stride: int, results: list) -> list[Segment]:
    """The batch rows of one chunk: whole sentences, or the windows of a long one (counted in
    `handle.stats`); an empty sentence's (empty) result is filled in here."""
    L, H, cap = handle.num_layers[stack], handle.hidden_size, handle.capacity
    segments: list[Segment] = []
    for i, e in enumerate(encs):
        if e.n_words == 0:
            handle.stats["empty_sentences"] += 1
            results[i] = np.zeros((L + 1, 0, H), dtype=np.float32)
            continue
        n = len(e.ids)
        if n <= cap:
            segments.append(Segment(i, e.ids, np.arange(e.n_words), e.first, e.last))
            continue
        starts = plan_windows(n, cap, stride)
        handle.stats["windowed_sentences"] += 1
        handle.stats["windows"] += len(starts)
        results[i] = np.empty((L + 1, e.n_words, H), dtype=np.float32)
        choice, cut = choose_windows(e.first, e.last, starts, cap, stack == "decoder")
        handle.stats["words_cut_by_window"] += int(cut.sum())
        for k, s in enumerate(starts):
            words = np.nonzero(choice == k)[0]
            if len(words):
                f = np.clip(e.first[words] - s, 0, cap - 1)
                la = np.clip(e.last[words] - s, 0, cap - 1)
                segments.append(Segment(i, e.ids[s: s + cap], words, f, la))
    return segments


def _chunk_states(handle, chunk, encs, stack, pooling, batch_size, stride) -> Iterator[np.ndarray]:
    """`word_states` for one chunk of already encoded sentences (`encode_words(..., count=False)`)."""
    results: list[np.ndarray | None] = [None] * len(chunk)
    handle.stats["sentences"] += len(chunk)
    handle.stats["words"] += sum(e.n_words for e in encs)
    handle.stats["no_subword_words"] += int(sum(int((~e.own).sum()) for e in encs))
    segments = _segments(handle, encs, stack, stride, results)
    order = sorted(range(len(segments)), key=lambda j: -len(segments[j].ids))
    for b0 in range(0, len(order), batch_size):
        batch = [segments[j] for j in order[b0: b0 + batch_size]]
        pooled = pool_batch(handle, batch, stack, pooling)
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


def pool_batch(handle, batch: list[Segment], stack: str, pooling: str) -> np.ndarray:
    """Run one batch and pool subwords to words for all layers at once -> [L+1, n_words, H]."""
    read_prefix = handle.read_prefix
    rows = [np.concatenate([read_prefix, s.ids, handle.words.suffix]).astype(np.int64) for s in batch]
    ids, mask = handle.words.pad(rows)
    out = handle.run_ids(ids, mask, (stack,))
    hs = out[stack][0]
    B, T = hs[0].shape[:2]
    # content token t of row b sits at position P + t (+1 in the decoder of an encoder-decoder)
    shift = len(read_prefix) + (1 if (stack == "decoder" and "encoder" in handle.stacks) else 0)
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
        tok = ranges(first, counts)
        slot_t = torch.from_numpy(slot).to(hs[0].device)
        tok_t = torch.from_numpy(tok).to(hs[0].device)
        denom = torch.from_numpy(counts).to(hs[0].device, torch.float32)[:, None]
        pooled = torch.stack([
            torch.zeros(n, h.shape[-1], dtype=torch.float32, device=h.device)
            .index_add_(0, slot_t, h.index_select(0, tok_t).float()) / denom for h in flat])
    return pooled.float().cpu().numpy()
