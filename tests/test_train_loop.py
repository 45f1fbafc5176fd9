"""The shared training loop on the GPT reference family: real corpus, loss drops, checkpoints open
with plain transformers, log-spaced schedule, multi-seed, config errors name file and key."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from workbench.config import load_train_config
from workbench.errors import ConfigError
from workbench.families.base import contiguous_blocks
from workbench.drivers.train import (
    checkpoint_steps,
    list_checkpoints,
    lr_lambda_factory,
    read_log,
    train_from_config,
)

from tests.training_helpers import run_tiny_training, tiny_config

STEPS = 30


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """One corpus/tokenizer cache for the module (each test run builds it afresh)."""
    path = tmp_path_factory.mktemp("cache")
    mp = pytest.MonkeyPatch()
    mp.setenv("BERTOLOGY_CACHE", str(path))
    mp.setenv("BERTOLOGY_RUNS", str(tmp_path_factory.mktemp("runs")))
    yield path
    mp.undo()


@pytest.fixture(scope="module")
def tiny_run(cache, tmp_path_factory):
    torch.set_num_threads(1)
    return run_tiny_training("gpt", STEPS, tmp_path_factory.mktemp("gpt"))


def test_checkpoint_steps_are_log_spaced_plus_every_and_last():
    assert checkpoint_steps(30) == [0, 1, 2, 4, 8, 16, 30]
    assert checkpoint_steps(32) == [0, 1, 2, 4, 8, 16, 32]
    assert checkpoint_steps(100, every=40) == [0, 1, 2, 4, 8, 16, 32, 40, 64, 80, 100]
    assert checkpoint_steps(10, every=5, log_spaced=False) == [0, 5, 10]
    assert checkpoint_steps(1) == [0, 1]


def test_lr_warmup_then_linear_decay():
    f = lr_lambda_factory(warmup=4, total=12)
    values = [f(s) for s in range(12)]
    assert values[:4] == [0.25, 0.5, 0.75, 1.0]
    assert values[4] == 1.0 and values[-1] == pytest.approx(1 / 8)
    assert all(a > b for a, b in zip(values[4:], values[5:]))
    assert f(12) == 0.0


@pytest.mark.slow
def test_tiny_gpt_lowers_heldout_loss_on_real_corpus(tiny_run):
    before, after = tiny_run.heldout_before["loss"], tiny_run.heldout_after["loss"]
    # ln(1000) = 6.91 is the loss of a uniform guess over the 1,000-token vocabulary.
    assert before == pytest.approx(np.log(1000), abs=0.15)
    assert after < before - 0.5, (before, after)
    manifest = json.loads((tiny_run.checkpoint / "manifest.json").read_text())
    assert manifest["step"] == STEPS and manifest["family"] == "gpt"
    assert manifest["corpus"]["split"] == "train" and len(manifest["corpus"]["manifest_sha256"]) == 64
    assert manifest["tokens_seen"] == STEPS * 8 * 64  # packed blocks: no padding at all


@pytest.mark.slow
def test_log_has_every_step_with_tokens_lr_and_terms(tiny_run):
    log = tiny_run.log
    assert [r["step"] for r in log] == list(range(STEPS + 1))
    assert [r["tokens"] for r in log] == [s * 8 * 64 for s in range(STEPS + 1)]
    assert all({"loss", "lm", "lr", "elapsed"} <= set(r) for r in log[1:])
    assert {r["step"] for r in log if "heldout_loss" in r} == set(checkpoint_steps(STEPS))
    lrs = [r["lr"] for r in log[1:]]
    assert max(lrs) == pytest.approx(3e-3) and lrs[0] < lrs[2] and lrs[-1] < lrs[5]


@pytest.mark.slow
def test_checkpoints_are_plain_transformers_folders(tiny_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folders = list_checkpoints(tiny_run.run_folder)
    assert [s for s, _ in folders] == checkpoint_steps(STEPS)
    # Only the latest keeps the (large) resumable trainer state.
    assert [s for s, p in folders if (p / "trainer_state").exists()] == [STEPS]
    model = AutoModelForCausalLM.from_pretrained(tiny_run.checkpoint)
    tok = AutoTokenizer.from_pretrained(tiny_run.checkpoint)
    saved = torch.load(tiny_run.checkpoint / "trainer_state" / "model.pt", weights_only=True)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, saved[f"model.{name}"]), name
    enc = tok(["Fellow", "citizens", "of", "the", "Senate"], is_split_into_words=True, return_tensors="pt")
    assert enc.word_ids()[0] == 0 and max(i for i in enc.word_ids() if i is not None) == 4
    with torch.no_grad():
        out = model(**enc, labels=enc["input_ids"])
    assert torch.isfinite(out.loss) and out.logits.shape[-1] == len(tok)


@pytest.mark.slow
def test_rerun_of_finished_config_returns_without_training(tiny_run):
    log_before = (tiny_run.run_folder / "log.jsonl").read_bytes()
    again = train_from_config(tiny_run.config)
    assert again == [tiny_run.checkpoint]
    assert (tiny_run.run_folder / "log.jsonl").read_bytes() == log_before


def test_multi_seed_from_one_config(cache, tmp_path):

    cfg = tiny_config("gpt", 3, tmp_path, seeds=[3, 4], **{"eval.batches": 0})
    finals = train_from_config(cfg)
    assert [p.parent.name for p in finals] == ["seed-3", "seed-4"]
    w3 = torch.load(finals[0] / "trainer_state" / "model.pt", weights_only=True)
    w4 = torch.load(finals[1] / "trainer_state" / "model.pt", weights_only=True)
    assert not torch.equal(w3["model.transformer.wte.weight"], w4["model.transformer.wte.weight"])
    assert [r["step"] for r in read_log(finals[1].parent)] == [0, 1, 2, 3]


@pytest.mark.slow
def test_contiguous_blocks_pack_documents_with_separators(tiny_run):
    from workbench.data_cache import TokenizedCorpus

    from workbench.paths import cache_root

    (path,) = sorted((cache_root() / "tokenized").glob("train-*"))
    tc = TokenizedCorpus(path)
    blocks = list(contiguous_blocks(tc, 64, np.random.default_rng(0)))
    stream = tc.stream_with_separators()
    assert all(len(b) == 64 for b in blocks)  # GPT adds no special tokens
    assert len(stream) == tc.num_tokens + tc.num_documents
    assert (stream == tc.separator_id).sum() >= tc.num_documents
    assert len(blocks) >= (len(stream) - 63) // 64 - 1
    # Every block is a contiguous slice of the stream.
    joined = {tuple(stream[i : i + 8]) for i in range(len(stream) - 8)}
    assert all(tuple(b[:8]) in joined for b in blocks[:20])
    again = list(contiguous_blocks(tc, 64, np.random.default_rng(0)))
    other = list(contiguous_blocks(tc, 64, np.random.default_rng(1)))
    assert again == blocks and other != blocks


@pytest.mark.parametrize("text, message", [
    ("family: gpt\nsteps: 10\ncorpus:\n  sources: [brown]\n  heldout_fractoin: 0.1\n",
     r": unknown key\(s\) \['corpus\.heldout_fractoin'\] \(did you mean 'heldout_fraction'\?\)"),
    ("family: gpt\nsteps: 10\nlr: fast\n", r": lr: expected a number"),
    ("family: gpt\nsteps: 10\ncorpus: {heldout_fraction: 2}\n", r": corpus\.heldout_fraction: must be in \(0, 1\)"),
    ("family: gpt\n", r": steps: give exactly one"),
    ("family: gpt2\nsteps: 3\n", r": family: unknown family 'gpt2'"),
    ("steps: 3\n", r": family: required key is missing"),
    ("family: gpt\nsteps: [3\n", r":\d+: not valid YAML"),
])  # fmt: skip
def test_config_errors_name_file_and_key(tmp_path, text, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError, match=r"bad\.yaml" + message):
        load_train_config(bad)


def test_config_overrides():
    good = load_train_config({"family": "gpt", "steps": 5}, {"corpus.max_documents": 7, "lr": "1e-3"})
    assert good.corpus.max_documents == 7 and good.lr == 1e-3 and good.total_steps == 5


def test_example_configs_load():
    from workbench.paths import REPO_ROOT

    paths = sorted((REPO_ROOT / "experiments" / "train").glob("*.yaml"))
    assert paths, "experiments/train/*.yaml missing"
    for p in paths:
        cfg = load_train_config(p)
        assert cfg.name == p.stem and cfg.total_steps >= 1


def test_tokens_budget_converts_to_steps():
    cfg = load_train_config({"family": "gpt", "tokens": 10_000, "batch_size": 4, "grad_accum": 2, "max_len": 64})
    assert cfg.total_steps == 20  # ceil(10,000 / (4 * 2 * 64))
    assert cfg.warmup_steps() == 1  # round(0.06 * 20)


def test_cli_shortcut_trains_and_prints_checkpoint(cache, tmp_path, capsys):
    from workbench.drivers.train import train_cli_main

    argv = ["--family", "gpt", "--preset", "tiny", "--steps", "2", "--output-dir", str(tmp_path),
            "--set", "corpus.sources=[inaugural]", "--set", "corpus.max_documents=12",
            "--set", "tokenizer.vocab_size=300", "--set", "max_len=32", "--set", "batch_size=2",
            "--set", "eval.batches=0", "--set", "progress=false"]
    assert train_cli_main(argv) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed == [str(tmp_path / "seed-0" / "step-0000002")]
    assert (tmp_path / "seed-0" / "step-0000002" / "model.safetensors").exists()
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['corpus\.bogus'\]"):
        train_cli_main(["--family", "gpt", "--steps", "1", "--set", "corpus.bogus=1"])


def test_cli_small_shortcut_uses_the_measured_cpu_recipe(monkeypatch):
    """`--family bert --preset small` trains the recipe of docs/evidence/training-plateau.md, not the
    schema's generic defaults; explicit flags still win."""
    import workbench.drivers.train as train_mod

    seen = []
    monkeypatch.setattr(train_mod, "train_from_config", lambda source, overrides, **kw: seen.append(
        load_train_config(source, overrides)) or [])
    train_mod.train_cli_main(["--family", "bert", "--preset", "small"])
    cfg = seen[-1]
    assert (cfg.batch_size, cfg.max_len, cfg.lr, cfg.total_steps) == (16, 128, 1.0e-3, 1200)
    assert cfg.objective == {"nsp": False} and cfg.warmup_steps() == 100
    train_mod.train_cli_main(["--family", "gpt", "--preset", "small", "--tokens", "204800", "--set", "lr=5e-4"])
    cfg = seen[-1]
    assert (cfg.total_steps, cfg.lr, cfg.objective) == (100, 5e-4, {})


