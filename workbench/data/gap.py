"""GAP: gendered ambiguous pronouns (Webster et al., 2018), with offsets mapped to word spans.

Each row gives a Wikipedia passage, a pronoun and two candidate names (A, B) as strings with
character offsets into the passage, and whether each name corefers with the pronoun.

Words: the passage is split the way BERT's basic tokenizer splits text (Devlin et al., 2019):
at whitespace, and every punctuation character is a word of its own (`\\w+|[^\\w\\s]`), with no
lowercasing. Every word keeps its character span, so a model handle can map words to subwords;
each of pronoun/A/B becomes an inclusive word span whose characters are exactly the given string.
An offset that does not point at its string, or that cuts a word, is a DataFormatError naming
the file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from workbench.errors import DataFormatError
from workbench.paths import data_path

SPLITS = ("development", "validation", "test")
COLUMNS = ["ID", "Text", "Pronoun", "Pronoun-offset", "A", "A-offset", "A-coref", "B", "B-offset", "B-coref", "URL"]
_WORD = re.compile(r"\w+|[^\w\s]")
_BOOL = {"TRUE": True, "FALSE": False}


def tokenize(text: str) -> tuple[list[str], list[tuple[int, int]]]:
    """Words of `text` and their character spans [start, end)."""
    words, spans = [], []
    for m in _WORD.finditer(text):
        words.append(m.group())
        spans.append(m.span())
    return words, spans


def char_to_word_span(
    spans: list[tuple[int, int]], start: int, end: int
) -> tuple[int, int] | None:
    """The inclusive word span covering exactly characters [start, end), or None if a word is cut."""
    first = next((i for i, (s, _) in enumerate(spans) if s == start), None)
    last = next((i for i, (_, e) in enumerate(spans) if e == end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


def gap_path(split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown GAP split {split!r}; known: {SPLITS}")
    return data_path("gap", f"gap-{split}.tsv")


def read_gap(split: str) -> pd.DataFrame:
    """One row per example of gap-<split>.tsv (`development`, `validation`, `test`)."""
    return read_gap_file(gap_path(split))


def read_gap_file(path: str | Path) -> pd.DataFrame:
    """Columns: id, text, words, word_spans, and for each of pronoun/a/b: the string, its
    character offset and its inclusive word span (`pronoun_start`, `pronoun_end`, ...);
    a_coref, b_coref (bool), label ("A", "B" or "NEITHER"), url, line (in the file)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise DataFormatError(path, None, f"not UTF-8: {e.reason}") from None
    if not lines or lines[0].rstrip("\r").split("\t") != COLUMNS:
        raise DataFormatError(path, 1, f"header must be the GAP columns {COLUMNS}")
    rows = []
    for lineno, line in enumerate(lines[1:], start=2):
        line = line.rstrip("\r")
        if not line:
            continue
        cols = line.split("\t")
        if len(cols) != len(COLUMNS):
            raise DataFormatError(path, lineno, f"expected {len(COLUMNS)} tab-separated columns, found {len(cols)}")
        ex_id, text, pron, pron_off, a, a_off, a_coref, b, b_off, b_coref, url = cols
        words, spans = tokenize(text)
        row = {"id": ex_id, "text": text, "words": words, "word_spans": spans}
        for key, string, offset in (("pronoun", pron, pron_off), ("a", a, a_off), ("b", b, b_off)):
            try:
                off = int(offset)
            except ValueError:
                raise DataFormatError(path, lineno, f"{key} offset {offset!r} is not an integer") from None
            if text[off : off + len(string)] != string or not string:
                raise DataFormatError(
                    path, lineno, f"{key} {string!r} is not at character {off} (found {text[off:off + len(string)]!r})"
                )
            span = char_to_word_span(spans, off, off + len(string))
            if span is None:
                raise DataFormatError(path, lineno, f"{key} {string!r} at character {off} does not start and end at word boundaries")
            row[key] = string
            row[f"{key}_offset"] = off
            row[f"{key}_start"], row[f"{key}_end"] = span
        for key, value in (("a_coref", a_coref), ("b_coref", b_coref)):
            if value not in _BOOL:
                raise DataFormatError(path, lineno, f"{key} must be TRUE or FALSE, found {value!r}")
            row[key] = _BOOL[value]
        if row["a_coref"] and row["b_coref"]:
            raise DataFormatError(path, lineno, "both A and B marked as coreferent with the pronoun")
        row["label"] = "A" if row["a_coref"] else "B" if row["b_coref"] else "NEITHER"
        row["url"] = url
        row["line"] = lineno
        rows.append(row)
    return pd.DataFrame(rows)
