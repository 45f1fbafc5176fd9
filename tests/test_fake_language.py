"""Fake-English (K et al. 2020): a disjoint, structure-preserving copy of the text, as a corpus source."""

from __future__ import annotations

from tokenizers import normalizers, pre_tokenizers

from workbench.data.corpus import build_corpus
from workbench.data.fake_language import base_source, shift_text


def test_shift_is_disjoint_and_keeps_segmentation():
    text = 'The cat, aged 3.5, said "don\'t" (naïve).'
    fake = shift_text(text)
    letters = {c for c in text if not c.isspace()}
    assert not letters & set(fake)  # no shared character at all
    assert len({shift_text(c) for c in letters}) == len(letters)  # one-to-one
    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=False, lowercase=False)
    assert norm.normalize_str(fake) == fake and normalizers.NFKC().normalize_str(fake) == fake
    pre = pre_tokenizers.BertPreTokenizer()
    words = [w for w, _ in pre.pre_tokenize_str(text)]
    assert [shift_text(w) for w in words] == [w for w, _ in pre.pre_tokenize_str(fake)]
    assert base_source("shifted:wikitext2") == "wikitext2" and base_source("brown") == "brown"


def test_shifted_source_in_the_corpus_builder(tmp_path):
    corpus = build_corpus(["inaugural", "shifted:inaugural"], tmp_path / "c", heldout_fraction=0.2, seed=0,
                          max_documents=5)
    manifest = corpus.manifest
    langs = {s: v["language"] for s, v in manifest["counts"]["by_source"].items()}
    assert langs == {"inaugural": "en", "shifted:inaugural": "en-shifted"}
    ids = manifest["doc_ids"]["train"] + manifest["doc_ids"]["heldout"]
    shifted = [i for i in ids if i.startswith("shifted:")]
    assert len(shifted) == 5 and len(ids) == 10
    by = manifest["counts"]["by_source"]
    assert by["inaugural"]["train"]["documents"] + by["inaugural"]["heldout"]["documents"] == 5


# ---- separate position embeddings for the fake half (K et al. 2020's ablation) -------------------

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.training_helpers import tiny_config  # noqa: E402
from workbench.data.fake_language import is_shifted_piece, separate_position_ids  # noqa: E402
from workbench.errors import ConfigError  # noqa: E402
from workbench.running.models import ModelHandle  # noqa: E402
from workbench.drivers.train import train_from_config  # noqa: E402


def test_separate_positions_are_decided_per_segment():
    """Ids 7 and 8 are shifted pieces: a pair whose second segment is fake offsets that segment only;
    a fake first segment offsets it (and its [CLS]); padding is never what decides."""
    ids = torch.tensor([[1, 5, 6, 2, 7, 8, 2], [1, 7, 2, 5, 2, 0, 0], [1, 5, 2, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0, 0]])
    shifted = torch.zeros(10, dtype=torch.bool)
    shifted[[7, 8]] = True
    pos = separate_position_ids(ids, mask, segments, shifted, 100)
    assert pos[0].tolist() == [0, 1, 2, 3, 104, 105, 106]
    assert pos[1, :5].tolist() == [100, 101, 102, 3, 4]
    assert pos[2].tolist() == list(range(7))
    assert is_shifted_piece("##" + shift_text("ab")) and not is_shifted_piece("##ab")