@pytest.mark.slow
def test_cpu_bf16_autocast_trains_and_is_part_of_the_training_hash(cache, tiny_run, tmp_path):
    """`cpu_bf16: true` runs the forward under CPU bf16 autocast: the tiny GPT still learns (held-out
    loss within a few hundredths of the fp32 run's), the weights differ from fp32's (bf16 rounding,
    so the autocast really ran), the manifest records it, and it changes the training hash (a resume
    never mixes the two)."""
    from workbench.store.identity import weights_hash

    torch.set_num_threads(1)
    bf16 = run_tiny_training("gpt", STEPS, tmp_path / "bf16", cpu_bf16=True)
    fp32 = tiny_run
    print("held-out loss fp32", fp32.heldout_after["loss"], "bf16", bf16.heldout_after["loss"])
    assert bf16.heldout_after["loss"] < bf16.heldout_before["loss"] - 0.3
    assert abs(bf16.heldout_after["loss"] - fp32.heldout_after["loss"]) < 0.1
    assert weights_hash(bf16.checkpoint) != weights_hash(fp32.checkpoint)
    assert json.loads((bf16.checkpoint / "manifest.json").read_text())["config"]["cpu_bf16"] is True
    assert bf16.config.training_hash() != fp32.config.training_hash()


@pytest.mark.slow
def test_tokenizer_path_reuses_a_trained_tokenizer_on_other_data(cache, tiny_run, tmp_path):
    """`tokenizer.path` (membership reference models): a run on other documents reads text with the
    given tokenizer (same sha256 in the manifest, same ids), not one trained on its own corpus; a
    folder without a tokenizer, a size mismatch or another family's tokenizer is a ConfigError."""
    from workbench.tokenization import load_tokenizer

    torch.set_num_threads(1)
    source = tiny_run.checkpoint
    other = {"sources": ["abc"], "max_documents": 20, "heldout_fraction": 0.2, "seed": 0}
    ref = run_tiny_training("gpt", 5, tmp_path / "ref", corpus=other, tokenizer={"vocab_size": 1000, "path": str(source)})
    sha = lambda ck: json.loads((ck / "manifest.json").read_text())["tokenizer"]["sha256"]  # noqa: E731
    assert sha(ref.checkpoint) == sha(source)
    text = "The Senate shall have power to lay and collect taxes."
    assert load_tokenizer(ref.checkpoint)(text)["input_ids"] == load_tokenizer(source)(text)["input_ids"]
    own = run_tiny_training("gpt", 5, tmp_path / "own", corpus=other)  # trained on abc: another tokenizer
    assert sha(own.checkpoint) != sha(source)
    # the training hash follows the tokenizer's content, not its path: a new tokenizer there is a new run
    moved = tmp_path / "tok"
    moved.mkdir()
    (moved / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())

    def hash_with_moved_tokenizer():
        return tiny_config("gpt", 5, tmp_path / "h", corpus=other,
                           tokenizer={"vocab_size": 1000, "path": str(moved)}).training_hash()

    assert hash_with_moved_tokenizer() == ref.config.training_hash()
    (moved / "tokenizer.json").write_bytes((own.checkpoint / "tokenizer.json").read_bytes())
    assert hash_with_moved_tokenizer() != ref.config.training_hash()
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        train_from_config(tiny_config("gpt", 5, tmp_path / "x", tokenizer={"vocab_size": 1000, "path": str(tmp_path)}))
    with pytest.raises(ConfigError, match="has 1000 entries but tokenizer.vocab_size is 999"):
        train_from_config(tiny_config("gpt", 5, tmp_path / "y", tokenizer={"vocab_size": 999, "path": str(source)}))
    with pytest.raises(ConfigError, match="lacks the bert special tokens"):
        train_from_config(tiny_config("bert", 5, tmp_path / "z", tokenizer={"vocab_size": 1000, "path": str(source)}))


