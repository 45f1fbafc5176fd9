"""The verbatim index (`workbench.verbatim`) against a brute-force search, with planted spans."""

from __future__ import annotations

import numpy as np

from workbench.verbatim import NgramIndex, window_hashes


def _brute(stream, ids, k):
    grams = {tuple(stream[i: i + k]) for i in range(len(stream) - k + 1)}
    return np.array([tuple(ids[i: i + k]) in grams for i in range(len(ids) - k + 1)], dtype=bool)


def test_agrees_with_brute_force_on_random_data():
    rng = np.random.default_rng(0)
    stream = rng.integers(0, 6, 5000)  # a tiny vocabulary: short windows repeat by chance
    index = NgramIndex.build(stream, k=4)
    for _ in range(20):
        q = rng.integers(0, 6, 60)
        np.testing.assert_array_equal(index.window_hits(q), _brute(stream, q, 4))


def test_finds_planted_spans_and_no_false_ones():
    rng = np.random.default_rng(1)
    stream = rng.integers(0, 5000, 200_000)
    index = NgramIndex.build(stream, k=16)
    planted = stream[123_456: 123_456 + 40]
    q = np.concatenate([rng.integers(0, 5000, 30), planted, rng.integers(0, 5000, 30)])
    hits = index.window_hits(q)
    assert hits.sum() == 40 - 16 + 1 and np.all(hits[30: 30 + 25])  # every window inside the planted span
    m = index.match(q)
    assert m.memorised and m.longest == 40 and m.windows == 25
    assert not index.match(rng.integers(0, 5000, 100)).memorised  # fresh random text: nothing
    assert index.occurrences(planted[:16]) == 1


def test_a_hash_collision_is_not_a_match():
    stream = np.arange(100) % 7
    index = NgramIndex.build(stream, k=3)
    window = np.array([6, 6, 6])  # never in the stream
    index.hashes[:] = window_hashes(window, 3, index.codes)[0]  # force every hash to collide with it
    assert not index.window_hits(window).any() and index.occurrences(window) == 0


def test_counts_repeated_windows_and_tokens_beyond_the_vocabulary():
    stream = np.array([1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3])
    index = NgramIndex.build(stream, k=3)
    assert index.occurrences(np.array([1, 2, 3])) == 3
    assert not index.window_hits(np.array([1, 2, 3000])).any()