@pytest.mark.slow
def test_separate_positions_train_and_are_read_back_by_the_handle(tmp_path, monkeypatch):
    """A tiny English + fake-English DeBERTa with absolute positions and `shifted_position_offset`:
    the training batches carry offset positions for fake segments, a relative-only model refuses the
    setting, and the checkpoint's handle reads a fake sentence at the offset positions (its states
    equal the body's with explicit offset ids, and differ from the default positions')."""
    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    base = dict(corpus={"sources": ["inaugural", "shifted:inaugural"], "max_documents": 20,
                        "heldout_fraction": 0.2, "seed": 0},
                objective={"shifted_position_offset": 128}, max_len=64)
    with pytest.raises(ConfigError, match="position_biased_input"):
        train_from_config(tiny_config("deberta", 1, tmp_path / "relative", **base))
    final = train_from_config(tiny_config("deberta", 3, tmp_path / "absolute", model={"position_biased_input": True},
                                          **base))[0]
    handle = ModelHandle.load(final)
    assert handle.shifted_position_offset == 128
    words = ["The", "people", "of", "the", "United", "States", "."]
    fake = [shift_text(w) for w in words]
    body = handle.model.base_model
    ids = torch.tensor([handle.tokenizer(" ".join(fake))["input_ids"]])
    with torch.no_grad():
        offset = body(input_ids=ids, position_ids=torch.arange(ids.shape[1]).unsqueeze(0) + 128).last_hidden_state
        default = body(input_ids=ids).last_hidden_state
    states = handle.forward([fake]).hidden_states["encoder"][-1]
    assert torch.allclose(states[0, : ids.shape[1]], offset[0], atol=1e-5)
    assert (states[0, : ids.shape[1]] - default[0]).abs().max() > 1e-3
    from workbench.families import get_family

    tok = handle.tokenizer
    pair = {"a": tok(" ".join(words), add_special_tokens=False)["input_ids"],
            "b": tok(" ".join(fake), add_special_tokens=False)["input_ids"], "label": 1}
    batch = get_family("deberta").make_collator({"shifted_position_offset": 128}, tok)([pair], torch.Generator())
    n_a = len(pair["a"]) + 2  # [CLS] a [SEP]
    assert batch["position_ids"][0].tolist() == list(range(n_a)) + [128 + i for i in range(n_a, batch["input_ids"].shape[1])]
    from workbench.errors import WorkbenchError
    from workbench.running.lm_scores import lm_scorer

    with pytest.raises(WorkbenchError, match="separate positions"):  # its forwards would read default positions
        lm_scorer(handle)
    english = handle.forward([words]).hidden_states["encoder"][-1]  # English: default positions
    en_ids = torch.tensor([handle.tokenizer(" ".join(words))["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(english[0, : en_ids.shape[1]], body(input_ids=en_ids).last_hidden_state[0], atol=1e-5)


@pytest.mark.slow
def test_random_next_zero_keeps_every_sequence_in_one_language(tmp_path, monkeypatch):
    """DeBERTa's default (`random_next` 0.5, BERT's pipeline) pairs a quarter of the fake-English
    corpus's segments across languages; `random_next: 0` gives real continuations only, hence no
    code-switched sequence; 0.5 reproduces the BERT family's example stream exactly (weights unchanged)."""
    import numpy as np

    from workbench.families import get_family
    from workbench.data.fake_language import shifted_vocabulary_mask
    from workbench.drivers.train import prepare_data

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config("deberta", 1, tmp_path / "run", corpus={"sources": ["inaugural", "shifted:inaugural"],
                                                               "max_documents": 30, "heldout_fraction": 0.2, "seed": 0})
    family = get_family("deberta")
    data = prepare_data(cfg, family)
    fake = shifted_vocabulary_mask(data.tokenizer).numpy()

    def pairs(p):
        return list(family.examples(data.train, 64, np.random.default_rng(0), {**family.objective, "random_next": p}))

    def mixed(examples):
        return np.mean([bool(fake[e["a"]].any()) != bool(fake[e["b"]].any()) for e in examples])

    default, contiguous = pairs(0.5), pairs(0.0)
    assert len(default) > 200 and len(contiguous) == len(default)
    bert = get_family("bert")  # the controlled swap: DeBERTa's default stream is BERT's, pair for pair
    assert default == list(bert.examples(data.train, 64, np.random.default_rng(0), bert.objective))
    assert 0.15 < mixed(default) < 0.35 and abs(np.mean([e["label"] for e in default]) - 0.5) < 0.1
    assert mixed(contiguous) == 0.0 and not any(e["label"] for e in contiguous)
