"""Cloze probe (probes/cloze/): zero-shot scoring, the logit lens, fine-tuning the MC head, the
probe on the runner. Tiny random models on items generated from the real lexicon."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch

from probes import cloze
from probes.cloze import tasks as ct
from tests.conftest import tiny_bert
from workbench.errors import ConfigError
from workbench.running import logit_lens
from workbench.running.lm_scores import filled_items, lm_scorer
from workbench.running.lm_inputs import BLANK
from workbench.running.models import ModelHandle


@pytest.fixture(scope="module")
def small_items() -> dict:
    sizes = {"train": 40, "dev": 20, "test": 24}
    return {t: ct.split(ct.generate(t, seed=0, sizes=sizes), "test") for t in ("age", "antonym", "multihop")}


@pytest.fixture(scope="module")
def handles(tiny_models, ewt_train, tmp_path_factory) -> dict:
    """Tiny random BERT, GPT-2, T5, BART (2 layers, hidden 32) and a tiny ELMo biLM saved with its
    softmax (the scorer loads ElmoForBiLM from the folder)."""
    from workbench.families.elmo import FAMILY, build_model
    from workbench.tokenization import build_tokenizer

    out = {name: ModelHandle(*tiny_models[name]) for name in ("bert", "gpt", "t5", "bart")}
    tok = build_tokenizer("word", FAMILY.special_tokens, [s.text for s in ewt_train], 2000,
                          special_roles=FAMILY.special_roles, template=FAMILY.template)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model(FAMILY.model_config("tiny"), tok).eval()
    folder = tmp_path_factory.mktemp("elmo") / "ckpt"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    out["elmo"] = ModelHandle.load(folder)
    return out


LENS_STACK = {"bert": "encoder", "gpt": "decoder", "t5": "decoder", "bart": "decoder", "elmo": "encoder"}


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart", "elmo"])
@pytest.mark.parametrize("task", ["age", "antonym", "multihop"])
def test_lens_last_layer_equals_zero_shot(handles, small_items, family, task):
    items = small_items[task]
    scorer = lm_scorer(handles[family])
    correct, scores = cloze.zero_shot(scorer, items)
    lens = cloze.lens_scores(scorer, items, batch_size=7)
    L = handles[family].num_layers[LENS_STACK[family]]
    assert lens.shape == (L + 1, len(items), len(items[0].choices))
    np.testing.assert_allclose(lens[-1], np.array(scores.scores), rtol=1e-5, atol=1e-4)
    lens_correct = lens.argmax(-1) == np.array([it.answer for it in items])[None]
    assert lens_correct[-1].mean() == correct.mean()
    assert not np.allclose(lens[0], lens[-1])  # the layers differ


def _truncated(model, layers: int, family: str):
    m = copy.deepcopy(model)
    if family == "bert":
        m.bert.encoder.layer = m.bert.encoder.layer[:layers]
    else:
        m.transformer.h = m.transformer.h[:layers]
    return m


@pytest.mark.parametrize("family", ["bert", "gpt"])
def test_lens_equals_truncated_model_by_hand(handles, small_items, family):
    """The head on layer l = the full LM head of the same model cut after l blocks (GPT: its final
    norm then applies to layer l, as the lens does), scored by hand with log-softmax."""
    items = small_items["antonym"][:6]
    scorer = lm_scorer(handles[family])
    lens = cloze.lens_scores(scorer, items)
    tok = handles[family].tokenizer
    for layer in (0, 1):
        model = _truncated(handles[family].model, layer, family).eval()
        for i, it in enumerate(items):
            left, right = it.text.split(BLANK)
            for j, cand in enumerate(it.choices):
                ids, special, pos = scorer.encode_filled(i, left, cand, right)
                with torch.no_grad():
                    if family == "bert":
                        assert len(pos) == 1  # not/really are single pieces here
                        masked = ids.copy()
                        masked[pos] = tok.mask_token_id
                        logits = model(input_ids=torch.from_numpy(masked)[None]).logits[0]
                        want = torch.log_softmax(logits[pos[0]], -1)[ids[pos[0]]].item()
                    else:
                        row = scorer.causal_row(ids, special, "x")
                        logits = model(input_ids=torch.from_numpy(row)[None]).logits[0]
                        lp = torch.log_softmax(logits[:-1], -1)
                        want = lp[torch.arange(len(row) - 1), torch.tensor(row[1:])].sum().item()
                assert lens[layer, i, j] == pytest.approx(want, abs=1e-4)


def _cut(model, layers: int, family: str):
    """A copy of the LM with only its first `layers` blocks (seq2seq: decoder blocks; ELMo: LSTM
    layers of both directions); everything after the blocks (norms, head) is kept."""
    m = copy.deepcopy(model)
    if family == "t5":
        m.decoder.block = m.decoder.block[:layers]
    elif family == "bart":
        m.model.decoder.layers = m.model.decoder.layers[:layers]
    else:
        m.elmo.forward_lstms = m.elmo.forward_lstms[:layers]
        m.elmo.backward_lstms = m.elmo.backward_lstms[:layers]
    return m.eval()


@pytest.mark.parametrize("family", ["t5", "bart", "elmo"])
def test_lens_equals_cut_model_by_hand_seq2seq_and_elmo(handles, small_items, family):
    """Decoder layer l of T5/BART and layer l of ELMo through the head = the output of the same model
    cut after l blocks (T5: its decoder's final norm then applies to block l; BART: the head reads
    a post-LN layer directly; ELMo: the top is then layer l), scored by hand with log-softmax."""
    items = small_items["antonym"][:5]
    scorer = lm_scorer(handles[family])
    lens = cloze.lens_scores(scorer, items, batch_size=4)
    for layer in (0, 1):
        model = _cut(scorer.model, layer, family)
        for i, it in enumerate(items):
            left, right = it.text.split(BLANK)
            for j, cand in enumerate(it.choices):
                with torch.no_grad():
                    if family == "elmo":
                        ids = torch.from_numpy(scorer.encode_filled(i, left, cand, right)[0])[None]
                        o = model(input_ids=ids, return_logits=True)
                        f = torch.log_softmax(o.forward_logits[0], -1)
                        b = torch.log_softmax(o.backward_logits[0], -1)
                        n = ids.shape[1]
                        want = sum(float(f[t - 1, ids[0, t]]) for t in range(1, n)) + \
                            sum(float(b[t + 1, ids[0, t]]) for t in range(n - 1))
                    else:
                        src, tgt, first, _, _, _ = scorer.seq2seq_candidate_rows([(i, left, cand, right)])
                        dec = np.concatenate([[scorer.decoder_start_id], tgt[0][:-1]])
                        logits = model(input_ids=torch.from_numpy(src[0])[None],
                                       decoder_input_ids=torch.from_numpy(dec)[None]).logits[0]
                        lp = torch.log_softmax(logits, -1)
                        want = sum(float(lp[t, tgt[0][t]]) for t in range(first[0], len(tgt[0])))
                assert lens[layer, i, j] == pytest.approx(want, abs=1e-4), (family, layer, i, j)


def test_lens_rows_on_the_runner_for_seq2seq_and_elmo(handles, tmp_path, monkeypatch):
    """The probe writes lens rows for T5 (decoder stack, decoder layers 0..L) and ELMo; the last
    layer's accuracy equals the zero-shot accuracy."""
    from probes.core import runner
    from workbench.store.results import ResultsStore

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    settings = {"tasks": ("antonym",), "n_train": 40, "n_test": 20, "n_boot": 50, "progress": False,
                "baselines": ("majority",), "probe": False}
    for family in ("t5", "elmo"):
        _, rows = runner.run_probe(cloze.PROBE, [handles[family]], settings, store=ResultsStore(tmp_path / family))
        lens = rows[rows.metric == "lens_acc"].sort_values("layer")
        zs = rows[rows.metric == "zero_shot_acc"]
        assert set(lens["stack"]) == {LENS_STACK[family]}
        assert list(lens.layer) == list(range(handles[family].num_layers[LENS_STACK[family]] + 1))
        assert lens.value.iloc[-1] == pytest.approx(zs.value.iloc[0])


