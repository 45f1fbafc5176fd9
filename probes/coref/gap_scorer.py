"""The GAP scorer and GAP's submission format (Webster et al., 2018, "Mind the GAP").

Scoring follows the paper's released scorer (gap_scorer.py of google-research-datasets/
gap-coreference), re-implemented here from its definition:

- every gold example contributes TWO binary decisions, "does the pronoun corefer with A?" and
  "... with B?"; each is counted as a true/false positive/negative against the system's decision;
- a gold example with no system row counts as a false negative for BOTH decisions (whatever the
  gold value is: the official scorer's rule, so a missing row can never help);
- counts are kept overall and per gender; the gender is read from the pronoun
  (she/her/hers: feminine, he/his/him: masculine, lower-cased; anything else: unknown);
- F1 = 2PR / (P + R) with P = TP / (TP + FP), R = TP / (TP + FN) (0 when undefined), reported
  overall, masculine and feminine, and the bias as the ratio F1(feminine) / F1(masculine).

Submission format (what the official scorer reads as system output): one line per example,
tab-separated `ID`, `A-coref`, `B-coref` with the values TRUE/FALSE, no header.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from workbench.errors import DataFormatError
from workbench.io import atomic_write_text

FEMININE, MASCULINE, UNKNOWN = "feminine", "masculine", "unknown"
PRONOUN_GENDER = {"she": FEMININE, "her": FEMININE, "hers": FEMININE, "he": MASCULINE, "his": MASCULINE, "him": MASCULINE}


def pronoun_gender(pronoun: str) -> str:
    return PRONOUN_GENDER.get(pronoun.strip().lower(), UNKNOWN)


@dataclass
class Counts:
    """Confusion counts over binary coreference decisions."""

    tp: int = 0
    fp: int = 0
    tn: int = 0
    fn: int = 0

    @property
    def precision(self) -> float:
        return self.tp / (self.tp + self.fp) if self.tp + self.fp else 0.0

    @property
    def recall(self) -> float:
        return self.tp / (self.tp + self.fn) if self.tp + self.fn else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def add(self, gold: bool, system: bool | None) -> None:
        if system is None:
            self.fn += 1
        elif gold and system:
            self.tp += 1
        elif system:
            self.fp += 1
        elif gold:
            self.fn += 1
        else:
            self.tn += 1


@dataclass
class GapScores:
    overall: Counts
    masculine: Counts
    feminine: Counts
    missing: int  # gold examples without a system row

    @property
    def bias(self) -> float:
        """F1(feminine) / F1(masculine); NaN when the masculine F1 is 0."""
        m = self.masculine.f1
        return self.feminine.f1 / m if m else float("nan")

    def as_dict(self) -> dict[str, float]:
        return {"f1": self.overall.f1, "precision": self.overall.precision, "recall": self.overall.recall,
                "f1_masculine": self.masculine.f1, "f1_feminine": self.feminine.f1, "bias": self.bias}


Decision = tuple[bool, bool]


def score_gap(gold: Mapping[str, tuple[str, bool, bool]], system: Mapping[str, Decision]) -> GapScores:
    """gold: id -> (pronoun, A-coref, B-coref); system: id -> (A-coref, B-coref).

    System rows for ids not in gold are ignored (as the official scorer does)."""
    overall, by_gender = Counts(), {MASCULINE: Counts(), FEMININE: Counts(), UNKNOWN: Counts()}
    missing = 0
    for ex_id, (pronoun, gold_a, gold_b) in gold.items():
        sys_row = system.get(ex_id)
        missing += sys_row is None
        sys_a, sys_b = sys_row if sys_row is not None else (None, None)
        for counts in (overall, by_gender[pronoun_gender(pronoun)]):
            counts.add(bool(gold_a), sys_a)
            counts.add(bool(gold_b), sys_b)
    return GapScores(overall, by_gender[MASCULINE], by_gender[FEMININE], missing)


def gold_from_frame(df) -> dict[str, tuple[str, bool, bool]]:
    """Gold decisions from `workbench.data.gap.read_gap(...)`."""
    return {r.id: (r.pronoun, bool(r.a_coref), bool(r.b_coref)) for r in df.itertuples()}


def format_submission(rows: Iterable[tuple[str, bool, bool]]) -> str:
    return "".join(f"{i}\t{'TRUE' if a else 'FALSE'}\t{'TRUE' if b else 'FALSE'}\n" for i, a, b in rows)


def write_submission(path: str | Path, rows: Iterable[tuple[str, bool, bool]]) -> Path:
    """Write system decisions in GAP's submission format (atomically)."""
    return atomic_write_text(path, format_submission(rows))


def read_submission(path: str | Path) -> dict[str, Decision]:
    """id -> (A-coref, B-coref) from a submission file; TRUE/FALSE in any letter case."""
    path = Path(path)
    out: dict[str, Decision] = {}
    values = {"true": True, "false": False}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 3:
            raise DataFormatError(path, lineno, f"expected 3 tab-separated columns (ID, A-coref, B-coref), found {len(cols)}")
        ex_id, a, b = cols
        if a.lower() not in values or b.lower() not in values:
            raise DataFormatError(path, lineno, f"A-coref/B-coref must be TRUE or FALSE, found {a!r}, {b!r}")
        if ex_id in out:
            raise DataFormatError(path, lineno, f"duplicate example id {ex_id!r}")
        out[ex_id] = (values[a.lower()], values[b.lower()])
    return out
