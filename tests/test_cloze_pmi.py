"""Calibrated cloze scoring (probes/cloze/scoring.py, `scoring: raw|pmi`): domain-conditional PMI
(Holtzman et al. 2021) = the candidate's raw score minus its raw score in the content-free
template. A planted toy head whose frequent word wins by the raw rule and loses by PMI, checked
against scores computed by hand; PMI = raw - content-free exactly for every head type (tiny random
models); the lens' last layer = the zero-shot PMI rule; rows, run identity, bad values."""

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
from workbench.running.lm_inputs import BLANK

AGE_PREMISE = "A N/A year old person is " + BLANK + " than me in age, if I am a N/A year old person."


class PriorLM:
    """A toy causal head with a strong prior for the frequent word "older": in a sentence without
    two ages (the content-free template, a nonsense item) P(younger) = 0.2, P(older) = 0.8; with
    two ages it reads them, but not enough to beat the prior when the answer is "younger":
    P = (0.4, 0.6) for a younger first person, (0.1, 0.9) for an older one."""

    kind = "causal"
    handle = None

    def __init__(self):
        self.contexts: list[str] = []

    def score_candidates(self, contexts, candidates, batch_size=32) -> CandidateScores:
        self.contexts += list(contexts)
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


def test_planted_prior_raw_picks_the_frequent_word_pmi_the_right_one(age_items):
    head = PriorLM()
    raw_correct, raw = cloze.zero_shot(head, age_items, scoring="raw")
    head = PriorLM()
    pmi_correct, pmi = cloze.zero_shot(head, age_items, scoring="pmi")
    # by hand: younger items raw (log .4, log .6) -> "older", wrong; PMI (log .4/.2, log .6/.8) = (log 2, log .75)
    # -> "younger", right. Older items raw (log .1, log .9) -> right; PMI (log .5, log 1.125) -> right.
    for it, r, p in zip(age_items, raw.scores, pmi.scores):
        if it.answer == 0:
            assert r == pytest.approx([math.log(0.4), math.log(0.6)], abs=1e-12)
            assert p == pytest.approx([math.log(2.0), math.log(0.75)], abs=1e-12)
        else:
            assert r == pytest.approx([math.log(0.1), math.log(0.9)], abs=1e-12)
            assert p == pytest.approx([math.log(0.5), math.log(1.125)], abs=1e-12)
    assert raw_correct.mean() == 0.5  # always "older" on balanced items
    assert pmi_correct.all()
    # the domain premise: the template with N/A for both ages, scored once for all 20 items
    assert head.contexts[20:] == [AGE_PREMISE]


def test_planted_prior_through_the_runner(handles, tmp_path, monkeypatch):  # noqa: F811
    """`scoring: raw,pmi` on the runner: both rules' rows side by side under their own metric names,
    the rule in every row's extra, the setting in the run's manifest and resume key."""
    from probes.core import runner
    from workbench.store.results import ResultsStore, decode_extra

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cloze_rows, "lm_scorer", lambda handle: PriorLM())
    values = {"tasks": ("age",), "n_train": 20, "n_test": 20, "n_boot": 50, "progress": False,
              "baselines": ("majority",), "probe": False, "lens": False, "scoring": ("raw", "pmi")}
    store = ResultsStore(tmp_path / "runs")
    run_id, rows = runner.run_probe(cloze.PROBE, [handles["gpt"]], values, store=store)
    v = lambda m: rows.loc[rows.metric == m, "value"].item()  # noqa: E731
    assert v("zero_shot_acc") == 0.5 and v("zero_shot_pmi_acc") == 1.0
    # nonsense words: no ages, so the content-free distribution itself: raw "older" (0.5 on balanced
    # items), PMI a tie (0, 0) -> the first choice (0.5)
    assert v("nonsense_acc") == 0.5 and v("nonsense_pmi_acc") == 0.5
    extra = {m: decode_extra(rows.loc[rows.metric == m, "extra"].item()) for m in ("zero_shot_acc", "zero_shot_pmi_acc")}
    assert extra["zero_shot_acc"]["scoring"] == "raw"
    assert extra["zero_shot_acc"]["answer_counts"] == [0, 20]  # the prior: always "older"
    assert extra["zero_shot_pmi_acc"]["answer_counts"] == [10, 10]  # the balanced answers
    assert extra["zero_shot_pmi_acc"]["scoring"] == "pmi"
    assert extra["zero_shot_pmi_acc"]["content_free_word"] == "N/A"
    assert extra["zero_shot_pmi_acc"]["domain_premise"] == AGE_PREMISE
    assert store.manifest(run_id)["config"]["scoring"] == ["raw", "pmi"]
    text = cloze.summary(rows)
    assert "zero-shot PMI" in text and "1.000" in text
    # raw only (the default) writes no PMI rows and names the rule raw
    _, raw_rows = runner.run_probe(cloze.PROBE, [handles["gpt"]], {**values, "scoring": ("raw",)}, store=store)
    assert not raw_rows.metric.str.contains("pmi").any()
    assert "PMI" not in cloze.summary(raw_rows)


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart", "elmo"])
def test_pmi_is_raw_minus_content_free_exactly(handles, small_items, family):  # noqa: F811
    """For every head type: the PMI score of each candidate is its raw score minus its raw score in
    the content-free item, bit for bit (one sentence per forward on both sides, so the same
    arithmetic); the content-free word is the mask token for the masked LM, N/A otherwise."""
    items = small_items["antonym"][:4] + small_items["age"][:4]
    scorer = lm_scorer(handles[family])
    word = cloze.content_free_word(scorer)
    assert word == (handles[family].tokenizer.mask_token if family == "bert" else "N/A")
    cf = ct.content_free(items, word)
    ctx, cands, _ = cloze.contexts_of(items)
    raw = scorer.score_candidates(ctx, cands, batch_size=1).scores
    free = scorer.score_candidates([it.text for it in cf], cands, batch_size=1).scores
    _, pmi = cloze.zero_shot(scorer, items, batch_size=1, scoring="pmi")
    np.testing.assert_array_equal(np.array(pmi.scores), np.array(raw) - np.array(free))
    assert not np.allclose(free[0], raw[0])  # the content-free context is another sentence
    # the raw rule itself is unchanged by the option
    _, again = cloze.zero_shot(scorer, items, batch_size=1)
    assert again.scores == raw


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart", "elmo"])
def test_lens_pmi_last_layer_equals_zero_shot_pmi(handles, small_items, family):  # noqa: F811
    items = small_items["antonym"]
    scorer = lm_scorer(handles[family])
    correct, scores = cloze.zero_shot(scorer, items, scoring="pmi")
    lens = cloze.lens_scores(scorer, items, batch_size=7, scoring="pmi")
    raw_lens = cloze.lens_scores(scorer, items, batch_size=7)
    L = handles[family].num_layers[LENS_STACK[family]]
    assert lens.shape == raw_lens.shape == (L + 1, len(items), 2)
    # two lens scores, each within the existing lens-vs-zero-shot tolerance
    np.testing.assert_allclose(lens[-1], np.array(scores.scores), rtol=2e-5, atol=2e-4)
    assert not np.allclose(lens, raw_lens)
    s = np.array(scores.scores)
    clear = np.abs(s[:, 0] - s[:, 1]) > 1e-3  # no near-ties, where float noise may pick either
    lc = cloze.lens_correct(scorer, items, batch_size=7, scoring="pmi")
    np.testing.assert_array_equal(lc[-1][clear], correct[clear])


