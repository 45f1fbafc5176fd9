"""GAP: every pronoun/A/B offset of the real data maps onto whole words of our tokenisation."""

from pathlib import Path

import pytest

from workbench.data.gap import COLUMNS, gap_path, read_gap, read_gap_file, tokenize
from workbench.errors import DataFormatError

FIX = Path(__file__).parent / "fixtures" / "data"


def _raw_rows(split):
    """The file's own rows, split by hand: (line number, dict of the 11 columns)."""
    lines = gap_path(split).read_text(encoding="utf-8").rstrip("\n").split("\n")
    assert lines[0].split("\t") == COLUMNS
    return [(i, dict(zip(COLUMNS, ln.split("\t")))) for i, ln in enumerate(lines[1:], start=2)]


@pytest.mark.parametrize("split,n", [("development", 2000), ("validation", 454), ("test", 2000)])
def test_every_offset_maps_onto_whole_words(split, n):
    df = read_gap(split)
    raw = _raw_rows(split)
    assert len(df) == len(raw) == n
    failures = []
    for (lineno, r), row in zip(raw, df.itertuples()):
        assert row.id == r["ID"] and row.line == lineno
        text = r["Text"]
        for key, col in (("pronoun", "Pronoun"), ("a", "A"), ("b", "B")):
            start, end = getattr(row, f"{key}_start"), getattr(row, f"{key}_end")
            first, last = row.word_spans[start][0], row.word_spans[end][1]
            joined = "".join(row.words[start : end + 1])
            ok = (
                first == int(r[f"{col}-offset"])
                and text[first:last] == r[col]
                and joined == r[col].replace(" ", "")
                and row.words[start : end + 1] == [text[s:e] for s, e in row.word_spans[start : end + 1]]
            )
            if not ok:
                failures.append(f"{split} line {lineno} {r['ID']} {col}={r[col]!r}")
    rate = 1 - len(failures) / (3 * len(raw))
    assert not failures, f"mapping rate {rate:.4%}; failed: {failures[:20]}"


def test_development_labels_and_a_known_row():
    df = read_gap("development")
    assert df["label"].value_counts().to_dict() == {"A": 874, "B": 925, "NEITHER": 201}
    row = df.iloc[0]
    assert row["id"] == "development-1"
    assert row["words"][row["a_start"] : row["a_end"] + 1] == ["Cheryl", "Cassidy"]
    assert row["words"][row["b_start"] : row["b_end"] + 1] == ["Pauline"]
    assert row["words"][row["pronoun_start"]] == "her" and row["pronoun_start"] == row["pronoun_end"]
    assert row["a_coref"] and not row["b_coref"] and row["label"] == "A"


def test_tokenisation_splits_punctuation_and_keeps_spans():
    words, spans = tokenize("Nolan's co-star, O'Brien (1990).")
    assert words == ["Nolan", "'", "s", "co", "-", "star", ",", "O", "'", "Brien", "(", "1990", ")", "."]
    assert spans[0] == (0, 5) and spans[-1] == (31, 32)


def test_bad_offset_names_file_and_line():
    path = FIX / "gap_bad_offset.tsv"
    with pytest.raises(DataFormatError) as err:
        read_gap_file(path)
    assert (err.value.path, err.value.line) == (str(path), 3)
    assert "'She' is not at character 15" in str(err.value)


def test_offset_cutting_a_word_is_an_error():
    path = FIX / "gap_cut_word.tsv"
    with pytest.raises(DataFormatError) as err:
        read_gap_file(path)
    assert err.value.line == 2 and "word boundaries" in str(err.value)
