"""What a reproduction row is: the paper's finding with its source quoted, our nearest measurement,
and the stated test that turns the two into a verdict.

A row is declared, not scripted (`Row`): the paper (`PaperValue`, a `Citation` quoting the sentence
or table cell the number comes from, or saying it could not be verified), the paper's setting and
ours, the model it needs, and a `Test` object. Its `measure` function returns a `Measurement`
(a value with a 95% CI, the model and data, named components for tests over several numbers); the
verdict is the test's `decide(paper, measurement)`, never a hand-set word. A row declared without a
citation or without a test is refused when the registry is built (`RowSpecError`).

Verdicts: `reproduced` (the test holds), `differs` (with the measured difference), `not comparable
here` (declared with its reason: no such model or data here), `failed` (the row raised while
running; the other rows still run).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

REPRODUCED, DIFFERS, NOT_COMPARABLE, FAILED = "reproduced", "differs", "not comparable here", "failed"


class RowSpecError(ValueError):
    """A row declared without what every row needs (a citation, a test, a measure)."""


@dataclass(frozen=True)
class Citation:
    """Where a paper's number or finding comes from. `quote` is the sentence or table cell as read
    in the source; `verified` is False when it could not be read in the paper's own text (then
    `note` says why, and the table marks the number unverified)."""

    paper: str       # "Hewitt & Manning 2019, A Structural Probe for Finding Syntax in Word Representations (NAACL)"
    where: str       # "Table 1"
    quote: str
    verified: bool
    source: str = ""  # where the quote was read
    note: str = ""

    def __post_init__(self):
        if not self.paper.strip() or not self.where.strip():
            raise RowSpecError("a citation names its paper and where in it (table, figure, section)")
        if self.verified and not self.quote.strip():
            raise RowSpecError(f"{self.paper}: a verified citation quotes its source")


@dataclass(frozen=True)
class PaperValue:
    """The paper's number (None for a finding without one: an ordering, a shape) and its citation."""

    citation: Citation
    value: float | None = None
    label: str = ""  # what the number is ("UUAS, BERT-base layer 7")

    @property
    def verified(self) -> bool:
        return self.citation.verified


@dataclass(frozen=True)
class Measurement:
    """Our number: `value` with its 95% CI (`low`, `high`; NaN where none), the model and data it
    comes from, named `components` (value, low, high) for tests over several numbers, the run ids
    behind it, and per-task relative depths for the figure's first panel (`depths`: task ->
    (ours, paper or None))."""

    value: float
    low: float = math.nan
    high: float = math.nan
    model: str = ""
    data: str = ""
    detail: str = ""
    components: Mapping[str, tuple[float, float, float]] = field(default_factory=dict)
    run_ids: tuple[str, ...] = ()
    depths: Mapping[str, tuple[float, float | None]] = field(default_factory=dict)


@dataclass(frozen=True)
class Verdict:
    status: str
    reason: str


class Test:
    """A stated test: `description` is what the table prints; `decide` computes the verdict."""

    description: str = ""

    def decide(self, paper: PaperValue, ours: Measurement) -> Verdict:  # pragma: no cover - interface
        raise NotImplementedError


def fmt(x: float) -> str:
    return "nan" if x is None or not math.isfinite(x) else f"{x:.3g}"


@dataclass(frozen=True)
class WithinTolerance(Test):
    """|ours - paper| <= tolerance (relative to the paper's value when `relative`)."""

    tolerance: float
    relative: bool = False

    @property
    def description(self) -> str:
        return f"|ours - paper| <= {self.tolerance:g}{' x paper' if self.relative else ''}"

    def decide(self, paper, ours):
        if paper.value is None:
            raise RowSpecError("WithinTolerance needs the paper's number")
        gap = ours.value - paper.value
        bound = self.tolerance * abs(paper.value) if self.relative else self.tolerance
        status = REPRODUCED if abs(gap) <= bound else DIFFERS
        return Verdict(status, f"ours - paper = {fmt(gap)} (bound {fmt(bound)})")


@dataclass(frozen=True)
class IntervalsAbove(Test):
    """Every named component's 95% CI lies above `threshold` (e.g. the CI of a difference excludes 0)."""

    components: tuple[str, ...]
    threshold: float = 0.0
    what: str = ""

    @property
    def description(self) -> str:
        names = ", ".join(self.components)
        return f"95% CI of {names} above {self.threshold:g}" + (f" ({self.what})" if self.what else "")

    def decide(self, paper, ours):
        missing = [c for c in self.components if c not in ours.components]
        if missing:
            raise RowSpecError(f"the measurement lacks {missing}")
        failing = [c for c in self.components if not ours.components[c][1] > self.threshold]
        parts = "; ".join(f"{c} {fmt(ours.components[c][0])} [{fmt(ours.components[c][1])}, "
                          f"{fmt(ours.components[c][2])}]" for c in self.components)
        if failing:
            return Verdict(DIFFERS, f"not above {self.threshold:g}: {', '.join(failing)} ({parts})")
        return Verdict(REPRODUCED, parts)