def test_content_free_items_by_hand():
    items = ct.split(ct.generate("objects", seed=0, sizes={"train": 10, "dev": 10, "test": 10}), "test")
    cf = ct.content_free(items, "[MASK]")
    assert {it.text for it in cf} == {"The size of a [MASK] is " + BLANK + " than the size of a [MASK]."}
    assert [(c.choices, c.answer) for c in cf] == [(it.choices, it.answer) for it in items]
    for bad in ("", "two words", "{0}", BLANK):
        with pytest.raises(ConfigError, match="content-free word"):
            ct.content_free(items, bad)


@pytest.mark.parametrize("value", ["bogus", "", "raw,raw", "raw,PMI"])
def test_bad_scoring_is_one_line_and_exit_2_before_any_work(value, tmp_path, capsys, monkeypatch):
    from app.cli import main
    from probes.core import runner

    with pytest.raises(ConfigError, match="scoring must be one or both of raw,pmi"):
        runner.resolve_settings(cloze.PROBE, {"scoring": value}, "x")
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    # a checkpoint that does not exist: the settings fail first, nothing is loaded or written
    assert main(["probe", "cloze", "--checkpoint", str(tmp_path / "none"), "--scoring", value]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "scoring" in err and err.startswith("bertology: error:")
    results = tmp_path / "runs" / "results"  # the CLI opens the store; no run, no partial unit in it
    assert not [p for p in results.glob("*") if not p.name.startswith(".")] if results.exists() else True
    assert not (tmp_path / "runs" / "partials").exists()
    with pytest.raises(ConfigError, match="scoring must be one of"):
        cloze.zero_shot(PriorLM(), [], scoring=value)


def test_metric_names_of_the_two_rules():
    names = ("zero_shot_acc", "nonsense_acc", "lens_acc", "lens_nonsense_acc", "lens_nonsense_gap")
    assert [cloze.metric_name(m, "raw") for m in names] == list(names)
    assert [cloze.metric_name(m, "pmi") for m in names] == [
        "zero_shot_pmi_acc", "nonsense_pmi_acc", "lens_pmi_acc", "lens_nonsense_pmi_acc", "lens_nonsense_pmi_gap"]


@pytest.mark.parametrize("family", ["bert", "t5"])
def test_pmi_rows_with_the_lens_on_the_runner(handles, tmp_path, monkeypatch, family):  # noqa: F811
    """A real (tiny) head through the runner with both rules, the lens and the control: each rule's
    rows equal the rule recomputed outside the runner, the raw rows are those of a raw-only run,
    and the summary prints the PMI lens block."""
    from probes.core import runner
    from workbench.store.results import ResultsStore, decode_extra

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    values = {"tasks": ("age",), "n_train": 20, "n_test": 20, "n_boot": 50, "progress": False,
              "baselines": ("majority",), "probe": False, "scoring": ("raw", "pmi")}
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
        assert get(rows, cloze.metric_name(m, "pmi")).value.notna().all()
    assert get(rows, "zero_shot_pmi_acc").value.item() == cloze.zero_shot(scorer, test, scoring="pmi")[0].mean()
    assert get(rows, "nonsense_pmi_acc").value.item() == cloze.zero_shot(scorer, control, scoring="pmi")[0].mean()
    lens = get(rows, "lens_pmi_acc")
    assert list(lens.layer) == list(range(L + 1))
    np.testing.assert_allclose(lens.value, cloze.lens_correct(scorer, test, scoring="pmi").mean(1))
    np.testing.assert_allclose(get(rows, "lens_nonsense_pmi_acc").value,
                               cloze.lens_correct(scorer, control, scoring="pmi").mean(1))
    assert {decode_extra(e)["scoring"] for e in lens.extra} == {"pmi"}
    assert {decode_extra(e)["scoring"] for e in get(rows, "lens_acc").extra} == {"raw"}
    assert "PMI-calibrated" in cloze.summary(rows) and "PMI" not in cloze.summary(raw_rows)
