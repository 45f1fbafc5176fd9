"""Activation extraction and cache: round trip, no second forward, keys, crash/resume, bounded writes."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pytest

from workbench.activations import Activations, cache_path, extract
from workbench.errors import CheckpointError, ConfigError


class FakeHandle:
    """Duck-typed ModelHandle whose word vectors are a deterministic function of (word, position, layer).

    Counts handle calls and sentences seen, and bumps `stats` like the real handle does.
    """

    def __init__(self, num_layers=3, hidden=8, checkpoint_hash="ckpt-a", fail_after_calls=None):
        self.stacks = ("encoder",)
        self.num_layers = {"encoder": num_layers}
        self.hidden_size = hidden
        self.checkpoint_hash = checkpoint_hash
        self.family = "fake"
        self.stats = Counter()
        self.calls = 0
        self.batches: list[list[int]] = []
        self.fail_after_calls = fail_after_calls

    def vector(self, word, pos, pooling):
        seed = int.from_bytes(hashlib.sha256(f"{self.checkpoint_hash}|{word}|{pooling}".encode()).digest()[:4], "little")
        base = np.random.default_rng(seed).standard_normal(self.hidden_size).astype(np.float32)
        layers = np.arange(self.num_layers["encoder"] + 1, dtype=np.float32)[:, None]
        return base[None, :] * (1.0 + layers) + 0.01 * pos

    def word_states(self, sentences, pooling="first", stack=None, batch_size=32, chunk_size=None):
        """Like ModelHandle.word_states: lazily, one chunk (one 'forward', counted in `calls`) at a time."""
        chunk_size = chunk_size or batch_size * 8
        for c0 in range(0, len(sentences), chunk_size):
            chunk = sentences[c0 : c0 + chunk_size]
            self.calls += 1
            if self.fail_after_calls is not None and self.calls > self.fail_after_calls:
                raise RuntimeError("simulated crash")
            self.batches.append([len(s) for s in chunk])
            out = []
            for words in chunk:
                if not words:
                    self.stats["empty_sentences"] += 1
                    out.append(np.zeros((self.num_layers["encoder"] + 1, 0, self.hidden_size), np.float32))
                    continue
                self.stats["sentences"] += 1
                out.append(np.stack([self.vector(w, i, pooling) for i, w in enumerate(words)], axis=1))
            yield from out


def _corpus(n=57, seed=0):
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(40)]
    sents = [[vocab[j] for j in rng.integers(0, len(vocab), rng.integers(1, 12))] for _ in range(n)]
    sents[5] = []  # an empty sentence is kept (n_words = 0) and counted
    return sents


def _reference(handle, sentences, pooling="first"):
    return [a for a in FakeHandle(handle.num_layers["encoder"], handle.hidden_size, handle.checkpoint_hash).word_states(sentences, pooling)]


def test_round_trip_and_second_call_runs_no_model(tmp_path):
    sents = _corpus()
    h = FakeHandle()
    acts = extract(h, sents, "toy/train", batch_size=8, cache_dir=tmp_path, progress=False)
    assert h.calls == int(np.ceil(len(sents) / 8))  # one handle call per batch
    assert acts.layers.shape == (4, sum(map(len, sents)), 8)
    assert acts.layers.dtype == np.float32 and isinstance(acts.layers, np.memmap)
    assert acts.num_sentences == len(sents) and acts.sentence_offsets[-1] == acts.num_words
    for i, ref in enumerate(_reference(h, sents)):
        np.testing.assert_array_equal(acts.sentence(i), ref)
    # batches sorted by length: longest first, non-increasing across the whole run
    seen = [n for b in h.batches for n in b]
    assert seen == sorted(seen, reverse=True)
    # handle stats recorded in the cache metadata
    assert acts.stats == {"empty_sentences": 1, "sentences": len(sents) - 1}
    meta = json.loads((acts.path / "meta.json").read_text())
    assert meta["stats"]["empty_sentences"] == 1 and meta["pooling"] == "first"

    h2 = FakeHandle()
    again = extract(h2, sents, "toy/train", batch_size=8, cache_dir=tmp_path, progress=False)
    assert h2.calls == 0  # loaded from the cache: no forward at all
    assert again.path == acts.path
    np.testing.assert_array_equal(np.asarray(again.layers), np.asarray(acts.layers))
    assert again.stats == acts.stats


def test_keys_differ_by_pooling_checkpoint_dataset_and_words(tmp_path):
    sents = _corpus()
    h = FakeHandle()
    p = cache_path(h, sents, "toy", "first", cache_dir=tmp_path)
    assert p != cache_path(h, sents, "toy", "mean", cache_dir=tmp_path)
    assert p != cache_path(FakeHandle(checkpoint_hash="ckpt-b"), sents, "toy", "first", cache_dir=tmp_path)
    assert p != cache_path(h, sents, "toy2", "first", cache_dir=tmp_path)
    assert p != cache_path(h, sents[:-1], "toy", "first", cache_dir=tmp_path)
    assert p != cache_path(h, sents, "toy", "first", dtype="float16", cache_dir=tmp_path)
    a = extract(h, sents, "toy", pooling="first", cache_dir=tmp_path, progress=False)
    b = extract(h, sents, "toy", pooling="mean", cache_dir=tmp_path, progress=False)
    assert a.path != b.path and h.calls == 2 * int(np.ceil(len(sents) / 32))
    assert not np.array_equal(np.asarray(a.layers), np.asarray(b.layers))


def test_crash_leaves_no_cache_and_resume_finishes_the_rest(tmp_path):
    sents = _corpus(n=60)
    crashing = FakeHandle(fail_after_calls=3)
    with pytest.raises(RuntimeError, match="simulated crash"):
        extract(crashing, sents, "toy", batch_size=10, cache_dir=tmp_path, progress=False, checkpoint_every_s=0)
    final = cache_path(crashing, sents, "toy", cache_dir=tmp_path)
    assert not final.exists()  # nothing half-written is visible
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".partial")]

    h = FakeHandle()
    acts = extract(h, sents, "toy", batch_size=10, cache_dir=tmp_path, progress=False, checkpoint_every_s=0)
    assert h.calls == 6 - 3  # resumed after the 3 recorded batches
    for i, ref in enumerate(_reference(h, sents)):
        np.testing.assert_array_equal(acts.sentence(i), ref)
    assert acts.stats["sentences"] + acts.stats["empty_sentences"] == len(sents)  # stats survive the resume
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]

    # a partial folder from a different plan (other batch size) is discarded, not mixed in
    crashing = FakeHandle(fail_after_calls=2)
    with pytest.raises(RuntimeError):
        extract(crashing, sents, "other", batch_size=10, cache_dir=tmp_path, progress=False, checkpoint_every_s=0)
    h = FakeHandle()
    acts = extract(h, sents, "other", batch_size=7, cache_dir=tmp_path, progress=False, checkpoint_every_s=0)
    assert h.calls == int(np.ceil(60 / 7))
    for i, ref in enumerate(_reference(h, sents)):
        np.testing.assert_array_equal(acts.sentence(i), ref)


def test_float16_option_and_helpers(tmp_path):
    sents = _corpus()
    h = FakeHandle()
    acts = extract(h, sents, "toy", dtype="float16", cache_dir=tmp_path, progress=False)
    assert acts.layers.dtype == np.float16
    ref = np.concatenate(_reference(h, sents), axis=1)
    np.testing.assert_allclose(np.asarray(acts.layers, dtype=np.float32), ref, rtol=1e-3, atol=1e-3)
    sid = acts.sentence_ids()
    assert sid.shape == (acts.num_words,) and np.all(np.diff(sid) >= 0)
    idx = acts.word_index([3, 1])
    expected = np.r_[acts.sentence_offsets[3] : acts.sentence_offsets[4], acts.sentence_offsets[1] : acts.sentence_offsets[2]]
    np.testing.assert_array_equal(idx, expected)
    reopened = Activations.load(acts.path)
    assert reopened.layers.shape == acts.layers.shape


def test_bad_handle_output_and_bad_arguments(tmp_path):
    class Wrong(FakeHandle):
        def word_states(self, sentences, pooling="first", stack=None, batch_size=32, chunk_size=None):
            for words in sentences:
                yield np.zeros((self.num_layers["encoder"], len(words), self.hidden_size), np.float32)  # L, not L+1

    with pytest.raises(CheckpointError, match="expected"):
        extract(Wrong(), _corpus(), "toy", cache_dir=tmp_path, progress=False)
    with pytest.raises(ConfigError, match="pooling"):
        extract(FakeHandle(), _corpus(), "toy", pooling="max", cache_dir=tmp_path, progress=False)
    with pytest.raises(ConfigError, match="stack"):
        extract(FakeHandle(), _corpus(), "toy", stack="decoder", cache_dir=tmp_path, progress=False)
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]


# ---------------------------------------------------------------- integration: a real tiny BERT


@pytest.fixture(scope="module")
def bert_handle():
    """ModelHandle over a seeded random 2-layer BERT (hidden 32) with a WordPiece tokenizer trained
    on the first 2,000 EWT train sentences."""
    from tests.conftest import TOKENIZER_SPECS, tiny_bert
    from workbench.data.conllu import load_treebank
    from workbench.running.models import ModelHandle
    from workbench.tokenization import build_tokenizer

    train = load_treebank("en_ewt", "train")
    tok = build_tokenizer(*TOKENIZER_SPECS["bert"], [s.text for s in train[:2000]], vocab_size=800)
    return ModelHandle(tiny_bert(tok, max_positions=64), tok), [s.words for s in load_treebank("en_ewt", "dev")[:60]]


def _count_forwards(handle):
    """Count forward passes of the model body (what the handle runs) with a pre-hook."""
    calls = {"n": 0}

    def hook(module, args, kwargs):
        calls["n"] += 1

    return calls, handle.model.base_model.register_forward_pre_hook(hook, with_kwargs=True)


def test_real_handle_round_trip_cache_and_stats(tmp_path, bert_handle):
    handle, sents = bert_handle
    sents = sents[:40] + [[]] + [sents[40] * 4]  # an empty sentence and an overlong one (windowed)
    calls, hook = _count_forwards(handle)
    try:
        acts = extract(handle, sents, "ewt/dev[:42]", pooling="mean", batch_size=16, cache_dir=tmp_path, progress=False)
        assert calls["n"] >= int(np.ceil(len(sents) / 16))
        assert acts.layers.shape == (3, sum(map(len, sents)), 32)
        before = Counter(handle.stats)
        direct = list(handle.word_states(sents, pooling="mean"))
        for i, ref in enumerate(direct):
            np.testing.assert_allclose(acts.sentence(i), ref, rtol=1e-5, atol=1e-5)
        assert acts.stats == dict(Counter(handle.stats) - before)  # exactly what the handle counted
        assert acts.stats["empty_sentences"] == 1 and acts.stats["windowed_sentences"] >= 1
        assert acts.stats["sentences"] == len(sents)
        meta = json.loads((acts.path / "meta.json").read_text())
        assert meta["checkpoint_hash"] == handle.checkpoint_hash and meta["stats"] == acts.stats

        calls["n"] = 0
        again = extract(handle, sents, "ewt/dev[:42]", pooling="mean", batch_size=16, cache_dir=tmp_path, progress=False)
        assert calls["n"] == 0 and again.path == acts.path
        first = extract(handle, sents, "ewt/dev[:42]", pooling="first", batch_size=16, cache_dir=tmp_path, progress=False)
        assert calls["n"] > 0 and first.path != acts.path
        # first-piece and mean pooling agree exactly on single-piece words only
        assert not np.allclose(np.asarray(first.layers), np.asarray(acts.layers))
    finally:
        hook.remove()


def test_same_weights_with_another_tokenizer_get_another_cache_entry(tmp_path, bert_handle):
    """The weight hash alone would hand vectors made through tokenizer A to a run using tokenizer B."""
    from tests.conftest import TOKENIZER_SPECS
    from workbench.data.conllu import load_treebank
    from workbench.running.models import ModelHandle
    from workbench.tokenization import build_tokenizer

    handle, sents = bert_handle
    train = load_treebank("en_ewt", "train")
    other_tok = build_tokenizer(*TOKENIZER_SPECS["bert"], [s.text for s in train[2000:4000]], vocab_size=800)
    other = ModelHandle(handle.model, other_tok)
    assert other.checkpoint_hash == handle.checkpoint_hash
    assert cache_path(other, sents, "ewt", cache_dir=tmp_path) != cache_path(handle, sents, "ewt", cache_dir=tmp_path)
    a = extract(handle, sents[:5], "ewt", cache_dir=tmp_path, progress=False)
    b = extract(other, sents[:5], "ewt", cache_dir=tmp_path, progress=False)
    assert a.path != b.path and not np.allclose(a.layers, b.layers)


def test_window_length_is_part_of_the_cache_key(tmp_path):
    """The same weights read in windows of another length give other vectors for long sentences:
    the window belongs in the key, so a handle opened with another max_length never reuses them."""
    sents = _corpus()
    short, long_ = FakeHandle(), FakeHandle()
    short.max_length, long_.max_length = 64, 128
    keys = {cache_path(h, sents, "toy", cache_dir=tmp_path) for h in (short, long_, FakeHandle())}
    assert len(keys) == 3
    long_again = FakeHandle()
    long_again.max_length = 128
    assert cache_path(long_again, sents, "toy", cache_dir=tmp_path) == cache_path(long_, sents, "toy", cache_dir=tmp_path)


def test_prune_removes_least_recently_used_first_and_skips_entries_being_written(tmp_path, monkeypatch):
    """LRU pruning: loading an entry makes it recent; pruning to a size removes the oldest-used
    entries until the rest fits; an entry whose lock another writer holds is never removed; the
    env cap prunes after every extraction but keeps the entry just made."""
    import fcntl
    import os
    import time

    from workbench.activations import MAX_SIZE_ENV, cache_entries, parse_size, prune_cache

    h = FakeHandle(hidden=64)
    corpora = {k: _corpus(n=300, seed=k) for k in range(3)}
    paths = {k: extract(h, c, f"toy{k}", cache_dir=tmp_path, progress=False).path for k, c in corpora.items()}
    sizes = {e.path: e.bytes for e in cache_entries(tmp_path)}
    assert len(sizes) == 3 and all(b > 100_000 for b in sizes.values())  # real blocks, not sparse zeros
    past = time.time() - 3600
    for k, t in ((0, past - 60), (1, past), (2, past - 30)):  # use order: 0 oldest, then 2, then 1
        os.utime(paths[k] / "last_used", (t, t))
    extract(h, corpora[0], "toy0", cache_dir=tmp_path, progress=False)  # a cache hit: 0 is now the newest
    assert [e.path for e in cache_entries(tmp_path)] == [paths[2], paths[1], paths[0]]

    # room for two entries: the least recently used (2) goes, dry run first
    limit = sizes[paths[0]] + sizes[paths[1]] + 1000
    assert [e.path for e in prune_cache(limit, cache_dir=tmp_path, dry_run=True)] == [paths[2]]
    assert paths[2].is_dir()
    # an entry whose lock is held (an extraction in progress) is skipped: the next one goes instead
    with open(tmp_path / f".{paths[2].name}.lock", "a+") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        assert [e.path for e in prune_cache(limit, cache_dir=tmp_path)] == [paths[1]]
    assert paths[2].is_dir() and paths[0].is_dir() and not paths[1].exists()
    assert [e.path for e in prune_cache(older_than_s=1800, cache_dir=tmp_path)] == [paths[2]]  # unused for an hour
    assert paths[0].is_dir()

    # the env cap: a new extraction prunes everything else that does not fit, never itself
    monkeypatch.setenv(MAX_SIZE_ENV, str(sizes[paths[0]] + 1000))
    new = extract(h, corpora[2], "toy2-again", cache_dir=tmp_path, progress=False).path
    assert [e.path for e in cache_entries(tmp_path)] == [new]
    assert parse_size("40G") == 40 * 2**30 and parse_size("1.5M") == int(1.5 * 2**20) and parse_size("123") == 123
    with pytest.raises(ConfigError, match="size"):
        parse_size("lots")


def test_cache_cli_lists_and_prunes(tmp_path, capsys):
    from app.cli import main

    h = FakeHandle(hidden=64)
    extract(h, _corpus(n=200), "toy-cli", cache_dir=tmp_path, progress=False)
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "toy-cli" in out and "1 entries" in out
    assert main(["cache", "prune", "--cache-dir", str(tmp_path), "--max-size", "0"]) == 0
    assert "removed 1 entries" in capsys.readouterr().out
    assert main(["cache", "list", "--cache-dir", str(tmp_path)]) == 0 and "0 entries" in capsys.readouterr().out
    assert main(["cache", "prune", "--cache-dir", str(tmp_path)]) == 2  # says what to give


def test_heap_trimmer_trims_only_on_growth_and_at_most_every_min_interval(monkeypatch):
    """The writer thread's heap trim: none while RSS stays within the slack of its reference, then at
    most one per `min_interval` batches while it keeps growing; the reference is re-read after each."""
    import workbench.activations as A

    rss, trims = [0], []
    monkeypatch.setattr(A, "_resident_bytes", lambda: rss[0])
    monkeypatch.setattr(A, "_MALLOC_TRIM", lambda pad: trims.append(rss[0]))
    trimmer = A._HeapTrimmer(slack_bytes=100, min_interval=3)

    def feed(values):
        for value in values:
            rss[0] = value
            trimmer()

    feed([1000, 1050, 1100, 1000, 1090])  # reference 1000; never past 1100: no trim
    assert trims == []
    feed([1101])  # past reference + slack, 6 calls since the start
    assert trims == [1101]
    feed([700, 790])  # the first call after a trim sets the reference (700); 790 is within the slack
    assert trims == [1101]
    feed([900])  # past 800, and 3 calls since the trim
    assert trims == [1101, 900]
    feed([5000] * 9)  # new reference 5000, flat: no trim
    assert trims == [1101, 900]
    feed(range(6000, 15000, 1000))  # growing every call: trims at its 1st, 4th, 7th call (3 apart)
    assert trims == [1101, 900, 6000, 9000, 12000] and trimmer.trims == 5