def test_zero_shot_lens_and_mc_head_cut_contexts_in_one_place(handles, small_items):
    """`lm_scores.filled_items` is the one home for cutting a context at its blank: zero-shot, the
    logit lens and the fine-tuning head all refuse a context with two blanks the same way."""
    items = small_items["antonym"][:2]
    ctx, cands = [it.text for it in items], [list(it.choices) for it in items]
    want = [(i, it.text[: it.text.index(BLANK)], c, it.text[it.text.index(BLANK) + len(BLANK):])
            for i, it in enumerate(items) for c in it.choices]
    assert filled_items(ctx, cands) == want
    bad = [items[0], dataclasses.replace(items[1], text=items[1].text + " " + BLANK)]
    for family in ("bert", "gpt"):
        scorer = lm_scorer(handles[family])
        for run in (cloze.zero_shot, cloze.lens_scores, cloze.MCHead):
            with pytest.raises(ConfigError, match=f"context 1 must hold exactly one {BLANK}"):
                run(scorer, bad)


def test_weighted_score_by_hand():
    # weights 3, 2, 1 for sizes 62 < 125 < 250 (given out of order)
    assert cloze.weighted_score([250, 62, 125], [0.9, 0.5, 0.6]) == pytest.approx((3 * 0.5 + 2 * 0.6 + 1 * 0.9) / 6)


