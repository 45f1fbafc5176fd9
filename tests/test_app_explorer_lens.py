"""The model explorer's logit-lens tab for every family the backend trains: tiny checkpoints
(random weights) saved as the training loop saves them under a runs root; the explorer page
(headless AppTest) shows, for each, the top-k the cloze probe's one lens implementation
(`workbench.running.logit_lens.blank_topk`) gives at the blanked-out word, layer by layer; the masked LMs'
last layer is also checked against the full model's own MLM output at the mask; a model
without an LM head gets one line saying why, and T5/BART say why their encoder has no lens."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from app import model_views
from workbench.running.logit_lens import blank_topk
from tests.test_app import APP, charts, no_errors, shown_table
from workbench.families import FAMILIES, get_family
from workbench.running.lm_scores import lm_scorer
from workbench.running.lm_inputs import BLANK

WORDS = "the cat sat on the mat".split()
POSITION = 2  # "sat": a word with words on both sides (ELMo's and BART's reading need them)
K = 5
TOKENIZER_OF = {"bert": "bert", "spanbert": "bert", "electra": "bert", "deberta": "bert", "distilbert": "bert", "roberta": "bart",
                "bart": "bart", "gpt": "gpt", "t5": "t5"}
MLM_FAMILIES = ("bert", "roberta", "spanbert", "albert", "electra", "deberta", "distilbert")


@pytest.fixture(scope="module")
def family_root(tmp_path_factory, tokenizers, ewt_train):
    """A runs root with one tiny checkpoint per family (train/<family>/seed-0/step-0000001) and a bare
    BERT body without LM head (train/bare/...)."""
    from transformers import BertConfig, BertModel

    from workbench.tokenization import build_tokenizer

    root = tmp_path_factory.mktemp("explorer-lens") / "runs"
    texts = [s.text for s in ewt_train]
    paths = {}
    for name in FAMILIES:
        family = get_family(name)
        if name in TOKENIZER_OF:
            tok = tokenizers[TOKENIZER_OF[name]]
        elif name == "albert":
            tok = build_tokenizer("unigram", family.special_tokens, texts[:2000], vocab_size=1000)
        else:  # elmo: a word-level vocabulary
            tok = build_tokenizer("word", family.special_tokens, texts, 2000, special_roles=family.special_roles,
                                  template=family.template)
        with torch.random.fork_rng():
            torch.manual_seed(1)
            model = family.build_model(family.model_config("tiny"), tok).eval()
        folder = root / "train" / name / "seed-0" / "step-0000001"
        model.save_pretrained(folder)
        tok.save_pretrained(folder)
        (folder / "manifest.json").write_text(json.dumps({"family": name, "step": 1, "seed": 0}))
        paths[name] = folder
    bare = root / "train" / "bare" / "seed-0" / "step-0000001"
    tok = tokenizers["bert"]
    BertModel(BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64)).save_pretrained(bare)
    tok.save_pretrained(bare)
    paths["bare"] = bare
    return root, paths


def _explorer(root, monkeypatch, tmp_path) -> AppTest:
    monkeypatch.setenv("BERTOLOGY_RUNS", str(root))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    at = AppTest.from_file(APP, default_timeout=180)
    at.query_params["page"] = "explorer"
    at.run()
    no_errors(at)
    at.text_input(key="ex-sentence").set_value(" ".join(WORDS)).run()
    return at


def _mlm_reference(path, family: str) -> torch.Tensor:
    """Probabilities of the full masked LM (ELECTRA: its generator) at the blanked word, from the
    folder opened by AutoModelForMaskedLM: the sentence with a one-letter word there, the tokens
    covering it and the space before it (byte-level BPE may split " x" into "Ġ" + "x") replaced by
    ONE mask token, found by the tokenizer's character offsets."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForMaskedLM.from_pretrained(path / "generator" if family == "electra" else path).eval()
    text = " ".join("x" if i == POSITION else w for i, w in enumerate(WORDS))
    a = text.index(" x ")  # the space before the word, the word
    enc = tok(text, return_offsets_mapping=True)
    span = [t for t, (s, e) in enumerate(enc["offset_mapping"]) if e > s and s >= a and e <= a + 2]
    assert span and span == list(range(span[0], span[-1] + 1))
    ids = enc["input_ids"][: span[0]] + [tok.mask_token_id] + enc["input_ids"][span[-1] + 1:]
    with torch.no_grad():
        return torch.softmax(model(input_ids=torch.tensor([ids])).logits[0, span[0]].float(), -1)


@pytest.mark.slow
def test_explorer_lens_covers_every_family(family_root, monkeypatch, tmp_path):
    root, paths = family_root
    at = _explorer(root, monkeypatch, tmp_path)
    for name in FAMILIES:
        at.selectbox(key="ex-local").set_value(str(paths[name].relative_to(root))).run()
        no_errors(at)
        at.selectbox(key="ex-lens-word").set_value(POSITION).run()
        no_errors(at)
        shown = shown_table(at, "ex-lens-table")
        # the lens computed directly: the same folder, the cloze probe's blank_topk
        scorer = lm_scorer(model_views.load(paths[name]))
        context = " ".join(BLANK if i == POSITION else w for i, w in enumerate(WORDS))
        want = blank_topk(scorer, context, K)
        # the page shows each token as the text it adds (app.model_views.readable_tokens), not its vocabulary string
        want = want.assign(token=model_views.readable_tokens(scorer.handle.tokenizer, want["id"].tolist()))
        L = int(want["layer"].max())
        assert L == 2 and list(shown.index) == list(range(L + 1)), name  # tiny presets: 2 (decoder) layers
        for layer in range(L + 1):
            w = want[want["layer"] == layer].sort_values("rank")
            assert shown.loc[layer].tolist() == [f"{t} ({p:.3f})" for t, p in zip(w["token"], w["prob"])], (name, layer)
        top1 = next(c for c in charts(at) if c["layout"]["title"]["text"] == "top-1 probability by layer")["data"][0]
        np.testing.assert_allclose(np.asarray(top1["y"], float), want[want["rank"] == 1]["prob"], rtol=1e-6)
        assert list(top1["text"]) == want[want["rank"] == 1]["token"].tolist()
        captions = " ".join(c.value for c in at.caption)
        assert want.attrs["reads"] in captions
        if name in ("t5", "bart"):
            assert "The encoder has no logit lens" in captions
        if name == "electra":
            assert "ELECTRA: the lens reads its generator" in captions
        if name in MLM_FAMILIES:
            ref = torch.topk(_mlm_reference(paths[name], name), K)
            last = want[want["layer"] == L].sort_values("rank")
            assert last["id"].tolist() == ref.indices.tolist(), name
            np.testing.assert_allclose(last["prob"], ref.values.numpy(), rtol=1e-4, atol=1e-7)
    # a bare body: one line saying why, no table
    at.selectbox(key="ex-local").set_value(str(paths["bare"].relative_to(root))).run()
    no_errors(at)
    assert any("no trained LM head" in i.value for i in at.info)
    with pytest.raises(KeyError):  # no lens table on the page
        at.container("ex-lens-table")
