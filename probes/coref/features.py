"""Lazy feature views: mention spans and mention pairs built from word vectors on demand, one
layer batch at a time (`fitting.LazyFeatures`), so no [layers x pairs x 3d] tensor is ever held."""

from __future__ import annotations

import numpy as np

from probes.core import fitting
from probes.coref.settings import SPANS
from workbench.errors import ConfigError


# --------------------------------------------------------------------------- lazy feature views
class SpanView(fitting.LazyFeatures):
    """Mention vectors `[L, M, D]` from word vectors `[L, N, H]`: the mean over each span's words
    and/or its head word's vector (`span`). `cache=True` keeps computed layers (small eval sets)."""

    def __init__(self, base, starts, ends, heads, span: str = "mean+head", cache: bool = False):
        if span not in SPANS:
            raise ConfigError(f"span must be one of {SPANS}, got {span!r}")
        self.base, self.span, self.cache = base, span, cache
        self.starts, self.ends, self.heads = (np.asarray(a, dtype=np.int64) for a in (starts, ends, heads))
        h = int(base.shape[2])
        self.shape = (int(base.shape[0]), len(self.starts), 2 * h if span == "mean+head" else h)
        self._planes: dict[int, np.ndarray] = {}

    def plane(self, layer: int) -> np.ndarray:
        if layer in self._planes:
            return self._planes[layer]
        words = self.base[layer]
        parts = []
        if self.span in ("mean+head", "mean"):
            parts.append(_span_means(words, self.starts, self.ends))
        if self.span in ("mean+head", "head"):
            parts.append(np.asarray(words[self.heads], dtype=np.float32))
        out = np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
        if self.cache:
            self._planes[layer] = out
        return out

    def _layer(self, layer, rows, out):
        out[:] = self.plane(layer)[rows]


def _span_means(words, starts: np.ndarray, ends: np.ndarray, chunk: int = 8192) -> np.ndarray:
    """Mean of words[start..end] for every span (inclusive), in chunks of spans."""
    out = np.empty((len(starts), int(words.shape[1])), dtype=np.float32)
    for c0 in range(0, len(starts), chunk):
        s, e = starts[c0: c0 + chunk], ends[c0: c0 + chunk]
        lengths = e - s + 1
        idx = np.repeat(s - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(int(lengths.sum()))
        uniq = np.unique(idx)  # sorted: each word read once from the (memory-mapped) layer
        rows = np.asarray(words[uniq], dtype=np.float32)[np.searchsorted(uniq, idx)]
        sums = np.add.reduceat(rows, np.concatenate([[0], np.cumsum(lengths)[:-1]]), axis=0)
        out[c0: c0 + len(s)] = sums / lengths[:, None]
    return out


class PairView(fitting.LazyFeatures):
    """Pair features [a; b; a*b] `[L, P, 3D]` of mention pairs over a SpanView."""

    def __init__(self, spans: SpanView, left, right):
        self.spans = spans
        self.left, self.right = np.asarray(left, dtype=np.int64), np.asarray(right, dtype=np.int64)
        self.shape = (spans.shape[0], len(self.left), 3 * spans.shape[2])

    def _layer(self, layer, rows, out):
        plane = self.spans.plane(layer)
        a, b = plane[self.left[rows]], plane[self.right[rows]]
        d = a.shape[1]
        out[:, :d], out[:, d : 2 * d] = a, b
        np.multiply(a, b, out=out[:, 2 * d :])