@pytest.mark.slow
def test_finetuned_tiny_model_learns_age_comparison(tokenizers):
    """The learning-curve code can learn: a 2-layer BERT (hidden 32, random init) fine-tuned with the
    MC-MLM head on 500 age items answers > 90% of test items whose ages it never saw (numbers are
    split into digit pieces by the EWT WordPiece vocabulary)."""
    tok = tokenizers["bert"]
    items = ct.generate("age", seed=0, sizes={"train": 500, "dev": 10, "test": 500})
    scorer = lm_scorer(ModelHandle(tiny_bert(tok, hidden=32), tok))
    before = cloze.zero_shot(scorer, ct.split(items, "test"))[0].mean()
    res = cloze.finetune_mc(scorer, ct.split(items, "train"), ct.split(items, "test"), steps=300, lr=3e-3,
                            batch_size=32, seed=0)
    assert before < 0.7
    assert res["accuracy"] > 0.9, res
    # the copy was fine-tuned, not the model itself
    assert cloze.zero_shot(scorer, ct.split(items, "test"))[0].mean() == before


@pytest.mark.slow
def test_probe_on_the_runner(handles, tmp_path, monkeypatch):
    from probes.core import runner
    from workbench.store.results import ResultsStore

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    settings = {"tasks": ("age", "taxonomy"), "n_train": 60, "n_test": 30, "n_boot": 200, "progress": False,
                "curve_sizes": (20,), "curve_seeds": 2, "curve_steps": 3}
    _, rows = runner.run_probe(cloze.PROBE, [handles["bert"]], settings, store=ResultsStore(tmp_path / "runs"))
    real = rows[~rows.model.str.endswith("(random init)")]
    twin = rows[rows.model.str.endswith("(random init)")]
    m = lambda df, metric, task: df[(df.metric == metric) & (df.task == task)]
    L = handles["bert"].num_layers["encoder"]
    for task, k in (("age", 2), ("taxonomy", 3)):
        zs = m(real, "zero_shot_acc", task)
        assert len(zs) == 1 and 0 <= zs.value.iloc[0] <= 1 and zs.ci_low.iloc[0] <= zs.value.iloc[0] <= zs.ci_high.iloc[0]
        lens = m(real, "lens_acc", task).sort_values("layer")
        assert list(lens.layer) == list(range(L + 1))
        assert lens.value.iloc[-1] == pytest.approx(zs.value.iloc[0])
        assert m(real, "random_acc", task).value.iloc[0] == pytest.approx(1 / k)
        assert m(real, "majority_acc", task).value.iloc[0] == pytest.approx(1 / k)  # balanced splits
        assert len(m(real, "nonsense_acc", task)) == 1
        assert len(m(twin, "zero_shot_acc", task)) == 1
        # the learning curve per fine-tuning seed (one size, 2 seeds), no statistic over them stored
        assert len(m(real, "curve_acc", task)) == 2 and len(m(real, "weighted_score", task)) == 2
        assert m(real, "curve_acc_mean", task).empty
    # the blank probe: fixed-choice tasks only, every layer, with the control task
    assert sorted(m(real, "probe_acc", "age").layer) == list(range(L + 1))
    assert len(m(real, "control_acc", "age")) == L + 1
    sel = m(real, "selectivity", "age").sort_values("layer").value.to_numpy()
    acc = m(real, "probe_acc", "age").sort_values("layer").value.to_numpy()
    ctrl = m(real, "control_acc", "age").sort_values("layer").value.to_numpy()
    np.testing.assert_allclose(sel, acc - ctrl)
    assert m(real, "probe_acc", "taxonomy").empty
    assert "zero-shot" in cloze.summary(rows)


