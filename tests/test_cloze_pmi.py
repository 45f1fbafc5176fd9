"""Calibrated cloze scoring (probes/cloze/scoring.py, `scoring: raw,contextual,pmi_dc`): contextual
calibration (Zhao et al. 2021) = the candidate's raw score minus its raw score in the content-free
template; domain-conditional PMI (Holtzman et al. 2021) = the answer's tokens after the item and
the task's domain premise minus after the premise alone. A planted toy head whose frequent word
wins by the raw rule and loses by either calibration, checked against scores computed by hand; each
rule's exact arithmetic for every head type (tiny random models); answer-only scores against the
per-token log-probs of the full-text scorers; the lens' last layer = the zero-shot rule; the
[MASK] slots of a content-free PLL unscored; rows, run identity, bad values, the retired "pmi"."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from probes import cloze
from probes.cloze import rows as cloze_rows
from probes.cloze import tasks as ct
from tests.test_cloze import LENS_STACK, handles, small_items  # noqa: F401 (fixtures)
from workbench.errors import ConfigError
from workbench.running.lm_scores import CandidateScores, lm_scorer
from workbench.running.lm_inputs import BLANK, filled_items

AGE_PREMISE = "A N/A year old person is " + BLANK + " than me in age, if I am a N/A year old person."
AGE_DOMAIN = "In age, the first person is " + BLANK + "."


class PriorLM:
    """A toy causal head with a strong prior for the frequent word "older": in a sentence without
    two ages (the content-free template, the domain premise, a nonsense item) P(younger) = 0.2,
    P(older) = 0.8; with two ages it reads them, but not enough to beat the prior when the answer
    is "younger": P = (0.4, 0.6) for a younger first person, (0.1, 0.9) for an older one. It
    records each call's contexts and whether only the answer's tokens were asked for."""

    kind = "causal"
    handle = None

    def __init__(self):
        self.calls: list[tuple[list[str], bool]] = []

    def score_candidates(self, contexts, candidates, batch_size=32, answer_only=False) -> CandidateScores:
        self.calls.append((list(contexts), answer_only))
        out = []
        for ctx, cands in zip(contexts, candidates):
            ages = [int(a) for a in re.findall(r"\d+", ctx)]
            if len(ages) != 2:
                p = {"younger": 0.2, "older": 0.8}
            elif ages[0] < ages[1]:
                p = {"younger": 0.4, "older": 0.6}
            else:
                p = {"younger": 0.1, "older": 0.9}
            out.append([math.log(p[c]) for c in cands])
        return CandidateScores(out, [["toy"] * len(c) for c in candidates], [[1] * len(c) for c in candidates])


@pytest.fixture(scope="module")
def age_items():
    items = ct.split(ct.generate("age", seed=0, sizes={"train": 10, "dev": 10, "test": 20}), "test")
    assert [it.choices for it in items] == [("younger", "older")] * 20 and {it.answer for it in items} == {0, 1}
    return items


@pytest.mark.parametrize("rule", ["contextual", "pmi_dc"])
def test_planted_prior_raw_picks_the_frequent_word_calibration_the_right_one(age_items, rule):
    head = PriorLM()
    raw_correct, raw = cloze.zero_shot(head, age_items, scoring="raw")
    head = PriorLM()
    cal_correct, cal = cloze.zero_shot(head, age_items, scoring=rule)
    # by hand: younger items raw (log .4, log .6) -> "older", wrong; calibrated (log .4/.2, log .6/.8) =
    # (log 2, log .75) -> "younger", right. Older items raw (log .1, log .9) -> right; calibrated
    # (log .5, log 1.125) -> right.
    for it, r, p in zip(age_items, raw.scores, cal.scores):
        if it.answer == 0:
            assert r == pytest.approx([math.log(0.4), math.log(0.6)], abs=1e-12)
            assert p == pytest.approx([math.log(2.0), math.log(0.75)], abs=1e-12)
        else:
            assert r == pytest.approx([math.log(0.1), math.log(0.9)], abs=1e-12)
            assert p == pytest.approx([math.log(0.5), math.log(1.125)], abs=1e-12)
    assert raw_correct.mean() == 0.5  # always "older" on balanced items
    assert cal_correct.all()
    (first, first_answer_only), (ref, ref_answer_only) = head.calls
    if rule == "contextual":  # the raw rule on the items, then on the template with N/A, scored once
        assert first == [it.text for it in age_items] and not first_answer_only
        assert ref == [AGE_PREMISE] and not ref_answer_only
    else:  # the answer's tokens after the item and the domain premise, then after the premise alone, once
        assert first == [it.text.replace(BLANK, "___") + " " + AGE_DOMAIN for it in age_items] and first_answer_only
        assert ref == [AGE_DOMAIN] and ref_answer_only


def test_planted_prior_through_the_runner(handles, tmp_path, monkeypatch):  # noqa: F811
    """`scoring: raw,contextual,pmi_dc` on the runner: the three rules' rows side by side under
    their own metric names, the rule in every row's extra, the setting in the run's manifest and
    resume key."""
    from probes.core import runner
    from workbench.store.results import ResultsStore, decode_extra

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cloze_rows, "lm_scorer", lambda handle: PriorLM())
    values = {"tasks": ("age",), "n_train": 20, "n_test": 20, "n_boot": 50, "progress": False,
              "baselines": ("majority",), "probe": False, "lens": False, "scoring": ("raw", "contextual", "pmi_dc")}
    store = ResultsStore(tmp_path / "runs")
    run_id, rows = runner.run_probe(cloze.PROBE, [handles["gpt"]], values, store=store)
    v = lambda m: rows.loc[rows.metric == m, "value"].item()  # noqa: E731
    assert v("zero_shot_acc") == 0.5 and v("zero_shot_contextual_acc") == 1.0 and v("zero_shot_pmi_dc_acc") == 1.0
    # nonsense words: no ages, so the reference distribution itself: raw "older" (0.5 on balanced
    # items), calibrated a tie (0, 0) -> the first choice (0.5)
    assert v("nonsense_acc") == 0.5 and v("nonsense_contextual_acc") == 0.5 and v("nonsense_pmi_dc_acc") == 0.5
    extra = {m: decode_extra(rows.loc[rows.metric == m, "extra"].item())
             for m in ("zero_shot_acc", "zero_shot_contextual_acc", "zero_shot_pmi_dc_acc", "nonsense_acc",
                       "nonsense_contextual_acc")}
    # the control's own answers: without ages the toy always says "older" raw, and ties (the
    # first choice) calibrated
    assert extra["nonsense_acc"]["answer_counts"] == [0, 20]
    assert extra["nonsense_contextual_acc"]["answer_counts"] == [20, 0]
    assert extra["zero_shot_acc"]["scoring"] == "raw"
    assert extra["zero_shot_acc"]["answer_counts"] == [0, 20]  # the prior: always "older"
    assert extra["zero_shot_contextual_acc"]["answer_counts"] == [10, 10]  # the balanced answers
    assert extra["zero_shot_contextual_acc"]["scoring"] == "contextual"
    assert extra["zero_shot_contextual_acc"]["content_free_word"] == "N/A"
    assert extra["zero_shot_contextual_acc"]["domain_premise"] == AGE_PREMISE
    assert extra["zero_shot_pmi_dc_acc"]["scoring"] == "pmi_dc"
    assert extra["zero_shot_pmi_dc_acc"]["domain_premise"] == AGE_DOMAIN
    assert "content_free_word" not in extra["zero_shot_pmi_dc_acc"]
    assert store.manifest(run_id)["config"]["scoring"] == ["raw", "contextual", "pmi_dc"]
    text = cloze.summary(rows)
    assert "zero-shot contextual" in text and "zero-shot PMI_DC" in text and "1.000" in text
    # raw only (the default) writes no calibrated rows and names the rule raw
    _, raw_rows = runner.run_probe(cloze.PROBE, [handles["gpt"]], {**values, "scoring": ("raw",)}, store=store)
    assert not raw_rows.metric.str.contains("contextual|pmi").any()
    assert "contextual" not in cloze.summary(raw_rows) and "PMI" not in cloze.summary(raw_rows)


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart", "elmo"])
def test_each_rule_is_its_two_terms_exactly(handles, small_items, family):  # noqa: F811
    """For every head type: contextual = raw score - raw score in the content-free item, and
    pmi_dc = answer-only score after the item and its domain premise - answer-only score after the
    premise alone, bit for bit (one sentence per forward on both sides, so the same arithmetic);
    the content-free word is the mask token for the masked LM, N/A otherwise."""
    items = small_items["antonym"][:4] + small_items["age"][:4]
    scorer = lm_scorer(handles[family])
    word = cloze.content_free_word(scorer)
    assert word == (handles[family].tokenizer.mask_token if family == "bert" else "N/A")
    ctx, cands, _ = cloze.contexts_of(items)
    score = lambda texts, **kw: np.array(scorer.score_candidates(texts, cands, batch_size=1, **kw).scores)  # noqa: E731
    raw = score(ctx)
    free = score([it.text for it in ct.content_free(items, word)])
    framed = score([it.text for it in ct.in_domain(items)], answer_only=True)
    domain = score([it.text for it in ct.domain_only(items)], answer_only=True)
    _, contextual = cloze.zero_shot(scorer, items, batch_size=1, scoring="contextual")
    _, pmi_dc = cloze.zero_shot(scorer, items, batch_size=1, scoring="pmi_dc")
    np.testing.assert_array_equal(np.array(contextual.scores), raw - free)
    np.testing.assert_array_equal(np.array(pmi_dc.scores), framed - domain)
    assert not np.array_equal(free[0], raw[0]) and not np.array_equal(framed[0], domain[0])  # other sentences
    # the domain premise is one text per task: antonym's four items share one reference, age's four another
    assert len({tuple(d) for d in domain[:4]}) == 1 and len({tuple(d) for d in domain[4:]}) == 1
    assert {m for ms in pmi_dc.method for m in ms} <= {"mask", "pll-answer", "causal-answer", "bilm-answer",
                                                       "seq2seq-sentinel-answer", "seq2seq-infill-answer"}
    # the raw rule itself is unchanged by the options
    _, again = cloze.zero_shot(scorer, items, batch_size=1)
    np.testing.assert_array_equal(np.array(again.scores), raw)


@pytest.mark.parametrize("family", ["bert", "gpt", "elmo"])
def test_answer_only_scores_are_the_answer_tokens_log_probs(handles, small_items, family):  # noqa: F811
    """`answer_only` against the full-text scorers' per-token log-probs (causal LM, ELMo's two
    LMs, a masked LM's PLL): the sum over exactly the candidate's pieces, nothing else."""
    items = ct.in_domain(small_items["age"][:3] + small_items["multihop"][:3])
    scorer = lm_scorer(handles[family])
    ctx, cands, _ = cloze.contexts_of(items)
    got = scorer.score_candidates(ctx, cands, answer_only=True).scores
    whole = scorer.score_candidates(ctx, cands).scores
    for i, left, cand, right in filled_items(ctx, cands):
        ids, special, pos = scorer.encode_filled(i, left, cand, right)
        ts = scorer.text_logprobs([left + cand + right])[0]
        if family == "bert":  # the PLL scores the non-special tokens, in order
            k = np.searchsorted(np.nonzero(~special)[0], pos)
        else:  # causal: the scored ids are the row after its first token; ELMo: every token
            k = pos + (len(ts.ids) - len(ids))
        np.testing.assert_array_equal(ts.ids[k], ids[pos])
        j = list(cands[i]).index(cand)
        assert got[i][j] == pytest.approx(float(ts.logprobs[k].sum()), rel=1e-5, abs=1e-4)
        if family != "bert" or len(pos) > 1 or any(len(scorer.encode_filled(i, left, c, right)[2]) > 1
                                                   for c in cands[i]):
            assert got[i][j] > whole[i][j]  # the whole sentence adds the other tokens' log p < 0


@pytest.mark.parametrize("family", ["t5", "bart"])
def test_answer_only_seq2seq_leaves_out_the_other_target_tokens(handles, small_items, family):  # noqa: F811
    """T5: the candidate's pieces without the closing sentinel; BART: its pieces of the infilled
    sentence. Each is the raw target score minus the other target tokens' log p, read here from
    the scorer's full target log-probs."""
    items = ct.in_domain(small_items["age"][:3])
    scorer = lm_scorer(handles[family])
    ctx, cands, _ = cloze.contexts_of(items)
    got = scorer.score_candidates(ctx, cands, answer_only=True).scores
    whole = scorer.score_candidates(ctx, cands).scores
    for n, (i, left, cand, right) in enumerate(filled_items(ctx, cands)):
        src, tgt, first, _, _, answer = scorer.seq2seq_candidate_rows([(i, left, cand, right)])
        full = scorer._seq2seq_scores(src, tgt, [0], 1, False, False)[0][0]
        j = list(cands[i]).index(cand)
        assert got[i][j] == pytest.approx(float(full[answer[0]].sum()), rel=1e-6, abs=1e-6)
        assert whole[i][j] == pytest.approx(float(full[first[0]:].sum()), rel=1e-6, abs=1e-6)
        assert got[i][j] > whole[i][j]


