"""Corpus splits: one raw corpus's documents grouped by a rule, so that two communities of speakers
are two corpus specs (`split:<corpus>:<rule>`) that the alignment probe reads like any other.

The material's "from left-wing to right-wing writers" is Hamilton et al. (2016)'s diachronic
procedure applied to communities instead of decades (Azarbonyad et al. 2017 compare the UK
parliament's parties the same way). The speeches of NLTK's `state_union` (1945-2006) and `inaugural`
(1789-2021) corpora are named `<year>-<President>[-n].txt`, so each speech's year and president are
in its name and its party is in the table below.

| rule | keeps the speeches | example |
|---|---|---|
| `party=<party>` | of presidents of that party (see `PRESIDENTS`) | `split:state_union:party=Republican` |
| `years=<from>-<to>` | given in those years (inclusive): an era | `split:inaugural:years=1789-1899` |

A speech is the independent unit (the permutation baseline of `probes.align`'s `diachronic` task
reassigns whole speeches), so a split keeps every document whole.
"""

from __future__ import annotations

import re

from workbench.errors import ConfigError

SPLIT_CORPORA = ("state_union", "inaugural")
RULES = ("party", "years")

# (surname as in the file names, first year, last year of speeches, party at the time). Source: the
# U.S. House of Representatives' Office of the Historian and Wikipedia's "List of presidents of the
# United States" (party at the time of the speech; Lincoln's 1864 National Union ticket counted as
# Republican, Washington as unaffiliated). Surnames shared by two presidents (Adams, Harrison,
# Roosevelt, Bush) are told apart by the years.
PRESIDENTS: tuple[tuple[str, int, int, str], ...] = (
    ("Washington", 1789, 1797, "Unaffiliated"),
    ("Adams", 1797, 1801, "Federalist"),
    ("Jefferson", 1801, 1809, "Democratic-Republican"),
    ("Madison", 1809, 1817, "Democratic-Republican"),
    ("Monroe", 1817, 1825, "Democratic-Republican"),
    ("Adams", 1825, 1829, "Democratic-Republican"),
    ("Jackson", 1829, 1837, "Democratic"),
    ("VanBuren", 1837, 1841, "Democratic"),
    ("Harrison", 1841, 1841, "Whig"),
    ("Polk", 1845, 1849, "Democratic"),
    ("Taylor", 1849, 1850, "Whig"),
    ("Pierce", 1853, 1857, "Democratic"),
    ("Buchanan", 1857, 1861, "Democratic"),
    ("Lincoln", 1861, 1865, "Republican"),
    ("Grant", 1869, 1877, "Republican"),
    ("Hayes", 1877, 1881, "Republican"),
    ("Garfield", 1881, 1881, "Republican"),
    ("Cleveland", 1885, 1889, "Democratic"),
    ("Harrison", 1889, 1893, "Republican"),
    ("Cleveland", 1893, 1897, "Democratic"),
    ("McKinley", 1897, 1901, "Republican"),
    ("Roosevelt", 1901, 1909, "Republican"),
    ("Taft", 1909, 1913, "Republican"),
    ("Wilson", 1913, 1921, "Democratic"),
    ("Harding", 1921, 1923, "Republican"),
    ("Coolidge", 1923, 1929, "Republican"),
    ("Hoover", 1929, 1933, "Republican"),
    ("Roosevelt", 1933, 1945, "Democratic"),
    ("Truman", 1945, 1953, "Democratic"),
    ("Eisenhower", 1953, 1961, "Republican"),
    ("Kennedy", 1961, 1963, "Democratic"),
    ("Johnson", 1963, 1969, "Democratic"),
    ("Nixon", 1969, 1974, "Republican"),
    ("Ford", 1974, 1977, "Republican"),
    ("Carter", 1977, 1981, "Democratic"),
    ("Reagan", 1981, 1989, "Republican"),
    ("Bush", 1989, 1993, "Republican"),
    ("Clinton", 1993, 2001, "Democratic"),
    ("Bush", 2001, 2009, "Republican"),
    ("GWBush", 2001, 2009, "Republican"),
    ("Obama", 2009, 2017, "Democratic"),
    ("Trump", 2017, 2021, "Republican"),
    ("Biden", 2021, 2025, "Democratic"),
)
PARTIES = tuple(sorted({p for *_, p in PRESIDENTS}))

_SPEECH = re.compile(r"(?:.*/)?(\d{4})-([A-Za-z]+)(?:-\d+)?\.txt\Z")


def speech(doc_id: str) -> tuple[int, str]:
    """(year, president's surname) of a speech file name such as `state_union/1965-Johnson-1.txt`."""
    m = _SPEECH.match(doc_id)
    if m is None:
        raise ConfigError(f"{doc_id}: not a speech file named <year>-<President>[-n].txt")
    return int(m.group(1)), m.group(2)


def party(doc_id: str) -> str:
    """The party of the president who gave the speech `doc_id` (see `PRESIDENTS`)."""
    year, name = speech(doc_id)
    found = {p for n, first, last, p in PRESIDENTS if n == name and first <= year <= last}
    if len(found) != 1:
        raise ConfigError(f"{doc_id}: no single party for {name} in {year} in probes.align.communities.PRESIDENTS")
    return found.pop()


def parse(arg: str) -> tuple[str, str, str]:
    """`<corpus>:<rule>=<value>` -> (corpus, rule, value), checked (one clear line when not)."""
    corpus, sep, rule = arg.partition(":")
    key, eq, value = rule.partition("=")
    spec = f"split:{arg}"
    if corpus not in SPLIT_CORPORA:
        raise ConfigError(f"{spec}: unknown corpus split {corpus!r}; splittable corpora: {list(SPLIT_CORPORA)}")
    if not sep or not eq or key not in RULES or not value:
        raise ConfigError(f"{spec}: the rule must be party=<party> or years=<from>-<to>")
    if key == "party" and value not in PARTIES:
        raise ConfigError(f"{spec}: unknown party {value!r}; known: {list(PARTIES)}")
    if key == "years":
        lo, dash, hi = value.partition("-")
        if not (dash and lo.isdigit() and hi.isdigit() and int(lo) <= int(hi)):
            raise ConfigError(f"{spec}: years must be <from>-<to> with from <= to, got {value!r}")
    return corpus, key, value


def keeps(doc_id: str, key: str, value: str) -> bool:
    """Whether the speech `doc_id` belongs to the group `key=value`."""
    if key == "party":
        return party(doc_id) == value
    lo, _, hi = value.partition("-")
    return int(lo) <= speech(doc_id)[0] <= int(hi)
