"""Swadesh core-vocabulary lists (Swadesh, 1955; the 207-item Wiktionary lists shipped with NLTK).

Line i of every language file is the same concept, so two files give a small bilingual
dictionary: the classic seed for cross-lingual Procrustes alignment (Conneau et al., 2018).
An entry may list several variants (`tú, usted`) and carry a gloss (`you (singular)`); the
gloss is removed. An empty line means the list has no word for that concept in the language.
"""

from __future__ import annotations

import re

from workbench.errors import DataFormatError
from workbench.paths import data_path

N_ENTRIES = 207
_GLOSS = re.compile(r"\s*\([^)]*\)")


def swadesh_languages() -> list[str]:
    folder = data_path("nltk", "swadesh")
    return sorted(p.name for p in folder.iterdir() if p.is_file() and p.name != "README")


def load_swadesh(lang: str) -> list[list[str]]:
    """207 entries in concept order; each the list of variants (possibly empty)."""
    path = data_path("nltk", "swadesh", lang)
    lines = path.read_text(encoding="utf-8").split("\n")
    while len(lines) > N_ENTRIES and not lines[-1].strip():
        lines.pop()  # trailing newline(s)
    if len(lines) != N_ENTRIES:
        raise DataFormatError(path, len(lines), f"expected {N_ENTRIES} Swadesh entries, found {len(lines)}")
    entries = []
    for line in lines:
        variants = [_GLOSS.sub("", v).strip() for v in line.split(",")]
        entries.append([v for v in variants if v])
    return entries


def bilingual_dictionary(src: str, tgt: str, all_variants: bool = False) -> list[tuple[str, str]]:
    """Aligned (src_word, tgt_word) pairs, one per concept (the first variant on each side).

    With `all_variants`, every src variant is paired with every tgt variant. Concepts missing
    in either language give no pair.
    """
    pairs = []
    for a, b in zip(load_swadesh(src), load_swadesh(tgt)):
        if not a or not b:
            continue
        if all_variants:
            pairs.extend((x, y) for x in a for y in b)
        else:
            pairs.append((a[0], b[0]))
    return pairs