def _intervals(ours: Measurement, names: tuple[str, ...]) -> str:
    missing = [c for c in names if c not in ours.components]
    if missing:
        raise RowSpecError(f"the measurement lacks {missing}")
    return "; ".join(f"{c} {fmt(ours.components[c][0])} [{fmt(ours.components[c][1])}, {fmt(ours.components[c][2])}]"
                     for c in names)


@dataclass(frozen=True)
class IntervalsContain(Test):
    """Every named component's 95% CI contains `value` (e.g. an accuracy minus chance whose CI holds 0:
    at chance, as the paper finds)."""

    components: tuple[str, ...]
    value: float = 0.0
    what: str = ""

    @property
    def description(self) -> str:
        return (f"95% CI of {', '.join(self.components)} contains {self.value:g}"
                + (f" ({self.what})" if self.what else ""))

    def decide(self, paper, ours):
        parts = _intervals(ours, self.components)
        failing = [c for c in self.components if not ours.components[c][1] <= self.value <= ours.components[c][2]]
        if failing:
            return Verdict(DIFFERS, f"not containing {self.value:g}: {', '.join(failing)} ({parts})")
        return Verdict(REPRODUCED, parts)


@dataclass(frozen=True)
class IntervalsBelow(Test):
    """Every named component's 95% CI lies below `threshold` (e.g. an exposure at a random candidate's level)."""

    components: tuple[str, ...]
    threshold: float
    what: str = ""

    @property
    def description(self) -> str:
        return (f"95% CI of {', '.join(self.components)} below {self.threshold:.3g}"
                + (f" ({self.what})" if self.what else ""))

    def decide(self, paper, ours):
        parts = _intervals(ours, self.components)
        failing = [c for c in self.components if not ours.components[c][2] < self.threshold]
        if failing:
            return Verdict(DIFFERS, f"not below {self.threshold:.3g}: {', '.join(failing)} ({parts})")
        return Verdict(REPRODUCED, parts)


@dataclass(frozen=True)
class InRange(Test):
    """A point estimate lies in [low, high] (e.g. a peak's relative depth in the middle third):
    the named component's value, or the measured value when `component` is empty."""

    low: float
    high: float
    component: str = ""

    @property
    def description(self) -> str:
        return f"{self.component or 'value'} in [{self.low:.3g}, {self.high:.3g}]"

    def decide(self, paper, ours):
        if self.component and self.component not in ours.components:
            raise RowSpecError(f"the measurement lacks {self.component!r}")
        value = ours.components[self.component][0] if self.component else ours.value
        inside = self.low <= value <= self.high
        return Verdict(REPRODUCED if inside else DIFFERS,
                       f"{self.component or 'value'} {fmt(value)} {'in' if inside else 'outside'} "
                       f"[{self.low:.3g}, {self.high:.3g}]")


@dataclass(frozen=True)
class AllOf(Test):
    """Every test holds (the first that does not gives the verdict's reason)."""

    tests: tuple[Test, ...]

    @property
    def description(self) -> str:
        return " and ".join(t.description for t in self.tests)

    def decide(self, paper, ours):
        verdicts = [t.decide(paper, ours) for t in self.tests]
        status = REPRODUCED if all(v.status == REPRODUCED for v in verdicts) else DIFFERS
        return Verdict(status, "; ".join(v.reason for v in verdicts))


@dataclass(frozen=True)
class Row:
    """One reproduction (module docstring). `measure(context)` returns a Measurement; `models` are
    the Hub names the real row needs in the local cache (checked before any work); `full` rows run
    only with --full; `minutes` is the expected wall time of the real row on 2 CPU cores."""

    key: str
    finding: str
    paper: PaperValue
    paper_setting: str
    our_setting: str
    test: Test
    measure: Callable[[Any], Measurement]
    models: tuple[str, ...] = ()
    full: bool = False
    minutes: float = 1.0
    ratio: bool = False  # the figure's panel 2 shows ours / paper for this row

    def __post_init__(self):
        if not isinstance(self.paper, PaperValue) or not isinstance(self.paper.citation, Citation):
            raise RowSpecError(f"row {self.key!r}: no citation (a PaperValue with a Citation)")
        if not isinstance(self.test, Test) or type(self.test) is Test:
            raise RowSpecError(f"row {self.key!r}: no stated test (a Test that decides the verdict)")
        if not callable(self.measure):
            raise RowSpecError(f"row {self.key!r}: no measure function")
        if self.ratio and self.paper.value is None:
            raise RowSpecError(f"row {self.key!r}: a ratio to the paper needs the paper's number")


@dataclass(frozen=True)
class NotComparable:
    """A finding this workbench cannot hold itself to here, listed with the reason rather than dropped."""

    key: str
    finding: str
    paper: str
    reason: str


def build_registry(rows: list[Row]) -> dict[str, Row]:
    """Rows by key; a duplicate key is refused."""
    registry: dict[str, Row] = {}
    for row in rows:
        if row.key in registry:
            raise RowSpecError(f"two rows named {row.key!r}")
        registry[row.key] = row
    return registry