def test_bad_settings():
    from probes.core import runner
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="curve_sizes"):
        runner.resolve_settings(cloze.PROBE, {"curve_sizes": "1"}, "x")
    with pytest.raises(ConfigError, match="unknown task"):
        runner.resolve_settings(cloze.PROBE, {"tasks": "ages"}, "x")


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart", "elmo"])
def test_blank_topk_last_layer_is_the_models_own_prediction(handles, family):
    """The live cloze box: top-k at the blank for every layer; at the last layer, the family's own
    output distribution computed by hand from the full model's logits."""
    scorer = lm_scorer(handles[family])
    m, tok = scorer.model, handles[family].tokenizer
    left, right = "The keys to the ", " are on the table ."
    top = logit_lens.blank_topk(scorer, left + BLANK + right, k=4)
    L = handles[family].num_layers[LENS_STACK[family]]
    assert sorted(top.layer.unique()) == list(range(L + 1)) and (top.groupby("layer").size() == 4).all()
    with torch.no_grad():
        if family == "bert":
            enc = tok(left + tok.mask_token + right, return_tensors="pt")
            p = int((enc["input_ids"][0] == tok.mask_token_id).nonzero()[0, 0])
            lp = torch.log_softmax(m(**enc).logits[0, p], -1)
        elif family == "gpt":
            ids = [tok.eos_token_id] + tok(left.strip())["input_ids"]
            lp = torch.log_softmax(m(input_ids=torch.tensor([ids])).logits[0, -1], -1)
        elif family == "t5":
            s0 = next(s for s in ("<extra_id_0>", "<sentinel_0>") if s in tok.get_vocab())
            src = torch.tensor([tok(left + s0 + right)["input_ids"]])
            dec = torch.tensor([[m.config.decoder_start_token_id, tok.convert_tokens_to_ids(s0)]])
            lp = torch.log_softmax(m(input_ids=src, decoder_input_ids=dec).logits[0, -1], -1)
        elif family == "bart":
            src = torch.tensor([tok(left + tok.mask_token + right)["input_ids"]])
            dec = torch.tensor([[m.config.decoder_start_token_id] + tok(left.rstrip())["input_ids"][:-1]])
            lp = torch.log_softmax(m(input_ids=src, decoder_input_ids=dec).logits[0, -1], -1)
        else:
            ids = tok(left + "x" + right)["input_ids"]
            p = len(tok(left.rstrip())["input_ids"]) - 1  # where </S> of the left part stood: the blank
            o = m(input_ids=torch.tensor([ids]), return_logits=True)
            both = torch.log_softmax(o.forward_logits[0, p - 1], -1) + torch.log_softmax(o.backward_logits[0, p + 1], -1)
            lp = torch.log_softmax(both, -1)
    want = torch.topk(lp.exp(), 4)
    last = top[top.layer == L].sort_values("rank")
    assert last["id"].tolist() == want.indices.tolist()
    np.testing.assert_allclose(last["prob"].to_numpy(), want.values.numpy(), rtol=1e-4, atol=1e-6)
    assert not top[top.layer == 0]["prob"].equals(last["prob"].reset_index(drop=True))


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart", "elmo"])
def test_lens_nonsense_control_last_layer_equals_zero_shot_control(handles, small_items, family):
    """The language control through the lens: at the last layer, the same answers as the zero-shot
    control (the nonsense items scored by the model's own head)."""
    control = ct.nonsense_control(small_items["antonym"], seed=0)
    scorer = lm_scorer(handles[family])
    zs_correct, _ = cloze.zero_shot(scorer, control)
    lc = cloze.lens_correct(scorer, control, batch_size=5)
    assert lc.shape == (handles[family].num_layers[LENS_STACK[family]] + 1, len(control))
    np.testing.assert_array_equal(lc[-1], zs_correct)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bert", "t5"])
