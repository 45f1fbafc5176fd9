"""GAP scorer (Webster et al. 2018): hand-counted confusion on a crafted 6-row file, sklearn's F1
on the flattened decisions, and the submission format's round trip."""

import numpy as np
import pytest
from sklearn.metrics import f1_score

from probes.coref.gap_scorer import (FEMININE, MASCULINE, UNKNOWN, pronoun_gender, read_submission, score_gap,
                               write_submission, gold_from_frame)
from workbench.data.gap import read_gap
from workbench.errors import DataFormatError

# id -> (pronoun, gold A-coref, gold B-coref)
GOLD = {
    "t-1": ("she", True, False),
    "t-2": ("He", False, True),
    "t-3": ("his", False, False),
    "t-4": ("her", True, False),  # no system row: FN for A and FN for B
    "t-5": ("him", False, True),
    "t-6": ("hers", False, False),
}
SYSTEM_FILE = "t-1\tTRUE\tFALSE\nt-2\tTRUE\tFALSE\nt-3\tfalse\tTrue\nt-5\tFALSE\tTRUE\nt-6\tFALSE\tFALSE\nt-99\tTRUE\tFALSE\n"


def test_crafted_six_rows_match_hand_counts(tmp_path):
    path = tmp_path / "system.tsv"
    path.write_text(SYSTEM_FILE, encoding="utf-8")
    s = score_gap(GOLD, read_submission(path))
    # by hand, decision by decision (A, B):
    # t-1 f: TP TN | t-2 m: FP FN | t-3 m: TN FP | t-4 f: FN FN (missing) | t-5 m: TN TP | t-6 f: TN TN
    assert (s.overall.tp, s.overall.fp, s.overall.fn, s.overall.tn) == (2, 2, 3, 5)
    assert (s.masculine.tp, s.masculine.fp, s.masculine.fn, s.masculine.tn) == (1, 2, 1, 2)
    assert (s.feminine.tp, s.feminine.fp, s.feminine.fn, s.feminine.tn) == (1, 0, 2, 3)
    assert s.missing == 1
    assert s.overall.precision == pytest.approx(0.5) and s.overall.recall == pytest.approx(0.4)
    assert s.overall.f1 == pytest.approx(2 * 0.5 * 0.4 / 0.9)
    assert s.masculine.f1 == pytest.approx(0.4)  # P 1/3, R 1/2
    assert s.feminine.f1 == pytest.approx(0.5)  # P 1, R 1/3
    assert s.bias == pytest.approx(1.25)


def test_f1_equals_sklearn_on_flattened_decisions(tmp_path):
    present = {k: v for k, v in GOLD.items() if k != "t-4"}
    path = tmp_path / "system.tsv"
    path.write_text(SYSTEM_FILE, encoding="utf-8")
    system = read_submission(path)
    y_true = [d for k in present for d in GOLD[k][1:]]
    y_pred = [d for k in present for d in system[k]]
    assert score_gap(present, system).overall.f1 == pytest.approx(f1_score(y_true, y_pred))

    # and on the real GAP test set with seeded random decisions, overall and per gender
    gold = gold_from_frame(read_gap("test"))
    rng = np.random.default_rng(0)
    system = {k: tuple(bool(x) for x in rng.random(2) < 0.4) for k in gold}
    s = score_gap(gold, system)
    for counts, gender in ((s.overall, None), (s.masculine, MASCULINE), (s.feminine, FEMININE)):
        keys = [k for k, (p, _, _) in gold.items() if gender is None or pronoun_gender(p) == gender]
        assert len(keys) > 900
        y_true = [d for k in keys for d in gold[k][1:]]
        y_pred = [d for k in keys for d in system[k]]
        assert counts.f1 == pytest.approx(f1_score(y_true, y_pred))
    assert s.overall.tp + s.overall.fp + s.overall.fn + s.overall.tn == 2 * len(gold)


def test_gender_from_pronoun():
    assert [pronoun_gender(p) for p in ("She", "HIS", "hers", "him", "they", "It")] == [
        FEMININE, MASCULINE, FEMININE, MASCULINE, UNKNOWN, UNKNOWN]


def test_submission_round_trip(tmp_path):
    rows = [("test-1", True, False), ("test-2", False, False), ("test-3", False, True)]
    path = write_submission(tmp_path / "pred.tsv", rows)
    text = path.read_text(encoding="utf-8")
    assert text == "test-1\tTRUE\tFALSE\ntest-2\tFALSE\tFALSE\ntest-3\tFALSE\tTRUE\n"  # no header
    assert read_submission(path) == {i: (a, b) for i, a, b in rows}


@pytest.mark.parametrize("content,line,words", [
    ("a\tTRUE\tFALSE\nb\tTRUE\n", 2, "3 tab-separated columns"),
    ("a\tTRUE\tFALSE\nb\tyes\tFALSE\n", 2, "TRUE or FALSE"),
    ("a\tTRUE\tFALSE\na\tTRUE\tFALSE\n", 2, "duplicate"),
])
def test_bad_submission_names_file_and_line(tmp_path, content, line, words):
    path = tmp_path / "bad.tsv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        read_submission(path)
    assert (err.value.path, err.value.line) == (str(path), line) and words in str(err.value)
