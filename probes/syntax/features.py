"""Lazy feature views over all-layer word vectors: word and word-pair rows built per layer batch."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from probes.core import fitting
from workbench.errors import ConfigError


# --------------------------------------------------------------------------- feature views
class FeatureView(fitting.LazyFeatures):
    """Rows of a `[L, N, H]` array (a memmap) gathered on demand, optionally as pairs.

    `cols` holds one or two int arrays of word positions into N; item p is the concatenation of
    `base[:, cols[k][p]]` over k (and, with `product`, the elementwise product of the two). Read one
    layer at a time (`fitting.LazyFeatures`), so pair features of a whole treebank are never all in
    memory unless asked for, and the fitter's one float32 copy per layer group is the only copy.
    """

    def __init__(self, base, cols: Sequence[np.ndarray], product: bool = False):
        if not 1 <= len(cols) <= 2 or (product and len(cols) != 2):
            raise ConfigError("FeatureView takes one index array, or two for pairs")
        self.base = base
        self.cols = [np.asarray(c, dtype=np.int64) for c in cols]
        self.product = product
        n_parts = len(self.cols) + int(product)
        self.shape = (int(base.shape[0]), len(self.cols[0]), int(base.shape[2]) * n_parts)

    def _layer(self, layer, rows, out):
        h = int(self.base.shape[2])
        # index layer and rows together: a half-precision cache (Bfloat16Array) converts only these rows
        parts = [np.asarray(self.base[layer, c[rows]], dtype=np.float32) for c in self.cols]
        for k, part in enumerate(parts):
            out[:, k * h : (k + 1) * h] = part
        if self.product:
            np.multiply(parts[0], parts[1], out=out[:, 2 * h : 3 * h])


def sentence_rows(offsets: np.ndarray, sentence_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(word positions, new offsets) of the given sentences, concatenated in the given order."""
    offsets = np.asarray(offsets, dtype=np.int64)
    idx = np.asarray(sentence_ids, dtype=np.int64)
    lengths = offsets[idx + 1] - offsets[idx]
    new = np.zeros(len(idx) + 1, dtype=np.int64)
    np.cumsum(lengths, out=new[1:])
    if len(idx) == 0:
        return np.zeros(0, dtype=np.int64), new
    rows = np.repeat(offsets[idx] - new[:-1], lengths) + np.arange(int(new[-1]), dtype=np.int64)
    return rows, new