# ---- pinned weights: the loop's refactors must not change a single bit ----------------------------

PIN_FAMILIES = ["bert", "roberta", "spanbert", "albert", "electra", "deberta", "gpt", "t5", "bart", "elmo"]


@pytest.mark.pins
@pytest.mark.parametrize("masks", ["bernoulli", "pcg16_modules", "pcg16"])
@pytest.mark.parametrize("family", PIN_FAMILIES)
def test_tiny_run_of_every_family_keeps_its_pinned_weights(cache, tmp_path, family, masks):
    """3 steps of 2 accumulated micro-batches (dropout on, so the RNG order matters; a held-out
    evaluation at every checkpoint) give the weights and log recorded before the loop was shared
    (tests/weight_pins.py: per machine). The full training module is pinned (ELECTRA's generator,
    BERT's NSP head), and the saved checkpoint folder by the repo's own `weights_hash`.
    `dropout_masks: bernoulli` (torch's masks) keeps the pins recorded before workbench/dropout.py
    existed; the `pcg16` masks of the dropout modules have their own pins (`train/<family>/pcg16/...`,
    recorded on 2026-11-26 when they became the default), which `pcg16_modules` still meets bit for
    bit; since 2026-11-27 `pcg16` also draws the attention probabilities' masks of the families that
    apply them inside the attention function (`train/<family>/pcg16_attention/...`, recorded then),
    and the other families' `pcg16` keeps its 2026-11-26 pins."""
    from tests.weight_pins import check_pin, log_hash, state_hash
    from workbench.store.identity import weights_hash

    torch.set_num_threads(1)
    cfg = tiny_config(family, 3, tmp_path, corpus={"sources": ["inaugural"], "max_documents": 12,
                                                   "heldout_fraction": 0.2, "seed": 0},
                      tokenizer={"vocab_size": 400}, max_len=32, batch_size=4, grad_accum=2,
                      **{"eval.batches": 1, "checkpoints.log_spaced": False, "dropout_masks": masks})
    (final,) = train_from_config(cfg)
    module = torch.load(final / "trainer_state" / "model.pt", weights_only=True)
    from workbench.store.checkpoints import read_manifest
    from workbench.dropout import FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES
    from workbench.drivers.train import dropout_record

    assert read_manifest(final)["dropout_masks"] == dropout_record(cfg)
    case = {"bernoulli": f"train/{family}", "pcg16_modules": f"train/{family}/pcg16",
            "pcg16": f"train/{family}/pcg16_attention" if family in FUNCTIONAL_ATTENTION_DROPOUT_FAMILIES
            else f"train/{family}/pcg16"}[masks]
    check_pin(f"{case}/checkpoint", weights_hash(final))
    check_pin(f"{case}/module", state_hash(module))
    check_pin(f"{case}/log", log_hash(read_log(final.parent)))


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_step_batches_built_in_a_worker_equal_those_built_in_process(cache, tmp_path, family):
    """The GPU path builds each step's batches ahead in a worker process (`host_batches(...,
    worker=True)`): the same micro-batches, token counts and data positions as the CPU path's
    in-process stream, also from a resumed position (the tail of a fresh stream), and with the
    sequence-length warm-up's truncation and gradient accumulation in play."""
    import functools

    from workbench.families import get_family
    from workbench.drivers.train import Dist, host_batches, objective_settings, prepare_data, step_batches

    cfg = tiny_config(family, 12, tmp_path, grad_accum=2, seq_len_warmup={"start": 16, "steps": 6})
    fam = get_family(family)
    data = prepare_data(cfg, fam)
    collate = fam.make_collator(objective_settings(cfg, fam), data.tokenizer)

    def stream(worker, epoch=0, batch_index=0, start=0):
        make = functools.partial(step_batches, fam, data.train, cfg, 0, Dist(), collate, data.tokenizer, epoch,
                                 batch_index, start, cfg.total_steps)
        with host_batches(make, worker) as batches:
            return list(batches)

    in_process, in_worker = stream(False), stream(True)
    assert [b.step for b in in_worker] == list(range(12))
    assert len({b.seq_len for b in in_process}) > 1  # the warm-up changes the length within the run
    for a, b in zip(in_process, in_worker, strict=True):
        assert (a.step, a.seq_len, a.tokens, a.epoch, a.batch_index) == (b.step, b.seq_len, b.tokens, b.epoch, b.batch_index)
        assert len(a.micro) == len(b.micro) == 2
        for ma, mb in zip(a.micro, b.micro):
            assert ma.keys() == mb.keys()
            for k in ma:
                assert torch.equal(ma[k], mb[k]), k
    # resumed after step 5 from the position recorded there: the fresh stream's tail
    at = in_process[4]
    resumed = stream(True, at.epoch, at.batch_index, start=5)
    assert [b.step for b in resumed] == list(range(5, 12))
    for a, b in zip(in_process[5:], resumed, strict=True):
        assert a.tokens == b.tokens and all(torch.equal(a.micro[0][k], b.micro[0][k]) for k in a.micro[0])