@pytest.mark.parametrize("rule", ["contextual", "pmi_dc"])
@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart", "elmo"])
def test_lens_calibrated_last_layer_equals_zero_shot(handles, small_items, family, rule):  # noqa: F811
    items = small_items["antonym"]
    scorer = lm_scorer(handles[family])
    correct, scores = cloze.zero_shot(scorer, items, scoring=rule)
    lens = cloze.lens_scores(scorer, items, batch_size=7, scoring=rule)
    raw_lens = cloze.lens_scores(scorer, items, batch_size=7)
    L = handles[family].num_layers[LENS_STACK[family]]
    assert lens.shape == raw_lens.shape == (L + 1, len(items), 2)
    # two lens scores, each within the existing lens-vs-zero-shot tolerance
    np.testing.assert_allclose(lens[-1], np.array(scores.scores), rtol=2e-5, atol=2e-4)
    assert not np.allclose(lens, raw_lens)
    s = np.array(scores.scores)
    clear = np.abs(s[:, 0] - s[:, 1]) > 1e-3  # no near-ties, where float noise may pick either
    lc = cloze.lens_correct(scorer, items, batch_size=7, scoring=rule)
    np.testing.assert_array_equal(lc[-1][clear], correct[clear])


def test_content_free_pll_leaves_the_mask_slots_unscored(handles):  # noqa: F811
    """A masked LM scoring a content-free context by PLL (a candidate of several pieces) scores
    the template's words and the candidate, never the [MASK] written for a content word: its
    log p would depend on the candidate beside it. By hand: the PLL's per-token log-probs of the
    filled text (which does score the mask slots, as text) summed without them."""
    scorer = lm_scorer(handles["bert"])
    mask = handles["bert"].tokenizer.mask_token
    text = f"It was {BLANK} {mask}, it was really {mask}."
    cands = ["not", "internationalization"]  # the second is several pieces: the context goes to PLL
    got = scorer.score_candidates([text], [cands])
    assert got.method == [["pll", "pll"]] and got.n_pieces[0][1] > 1
    left, right = text.split(BLANK)
    for j, cand in enumerate(cands):
        ts = scorer.text_logprobs([left + cand + right])[0]
        slots = ts.ids == scorer.mask_id
        assert slots.sum() == 2  # the text scorer reads them as tokens
        assert got.scores[0][j] == pytest.approx(float(ts.logprobs[~slots].sum()), rel=1e-5, abs=1e-4)
        assert got.scores[0][j] != pytest.approx(float(ts.logprobs.sum()), rel=1e-5, abs=1e-4)