def test_lens_nonsense_rows_on_the_runner(handles, tmp_path, monkeypatch, family):
    """`lens_nonsense_acc` per layer (T5: the decoder's), scored against the same answers as the
    real items (the control keeps the answer distribution, item by item), equal to the lens
    recomputed on the control; its last layer = `nonsense_acc`; the gap = lens_acc minus it, with a
    paired CI around it; the printed table carries the three per layer."""
    from probes.core import runner
    from workbench.store.results import ResultsStore

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    values = {"tasks": ("age", "antonym"), "n_train": 40, "n_test": 30, "n_boot": 200, "progress": False,
              "baselines": ("majority",), "probe": False}
    _, rows = runner.run_probe(cloze.PROBE, [handles[family]], values, store=ResultsStore(tmp_path / "runs"))
    prepared = cloze.prepare(runner.resolve_settings(cloze.PROBE, values, "test"))
    scorer = lm_scorer(handles[family])
    L = handles[family].num_layers[LENS_STACK[family]]
    for task in values["tasks"]:
        test, control = prepared.data[task]["test"], prepared.data[task]["nonsense"]
        assert [c.answer for c in control] == [it.answer for it in test]
        got = {m: rows[(rows.metric == m) & (rows.task == task)].sort_values("layer")
               for m in ("lens_acc", "lens_nonsense_acc", "lens_nonsense_gap", "nonsense_acc")}
        ctl = got["lens_nonsense_acc"]
        assert list(ctl.layer) == list(range(L + 1)) and set(ctl["stack"]) == {LENS_STACK[family]}
        assert (ctl.n == len(test)).all()
        np.testing.assert_allclose(ctl.value, cloze.lens_correct(scorer, control).mean(1))
        assert ctl.value.iloc[-1] == pytest.approx(got["nonsense_acc"].value.item())
        gap = got["lens_nonsense_gap"]
        np.testing.assert_allclose(gap.value, got["lens_acc"].value.to_numpy() - ctl.value.to_numpy(), atol=1e-12)
        assert (gap.ci_low <= gap.value + 1e-12).all() and (gap.value <= gap.ci_high + 1e-12).all()
    text = cloze.summary(rows)
    assert "Logit lens by layer" in text and "lens - control" in text and "lens nonsense there" in text


@pytest.mark.pins
def test_finetune_mc_keeps_its_pinned_results(tokenizers):
    """The MC-head fine-tuning gives the per-step losses and accuracy recorded before the loops were
    shared (tests/weight_pins.py): every loss depends on all earlier updates, so equal losses
    mean equal weights at every step."""
    from tests.weight_pins import check_pin

    tok = tokenizers["bert"]
    items = ct.generate("age", seed=0, sizes={"train": 40, "dev": 4, "test": 24})
    scorer = lm_scorer(ModelHandle(tiny_bert(tok, hidden=32), tok))
    res = cloze.finetune_mc(scorer, ct.split(items, "train"), ct.split(items, "test"), steps=12, lr=3e-3,
                            batch_size=8, seed=0)
    check_pin("cloze/finetune_mc/bert", repr((res["accuracy"], res["train_loss"])))
