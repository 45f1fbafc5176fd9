"""Verbatim search: which k-token windows of a text occur in a training token stream.

Extraction studies (Carlini et al. 2021; 2022) call a generation memorised when a long span of it
occurs verbatim in the training data. The index here scales to the multi-million-token corpora of
the workbench without a suffix array: every k-token window of the stream is hashed to 64 bits
(a polynomial hash over a random 64-bit code per token id, arithmetic mod 2**64 in numpy), the hashes
are sorted once, and a query window is found by `np.searchsorted`. A hash hit is then verified
against the stream itself (the window at the hit's position is compared token by token), so a
64-bit collision can never be reported as a match: the search has no false positives, and no
false negatives (every window of the stream is in the index). 8 bytes per token for the hashes
and 8 for their positions: a 3M-token corpus takes 48 MB and 6 s to build, 1,000 queries of 96 tokens
take 1 s (measured on a busy 2-core machine).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_BASE = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier (the golden-ratio constant)


def window_hashes(ids: np.ndarray, k: int, codes: np.ndarray) -> np.ndarray:
    """uint64 hash of every k-token window of `ids` (len(ids) - k + 1 of them; none if shorter)."""
    ids = np.asarray(ids, dtype=np.int64)
    n = len(ids) - k + 1
    if n <= 0:
        return np.zeros(0, dtype=np.uint64)
    c = codes[ids]
    h = np.zeros(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(k):
            h = h * _BASE + c[j: j + n]
    return h


@dataclass
class NgramIndex:
    """Sorted hashes of every k-token window of `stream`, and where each window starts."""

    k: int
    stream: np.ndarray
    hashes: np.ndarray
    starts: np.ndarray
    codes: np.ndarray

    @classmethod
    def build(cls, stream: np.ndarray, k: int, seed: int = 0) -> "NgramIndex":
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        stream = np.asarray(stream, dtype=np.int64)
        vocab = int(stream.max()) + 1 if len(stream) else 1
        codes = np.random.default_rng([seed, 0x5EA2C4]).integers(0, 2 ** 63, size=vocab, dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
        h = window_hashes(stream, k, codes)
        order = np.argsort(h, kind="stable")
        return cls(k, stream, h[order], order.astype(np.int64), codes)

    def _codes_for(self, ids: np.ndarray) -> np.ndarray:
        """Token codes, ids outside the stream's vocabulary get a code (their windows cannot match)."""
        if len(ids) and int(ids.max()) >= len(self.codes):
            extra = np.random.default_rng([0xBAD, len(self.codes)]).integers(
                0, 2 ** 63, size=int(ids.max()) + 1 - len(self.codes), dtype=np.int64).astype(np.uint64)
            return np.concatenate([self.codes, extra])
        return self.codes

    def window_hits(self, ids: np.ndarray) -> np.ndarray:
        """bool per k-token window of `ids`: does it occur verbatim in the stream (verified)."""
        ids = np.asarray(ids, dtype=np.int64)
        q = window_hashes(ids, self.k, self._codes_for(ids))
        lo = np.searchsorted(self.hashes, q, side="left")
        hi = np.searchsorted(self.hashes, q, side="right")
        hit = np.zeros(len(q), dtype=bool)
        for w in np.nonzero(hi > lo)[0]:
            want = ids[w: w + self.k]
            for s in self.starts[lo[w]: hi[w]]:
                if np.array_equal(self.stream[s: s + self.k], want):
                    hit[w] = True
                    break
        return hit

    def occurrences(self, window: np.ndarray) -> int:
        """How many times one k-token window occurs in the stream (verified)."""
        window = np.asarray(window, dtype=np.int64)
        if len(window) != self.k:
            raise ValueError(f"a window has {self.k} tokens, got {len(window)}")
        q = window_hashes(window, self.k, self._codes_for(window))[0]
        lo, hi = np.searchsorted(self.hashes, q, side="left"), np.searchsorted(self.hashes, q, side="right")
        return int(sum(np.array_equal(self.stream[s: s + self.k], window) for s in self.starts[lo:hi]))

    def match(self, ids: np.ndarray) -> "Match":
        """What of `ids` is verbatim training text: windows hit, tokens covered, the longest run."""
        hits = self.window_hits(ids)
        covered = np.zeros(len(ids), dtype=bool)
        for w in np.nonzero(hits)[0]:
            covered[w: w + self.k] = True
        longest = run = 0
        for c in covered:
            run = run + 1 if c else 0
            longest = max(longest, run)
        return Match(bool(hits.any()), int(hits.sum()), float(covered.mean()) if len(ids) else 0.0, longest)


@dataclass(frozen=True)
class Match:
    memorised: bool  # some k-token window occurs in the training stream
    windows: int  # how many windows do
    covered: float  # fraction of tokens inside a matching window
    longest: int  # tokens in the longest run covered by matching windows
