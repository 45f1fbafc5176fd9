"""Sequence-length warm-up (`seq_len_warmup`, Li, Zhang & He 2022): the length schedule by hand,
truncated batches keep their special tokens and mask only kept tokens, the loop trains (and counts)
start-length sequences first and max_len ones from `steps` on, held-out loss stays at max_len,
unsupported families are refused, and configs without the key keep their training hash.
(Exact resume with the warm-up: tests/test_train_resume.py.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.config import load_train_config
from workbench.errors import ConfigError
from workbench.families import FAMILIES, get_family
from workbench.drivers.train import DataPosition, Dist, prepare_data, read_log, train_from_config

from tests.training_helpers import tiny_config


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("BERTOLOGY_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("BERTOLOGY_RUNS", str(tmp_path_factory.mktemp("runs")))
    yield
    mp.undo()


def _cfg(start, steps, max_len, **kw):
    return load_train_config({"family": "bert", "steps": 10, "max_len": max_len,
                        "seq_len_warmup": {"start": start, "steps": steps}, **kw})


def test_schedule_by_hand():
    cfg = _cfg(16, 500, 128)
    # 16 + 112 * t / 500, floored to a multiple of 8, never below 16; 128 from step 500 on
    assert cfg.seq_len_at(0) == 16
    assert cfg.seq_len_at(35) == 16  # 16 + 7.84 -> 23 -> 16
    assert cfg.seq_len_at(36) == 24  # 16 + 8.06 -> 24
    assert cfg.seq_len_at(250) == 72  # midpoint: (16 + 128) / 2
    assert cfg.seq_len_at(499) == 120  # 127 -> 120
    assert cfg.seq_len_at(500) == cfg.seq_len_at(10_000) == 128
    odd = _cfg(12, 10, 100)  # not multiples of 8: 12 + 88 t / 10 = 12, 20.8, 29.6, 38.4, 47.2, 56, ...
    assert [odd.seq_len_at(t) for t in range(12)] == [12, 16, 24, 32, 40, 56, 64, 72, 80, 88, 100, 100]
    off = load_train_config({"family": "bert", "steps": 10, "max_len": 100})
    assert off.seq_len_warmup is None and {off.seq_len_at(t) for t in (0, 5, 99)} == {100}


@pytest.mark.parametrize("warmup, message", [
    ({"start": 4, "steps": 10}, r"seq_len_warmup\.start: must be in \[8, max_len=64\], got 4"),
    ({"start": 72, "steps": 10}, r"seq_len_warmup\.start: must be in \[8, max_len=64\], got 72"),
    ({"start": 16, "steps": 0}, r"seq_len_warmup\.steps: must be >= 1"),
    ({"start": 16}, r"seq_len_warmup\.steps: required key is missing"),
    ({"start": 16, "steps": 5, "end": 3}, r"unknown key\(s\) \['seq_len_warmup\.end'\]"),
])  # fmt: skip
def test_config_errors(warmup, message):
    with pytest.raises(ConfigError, match=message):
        load_train_config({"family": "gpt", "steps": 10, "max_len": 64, "seq_len_warmup": warmup})


def test_training_hash_unchanged_without_the_key():
    base = {"family": "bert", "preset": "small", "steps": 1200, "batch_size": 16, "lr": 1e-3, "warmup": 100,
            "objective": {"nsp": False}, "corpus": {"sources": ["brown"]}, "dropout_masks": "bernoulli"}
    # computed by the code before seq_len_warmup existed (git 8e3c76e): existing run folders stay valid
    # (bernoulli: that code's dropout masks, workbench/config.py `dropout_masks`)
    assert load_train_config(base).training_hash() == "724a82e79148a605"
    assert load_train_config({**base, "seq_len_warmup": None}).training_hash() == "724a82e79148a605"
    on = load_train_config(base, {"seq_len_warmup.start": 16, "seq_len_warmup.steps": 500})
    other = load_train_config(base, {"seq_len_warmup": {"start": 16, "steps": 400}})
    assert len({on.training_hash(), other.training_hash(), "724a82e79148a605"}) == 3


def test_supported_families_and_refusals(cache, tmp_path):
    supported = {f for f in FAMILIES if get_family(f).truncate_example is not None}
    assert supported == {"bert", "roberta", "spanbert", "albert", "electra", "deberta", "gpt", "distilbert"}
    for family in ("t5", "bart", "elmo"):
        cfg = tiny_config(family, 2, tmp_path / family, seq_len_warmup={"start": 16, "steps": 1})
        with pytest.raises(ConfigError, match=f"seq_len_warmup: family {family} does not support it"):
            train_from_config(cfg)
        assert not (tmp_path / family).exists()  # refused before anything was built or written


def _stream(cfg, family, data, n):
    pos = DataPosition(family, data.train, cfg, cfg.seeds[0], Dist())
    return [pos.next() for _ in range(n)]


@pytest.mark.slow
def test_bert_pairs_truncated_keep_specials_and_mask_inside(cache, tmp_path):
    cfg = tiny_config("bert", 4, tmp_path, max_len=64, batch_size=16, seq_len_warmup={"start": 16, "steps": 3})
    family = get_family("bert")
    data = prepare_data(cfg, family)
    tok = data.tokenizer
    (examples,) = _stream(cfg, family, data, 1)
    g = torch.Generator().manual_seed(0)
    cut = [family.truncate_example(ex, 16, tok, g) for ex in examples]
    assert max(len(ex["a"]) + len(ex["b"]) for ex in examples) > 13  # the cut matters
    for ex, c in zip(examples, cut):
        a, b = list(ex["a"]), list(ex["b"])
        assert 1 <= len(c["a"]) and 1 <= len(c["b"]) and len(c["a"]) + len(c["b"]) == min(13, len(a) + len(b))
        # each segment keeps a contiguous piece of itself (BERT's truncate_seq_pair: front or back)
        assert any(a[i : i + len(c["a"])] == c["a"] for i in range(len(a) - len(c["a"]) + 1))
        assert any(b[i : i + len(c["b"])] == c["b"] for i in range(len(b) - len(c["b"]) + 1))
        assert c["label"] == ex["label"]
    collate = family.make_collator({**family.objective, **cfg.objective, "max_len": cfg.max_len}, tok)
    batch = collate(cut, torch.Generator().manual_seed(1))
    ids, att, types, labels = batch["input_ids"], batch["attention_mask"], batch["token_type_ids"], batch["labels"]
    assert ids.shape == (16, 16)
    for i, c in enumerate(cut):
        n = 3 + len(c["a"]) + len(c["b"])
        assert att[i].tolist() == [1] * n + [0] * (16 - n)
        orig = torch.where(labels[i] >= 0, labels[i], ids[i])  # unmask
        la = len(c["a"])
        assert orig[:n].tolist() == [tok.cls_token_id, *c["a"], tok.sep_token_id, *c["b"], tok.sep_token_id]
        assert types[i, :n].tolist() == [0] * (la + 2) + [1] * (n - la - 2)
        chosen = (labels[i] >= 0).nonzero().flatten().tolist()
        assert all(0 < j < n - 1 and j != la + 1 for j in chosen)  # only kept, non-special tokens
    n_real = int(att.sum()) - 3 * len(cut)
    assert 0.05 < int((labels >= 0).sum()) / n_real < 0.3  # 15% of the kept tokens


def test_bert_loop_batches_grow_from_start_to_max_len(cache, tmp_path, monkeypatch):
    """Through the training loop: the collated batch of step 0 is start tokens wide, the examples of
    steps >= `steps` reach the collator untouched, and the stream is the one without warm-up."""
    cfg = tiny_config("bert", 5, tmp_path / "run", max_len=64, batch_size=8, seq_len_warmup={"start": 16, "steps": 3},
                      **{"eval.batches": 1})
    family = get_family("bert")
    seen: list[list] = []  # per make_collator call (the first is the training collator): (examples, batch)
    real = family.make_collator

    def spy(objective, tokenizer):
        calls: list = []
        seen.append(calls)
        collate = real(objective, tokenizer)
        return lambda examples, g: calls.append((examples, collate(examples, g))) or calls[-1][1]

    monkeypatch.setattr(family, "make_collator", spy)
    train_from_config(cfg)
    train_calls = seen[0]
    assert len(train_calls) == 5
    stream = _stream(cfg, family, prepare_data(cfg, family), 5)
    widths = [b["input_ids"].shape[1] for _, b in train_calls]
    assert widths[0] == 16 and widths[1] <= cfg.seq_len_at(1) == 32 and widths[2] <= cfg.seq_len_at(2) == 48
    for step in (3, 4):  # warm-up over: the very examples of the stream, at full length
        assert train_calls[step][0] == stream[step]
        assert widths[step] == max(3 + len(ex["a"]) + len(ex["b"]) for ex in stream[step]) > 48
    for step in (0, 1, 2):
        assert [ex["label"] for ex in train_calls[step][0]] == [ex["label"] for ex in stream[step]]
    # held-out batches (other collator calls) are collated from untruncated max_len examples
    assert max(b["input_ids"].shape[1] for calls in seen[1:] for _, b in calls) > 48
    log = read_log(tmp_path / "run" / "seed-0")
    assert [r.get("seq_len") for r in log[1:]] == [16, 32, 48, 64, 64]
    tokens = [int(b["attention_mask"].sum()) for _, b in train_calls]
    assert [r["tokens"] for r in log] == list(np.cumsum([0] + tokens))


@pytest.mark.slow
def test_gpt_counts_trained_tokens_and_evaluates_at_max_len(cache, tmp_path):
    warm = tiny_config("gpt", 6, tmp_path / "warm", max_len=32, batch_size=4, seq_len_warmup={"start": 8, "steps": 4},
                       **{"eval.batches": 1})
    plain = tiny_config("gpt", 1, tmp_path / "plain", max_len=32, batch_size=4, **{"eval.batches": 1})
    train_from_config(warm)
    train_from_config(plain)
    log = read_log(tmp_path / "warm" / "seed-0")
    lengths = [8, 8, 16, 24, 32, 32]  # 8 + 24 t / 4 floored to multiples of 8
    assert [r["seq_len"] for r in log[1:]] == lengths
    # packed GPT blocks have no special tokens and no padding: batch_size x length real tokens
    assert [r["tokens"] for r in log] == list(np.cumsum([0] + [4 * n for n in lengths]))
    # step 0's held-out loss is measured at max_len, as without the warm-up (same initial weights)
    assert log[0]["heldout_loss"] == read_log(tmp_path / "plain" / "seed-0")[0]["heldout_loss"]


def test_electra_blocks_keep_cls_and_sep(cache, tmp_path):
    cfg = tiny_config("electra", 2, tmp_path, max_len=64, seq_len_warmup={"start": 16, "steps": 1})
    family = get_family("electra")
    data = prepare_data(cfg, family)
    tok = data.tokenizer
    (examples,) = _stream(cfg, family, data, 1)
    cut = [family.truncate_example(ex, 16, tok, torch.Generator()) for ex in examples]
    assert all(c == list(ex[:14]) for ex, c in zip(examples, cut))
    batch = family.make_collator({**family.objective, "max_len": 64}, tok)(cut, torch.Generator().manual_seed(0))
    orig = batch["original_ids"]
    assert orig.shape == (8, 16) and bool(batch["attention_mask"].all())
    assert (orig[:, 0] == tok.cls_token_id).all() and (orig[:, -1] == tok.sep_token_id).all()
    assert orig[:, 1:-1].tolist() == cut
