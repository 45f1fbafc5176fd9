"""The model explorer offers checkpoints only (issue 40): on a runs root holding a compression
sweep's tree, a training run and a fine-tuning run, `app.data.list_checkpoints` lists the folders
with weights, config and tokenizer, newest first, never a sweep's own folder (its config.json is
the sweep's config), `full/`, a `points/` folder whose weights were dropped or a seed's `resume/`
state; each is named by its lineage; the page opens on the newest one that loads. Token labels in
the explorer and the lens tables are the text a person reads (`app.model_views.readable_tokens`),
checked with a byte-level BPE and a WordPiece tokenizer trained here on a few sentences."""

from __future__ import annotations

import json
import os

import pytest
from streamlit.testing.v1 import AppTest

from app import data, model_views
from tests.conftest import tiny_bert, tiny_gpt2
from tests.test_app import APP, charts, shown_table

SWEEP = "prune/minilm-polarity"
IMP = f"{SWEEP}/points/imp/0.5/seed-0/imp-0.5-seed0"
FULL = f"{SWEEP}/full/seed-0/best"
STEP = "train/tiny/seed-0/step-0000001"
BROKEN = "finetune/broken/seed-0/best"  # the newest, but its weights file is not a model
DROPPED = f"{SWEEP}/points/oneshot/0.7/seed-0/oneshot-0.7-seed0"  # keep_checkpoints: false
RESUME = f"{SWEEP}/full/seed-0/resume"


def _save(folder, model, tok, mtime: float) -> None:
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps({"family": "bert", "seed": 0}))
    os.utime(folder / "model.safetensors", (mtime, mtime))


@pytest.fixture
def sweep_root(tmp_path, tokenizers):
    """A runs root: a prune sweep (its config, full model, a point with weights, a point without, a
    resume state), a training step, a fine-tuning run folder, and a broken newest checkpoint."""
    root = tmp_path / "runs"
    tok = tokenizers["bert"]
    model = tiny_bert(tok, seed=1)
    for rel in (SWEEP, "finetune/broken"):  # a sweep's / run's own config.json: not a model config
        (root / rel).mkdir(parents=True)
        (root / rel / "config.json").write_text(json.dumps({"finetune": {"task": "sentence_polarity"}}))
    _save(root / STEP, model, tok, 1_000_000)
    _save(root / FULL, model, tok, 2_000_000)
    _save(root / IMP, model, tok, 3_000_000)
    _save(root / RESUME, model, tok, 5_000_000)  # trainer state of a running seed, newest of all
    _save(root / BROKEN, model, tok, 4_000_000)
    (root / BROKEN / "model.safetensors").write_bytes(b"not a safetensors file")
    os.utime(root / BROKEN / "model.safetensors", (4_000_000, 4_000_000))
    dropped = root / DROPPED  # what a point keeps without its weights: manifest, masks, config
    dropped.mkdir(parents=True)
    (dropped / "manifest.json").write_text("{}")
    (dropped / "masks.safetensors").write_bytes(b"")
    model.config.to_json_file(dropped / "config.json")
    tok.save_pretrained(dropped)
    (root / f"{SWEEP}/points/imp/0.5/seed-0/point.json").write_text("{}")
    return root


def test_checkpoint_listing_is_checkpoints_only_newest_first(sweep_root):
    assert data.list_checkpoints(sweep_root) == [BROKEN, IMP, FULL, STEP]
    labels = [data.checkpoint_label(rel) for rel in data.list_checkpoints(sweep_root)]
    assert labels == ["finetune/broken · seed 0 · best", f"{SWEEP} · seed 0 · 50% imp", f"{SWEEP} · seed 0 · full model",
                      "train/tiny · seed 0 · step 1"]


@pytest.mark.parametrize("rel, label", [
    (f"{SWEEP}/points/quantize/4bit/seed-2/quantize-4bit-seed2", f"{SWEEP} · seed 2 · 4-bit quantize"),
    (f"{SWEEP}/points/lowrank/r16/seed-0/lowrank-r16-seed0", f"{SWEEP} · seed 0 · rank 16 lowrank"),
    (f"{SWEEP}/points/full/0/seed-1/full-0-seed1", f"{SWEEP} · seed 1 · full model (its point)"),
    (f"{SWEEP}/full/seed-0/rewind", f"{SWEEP} · seed 0 · rewind weights"),
    ("distill/grid/points/d3-distil/seed-1/best", "distill/grid · d3-distil · seed 1 · best"),
    ("named/peft-lora", "named/peft-lora"),
])
def test_checkpoint_labels_read_the_lineage(rel, label):
    assert data.checkpoint_label(rel) == label