def test_content_free_items_by_hand():
    items = ct.split(ct.generate("objects", seed=0, sizes={"train": 10, "dev": 10, "test": 10}), "test")
    cf = ct.content_free(items, "[MASK]")
    assert {it.text for it in cf} == {"The size of a [MASK] is " + BLANK + " than the size of a [MASK]."}
    assert [(c.choices, c.answer) for c in cf] == [(it.choices, it.answer) for it in items]
    for bad in ("", "two words", "{0}", BLANK):
        with pytest.raises(ConfigError, match="content-free word"):
            ct.content_free(items, bad)


@pytest.mark.parametrize("value,message", [
    ("bogus", "scoring must be a subset of raw,contextual,pmi_dc"), ("", "scoring must be a subset"),
    ("raw,raw", "scoring must be a subset"), ("raw,PMI_DC", "scoring must be a subset"),
    ("pmi", "'pmi' was two rules under one name; use 'contextual' .* or 'pmi_dc'"),
    ("raw,pmi", "'pmi' was two rules under one name")])
def test_bad_scoring_is_one_line_and_exit_2_before_any_work(value, message, tmp_path, capsys, monkeypatch):
    from app.cli import main
    from probes.core import runner

    with pytest.raises(ConfigError, match=message):
        runner.resolve_settings(cloze.PROBE, {"scoring": value}, "x")
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    # a checkpoint that does not exist: the settings fail first, nothing is loaded or written
    assert main(["probe", "cloze", "--checkpoint", str(tmp_path / "none"), "--scoring", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "scoring" in err and err.startswith("bertology: error:")
    results = tmp_path / "runs" / "results"  # the CLI opens the store; no run, no partial unit in it
    assert not [p for p in results.glob("*") if not p.name.startswith(".")] if results.exists() else True
    assert not (tmp_path / "runs" / "partials").exists()
    if "," not in value:  # one rule: refused by the scoring functions themselves too
        with pytest.raises(ConfigError, match=message):
            cloze.zero_shot(PriorLM(), [], scoring=value)


def test_metric_names_of_the_rules():
    names = ("zero_shot_acc", "nonsense_acc", "lens_acc", "lens_nonsense_acc", "lens_nonsense_gap")
    assert [cloze.metric_name(m, "raw") for m in names] == list(names)
    assert [cloze.metric_name(m, "contextual") for m in names] == [
        "zero_shot_contextual_acc", "nonsense_contextual_acc", "lens_contextual_acc", "lens_nonsense_contextual_acc",
        "lens_nonsense_contextual_gap"]
    assert [cloze.metric_name(m, "pmi_dc") for m in names] == [
        "zero_shot_pmi_dc_acc", "nonsense_pmi_dc_acc", "lens_pmi_dc_acc", "lens_nonsense_pmi_dc_acc",
        "lens_nonsense_pmi_dc_gap"]


def test_an_older_runs_pmi_rows_read_as_contextual():
    """Rows stored before issue 49 name the content-free rule "pmi": the summary shows them in the
    contextual columns and lens block, never as domain-conditional PMI."""
    import pandas as pd

    def row(metric, value, layer=2.0):
        return {"model": "m", "task": "age", "metric": metric, "value": value, "ci_low": np.nan, "ci_high": np.nan,
                "layer": layer, "stack": "decoder", "extra": "{}"}
    old = pd.DataFrame([row("zero_shot_acc", 0.5), row("zero_shot_pmi_acc", 0.625), row("nonsense_pmi_acc", 0.375),
                        row("lens_pmi_acc", 0.625, 0.0), row("lens_nonsense_pmi_acc", 0.5, 0.0),
                        row("lens_pmi_acc", 0.75, 1.0), row("lens_nonsense_pmi_acc", 0.25, 1.0)])
    text = cloze.summary(old)
    header, line = text.splitlines()[:2]
    assert "zero-shot contextual" in header and "PMI_DC" not in text
    assert "0.625" in line and "0.375" in line
    assert "contextual calibration" in text and "0.750" in text
    assert cloze.lens_layer_table(old, "contextual")[1:] == [["m", "age", "decoder", "0", "0.625", "0.500", "-"],
                                                             ["m", "age", "decoder", "1", "0.750", "0.250", "-"]]


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_calibrated_rows_with_the_lens_on_the_runner(handles, tmp_path, monkeypatch, family):  # noqa: F811
    """A real (tiny) head through the runner with the three rules, the lens and the control: each
    rule's rows equal the rule recomputed outside the runner, the raw rows are those of a raw-only
    run, and the summary prints each rule's lens block."""
    from probes.core import runner
    from workbench.store.results import ResultsStore, decode_extra

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    values = {"tasks": ("age",), "n_train": 20, "n_test": 20, "n_boot": 50, "progress": False,
              "baselines": ("majority",), "probe": False, "scoring": ("raw", "contextual", "pmi_dc")}
    store = ResultsStore(tmp_path / "runs")
    _, rows = runner.run_probe(cloze.PROBE, [handles[family]], values, store=store)
    _, raw_rows = runner.run_probe(cloze.PROBE, [handles[family]], {**values, "scoring": ("raw",)}, store=store)
    prepared = cloze.prepare(runner.resolve_settings(cloze.PROBE, values, "test"))
    test, control = prepared.data["age"]["test"], prepared.data["age"]["nonsense"]
    scorer = lm_scorer(handles[family])
    L = handles[family].num_layers[LENS_STACK[family]]
    get = lambda df, m: df[df.metric == m].sort_values("layer")  # noqa: E731
    for m in ("zero_shot_acc", "nonsense_acc", "lens_acc", "lens_nonsense_acc", "lens_nonsense_gap"):
        np.testing.assert_array_equal(get(rows, m).value, get(raw_rows, m).value)
    for rule in ("contextual", "pmi_dc"):
        name = lambda m: cloze.metric_name(m, rule)  # noqa: E731
        for m in ("zero_shot_acc", "nonsense_acc", "lens_acc", "lens_nonsense_acc", "lens_nonsense_gap"):
            assert get(rows, name(m)).value.notna().all()
        assert get(rows, name("zero_shot_acc")).value.item() == cloze.zero_shot(scorer, test, scoring=rule)[0].mean()
        assert get(rows, name("nonsense_acc")).value.item() == cloze.zero_shot(scorer, control, scoring=rule)[0].mean()
        lens = get(rows, name("lens_acc"))
        assert list(lens.layer) == list(range(L + 1))
        np.testing.assert_allclose(lens.value, cloze.lens_correct(scorer, test, scoring=rule).mean(1))
        np.testing.assert_allclose(get(rows, name("lens_nonsense_acc")).value,
                                   cloze.lens_correct(scorer, control, scoring=rule).mean(1))
        assert {decode_extra(e)["scoring"] for e in lens.extra} == {rule}
    assert {decode_extra(e)["scoring"] for e in get(rows, "lens_acc").extra} == {"raw"}
    text = cloze.summary(rows)
    assert "contextual calibration" in text and "domain-conditional PMI" in text
    assert "contextual" not in cloze.summary(raw_rows) and "PMI" not in cloze.summary(raw_rows)
