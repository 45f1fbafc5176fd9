"""oLMpics-style cloze task generators (probes/cloze/tasks.py), on the real WordNet 3.0."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from probes.cloze import tasks as ct
from workbench.running.lm_inputs import BLANK


@pytest.fixture(scope="module")
def generated() -> dict:
    return {t: ct.generate(t, seed=0) for t in ct.TASKS}


@pytest.mark.parametrize("task", ct.TASKS)
def test_deterministic_per_seed(generated, task):
    assert ct.generate(task, seed=0) == generated[task]
    other = ct.generate(task, seed=1)
    assert [it.text for it in other] != [it.text for it in generated[task]]


@pytest.mark.parametrize("task", ct.TASKS)
def test_balanced_over_answers(generated, task):
    items = generated[task]
    n_choices = len(items[0].choices)
    assert {len(it.choices) for it in items} == {n_choices}
    assert n_choices == {"age": 2, "always-never": 5, "antonym": 2, "objects": 2, "taxonomy": 3, "multihop": 3}[task]
    for split in ct.SPLITS:
        counts = Counter(it.answer for it in ct.split(items, split))
        assert sorted(counts) == list(range(n_choices)), (split, counts)
        assert len(set(counts.values())) == 1, (split, counts)
    # enough to learn from and to test on (the lexicon's limits)
    assert len(ct.split(items, "test")) >= (25 if task == "always-never" else 150)


@pytest.mark.parametrize("task", ct.TASKS)
def test_splits_share_no_lexical_item(generated, task):
    words = {s: set().union(*(it.content_words for it in ct.split(generated[task], s))) for s in ct.SPLITS}
    keys = {s: {it.key for it in ct.split(generated[task], s)} for s in ct.SPLITS}
    for a, b in (("train", "dev"), ("train", "test"), ("dev", "test")):
        assert not words[a] & words[b], (a, b, sorted(words[a] & words[b])[:5])
        assert not keys[a] & keys[b]


@pytest.mark.parametrize("task", ct.TASKS)
def test_answers_correct_over_the_whole_set(generated, task):
    items = generated[task]
    assert all(it.text.count(BLANK) == 1 for it in items)
    assert all(ct.render(it.template, it.slots) == it.text for it in items)
    wrong = [it for it in items if not ct.verify(it)]
    assert not wrong, wrong[:3]
    # verify is not vacuous: flipping the answer makes it fail
    flipped = [ct.ClozeItem(it.task, it.split, it.text, it.choices, (it.answer + 1) % len(it.choices),
                            it.template, it.slots, it.key) for it in items[:50]]
    assert not any(ct.verify(it) for it in flipped)


def test_answers_by_hand():
    age = ct.generate("age", seed=3)
    for it in age:
        x, y = (int(v) for v in re.findall(r"\b(\d+) year old", it.text))
        assert it.choices[it.answer] == ("younger" if x < y else "older")
    for it in ct.generate("multihop", seed=3):
        ages = [int(v) for v in re.findall(r"\b(\d+)\b", it.text)]
        assert it.choices[it.answer] == ("first", "second", "third")[ages.index(max(ages))]
        assert len(set(ages)) == 3
    for it in ct.generate("objects", seed=3):
        a, b = (ct.OBJECT_SIZES[w] for w in it.slots)
        assert max(a, b) / min(a, b) >= ct.OBJECT_MIN_RATIO
        assert it.choices[it.answer] == ("larger" if a > b else "smaller")
    from workbench.data.wordnet import antonyms

    assert "cold" in antonyms("hot", "a")
    for it in ct.generate("antonym", seed=3):
        a, b = it.slots
        assert (b in antonyms(a, "a")) == (it.choices[it.answer] == "not")


@pytest.mark.slow
@pytest.mark.parametrize("task", ct.TASKS)
def test_nonsense_control_keeps_answers(generated, task):
    items = generated[task]
    control = ct.nonsense_control(items, seed=0)
    assert ct.nonsense_control(items, seed=0) == control
    assert [c.answer for c in control] == [it.answer for it in items]
    assert [c.choices for c in control] == [it.choices for it in items]
    assert Counter((c.split, c.answer) for c in control) == Counter((it.split, it.answer) for it in items)
    real = ct._real_words()
    for it, c in zip(items[:300], control[:300]):
        assert c.text.count(BLANK) == 1 and c.text != it.text
        words = set(re.findall(r"[A-Za-z0-9'-]+", c.text.replace(BLANK, "")))
        # no content word survives; every replacement is a non-word, consistent within the item
        assert not {s for s in it.slots} & words
        assert all(s.lower() not in real for s in c.slots)
        assert len(set(c.slots)) == len({s.lower() for s in it.slots})


@pytest.mark.parametrize("task", ct.TASKS)
def test_content_free_items_keep_the_template_only(generated, task):
    """The reference of the contextual rule: every content word replaced by one neutral word, the
    template's own words, choices and answers kept; one premise per template (the one-template
    tasks have one); the nonsense control has the same premises."""
    items = generated[task]
    free = ct.content_free(items, "N/A")
    assert [(c.choices, c.answer, c.template) for c in free] == [(it.choices, it.answer, it.template) for it in items]
    assert {c.text for c in free} == {ct.render(t, ["N/A"] * t.count("}")) for t in {it.template for it in items}}
    if task != "always-never":  # its 125 statements share 38 premises ("A N/A <blank> N/A N/A.", ...)
        assert len({c.text for c in free}) == 1
    word = re.compile(r"[A-Za-z0-9'-]+")
    for it, c in zip(items[:300], free[:300]):
        assert c.text.count(BLANK) == 1 and set(c.slots) == {"N/A"}
        template_words = set(word.findall(re.sub(r"\{[aA]?\d+\}", " ", it.template).replace(BLANK, "")))
        # only the template's own words, the articles it derives and N/A's two letters: no content left
        assert set(word.findall(c.text.replace(BLANK, ""))) <= template_words | {"a", "A", "N"}
    assert ct.content_free(ct.nonsense_control(items[:50], seed=0), "N/A") == free[:50]


@pytest.mark.parametrize("task", ct.TASKS)
def test_domain_premises_hold_the_answer_and_no_content(generated, task):
    """The pmi_dc rule's texts: the domain premise is one string per task with one blank and no
    content word of any item; the item is asked as its text, its blank written ___, then that
    string (so the answer comes after the whole item); choices and answers kept; the nonsense
    control gets the same premise."""
    items = generated[task]
    premise = ct.DOMAIN_PREMISES[task]
    assert premise.count(BLANK) == 1
    words = set(re.findall(r"[a-z0-9'-]+", premise.replace(BLANK, "").lower()))
    assert not words & set().union(*(it.content_words for it in items))
    assert {it.text for it in ct.domain_only(items)} == {premise}
    framed = ct.in_domain(items)
    assert [f.text for f in framed] == [it.text.replace(BLANK, "___") + " " + premise for it in items]
    # one blank, after the whole item (whose own blank, 7 characters, is now the 3 of "___")
    assert all(f.text.count(BLANK) == 1 and f.text.index(BLANK) > len(it.text) - len(BLANK) + len("___")
               for f, it in zip(framed, items))
    assert [(f.choices, f.answer) for f in framed] == [(it.choices, it.answer) for it in items]
    assert {it.text for it in ct.domain_only(ct.nonsense_control(items[:20], seed=0))} == {premise}


def test_bad_task_and_sizes():
    from workbench.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown cloze task"):
        ct.generate("ages")
    with pytest.raises(ConfigError, match="unknown splits"):
        ct.generate("age", sizes={"validation": 10})


def test_sizes_cap_splits():
    items = ct.generate("age", seed=0, sizes={"train": 62, "dev": 10, "test": 10})
    assert Counter(it.split for it in items) == {"train": 62, "dev": 10, "test": 10}