def test_the_explorer_opens_on_the_newest_checkpoint_that_loads(sweep_root, monkeypatch, tmp_path):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(sweep_root))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "explorer"
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    box = at.selectbox(key="ex-local")
    assert box.value == IMP  # the broken newest one is skipped, with one line saying why
    assert box.options == [data.checkpoint_label(rel) for rel in (BROKEN, IMP, FULL, STEP)]
    assert [w.value for w in at.warning if w.value.startswith("not opened")] and BROKEN in at.warning[0].value
    assert any(c["data"][0]["type"] == "heatmap" for c in charts(at))  # a model's attention: the first screen
    assert len(shown_table(at, "ex-lens-table")) == 3  # embeddings + 2 layers


# --------------------------------------------------------------------------- readable tokens
TEXTS = ["the company is here", "the company  grows", "a company of the people is running", "the cat sat"] * 40


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE trained on a few sentences: 'Ġcompany' is one token, 'Ġ' (a space) another."""
    from workbench.tokenization import build_tokenizer

    return build_tokenizer("bytelevel_bpe", ["<|endoftext|>"], TEXTS, vocab_size=300)


def test_byte_level_bpe_tokens_read_as_text(bpe):
    ids = bpe("the company  grows", add_special_tokens=False)["input_ids"]
    raw = bpe.convert_ids_to_tokens(ids)
    assert raw == ["Ġthe", "Ġcompany", "Ġ", "Ġgrows"]  # the vocabulary strings (what the lens showed;
    # the workbench's byte-level BPE adds a prefix space, as GPT-2's and RoBERTa's word-initial tokens have)
    assert model_views.readable_tokens(bpe, ids) == ["␣the", "␣company", "␣", "␣grows"]
    glued = bpe.convert_tokens_to_ids(["ing"])  # a piece without the marker continues a word: no ␣
    assert bpe.convert_ids_to_tokens(glued) == ["ing"] and model_views.readable_tokens(bpe, glued) == ["ing"]
    eos = bpe.convert_tokens_to_ids("<|endoftext|>")
    assert model_views.readable_tokens(bpe, [eos]) == ["<|endoftext|>"]  # special tokens as they are


def test_wordpiece_tokens_read_as_text():
    from workbench.tokenization import build_tokenizer

    wp = build_tokenizer("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], ["the company is running"] * 20
                         + ["runs", "running", "go", "going"] * 5, vocab_size=45)
    ids = wp("the company running")["input_ids"]
    raw = wp.convert_ids_to_tokens(ids)
    assert raw[0] == "[CLS]" and raw[-1] == "[SEP]" and any(t.startswith("##") for t in raw)
    shown = model_views.readable_tokens(wp, ids)
    # a word's first piece after a space, its continuations glued: the text reads back
    assert shown[0] == "[CLS]" and shown[-1] == "[SEP]"
    assert "".join(shown[1:-1]).replace("␣", " ").strip() == "the company running"
    assert all(not t.startswith("##") for t in shown)
    assert [t.startswith("␣") for t in shown[1:-1]] == [not t.startswith("##") for t in raw[1:-1]]


@pytest.mark.slow
def test_the_explorer_shows_readable_tokens_of_a_byte_level_bpe_model(bpe, tmp_path, monkeypatch):
    root = tmp_path / "runs"
    folder = root / "train" / "bpe" / "seed-0" / "step-0000001"
    tiny_gpt2(bpe, seed=2).save_pretrained(folder)
    bpe.save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps({"family": "gpt", "step": 1, "seed": 0}))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["page"] = "explorer"
    at.run()
    at.text_input(key="ex-sentence").set_value("the company is here").run()
    at.selectbox(key="ex-lens-word").set_value(2).run()  # predict the word after "the company"
    assert not at.exception and not at.error
    heat = next(c for c in charts(at) if c["data"][0]["type"] == "heatmap")["data"][0]
    assert list(heat["x"]) == ["0:<|endoftext|>", "1:␣the", "2:␣company", "3:␣is", "4:␣here"]
    lens = shown_table(at, "ex-lens-table")
    handle = model_views.load(folder)
    want = model_views.logit_lens(handle, "the company is here".split(), 2, k=5)
    assert want["piece"].str.contains("Ġ").any()  # the vocabulary strings carry the marker...
    for layer in range(3):  # ...the table shows each token's text
        w = want[want["layer"] == layer].sort_values("rank")
        assert lens.loc[layer].tolist() == [f"{t} ({p:.3f})" for t, p in
                                            zip(model_views.readable_tokens(bpe, w["id"].tolist()), w["prob"])]
    assert not any("Ġ" in cell for cell in lens.to_numpy().ravel())
    assert any(model_views.TOKEN_NOTE == c.value for c in at.caption)
