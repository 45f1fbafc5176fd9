"""CoNLL-U treebanks (Universal Dependencies) and GUM coreference, read with validation.

The reader is a small line parser of its own rather than a wrapper of the `conllu` package: it
has to name the file and line of every malformed thing (`DataFormatError`), and a plain loop over
lines is also several times faster on EWT train. The tests use the `conllu` package as an
independent reference for words and heads.

Format: https://universaldependencies.org/format.html (de Marneffe et al., 2021).
Coreference: the bracket notation of CorefUD 1.x (Nedoluzhko et al., 2022) as used by GUM
(Zeldes, 2017) in the MISC column, e.g. `Entity=(4-abstract-new-...(5-object-...)` on the
first word of mention 4 and a one-word mention 5, `Entity=4)` on the last word of mention 4.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import DataFormatError
from workbench.paths import data_path

# The treebanks the data root ships (data README, checked by `bertology data verify`): their splits
# are known even while a file is missing, so a missing file is a DataRootError naming it.
SHIPPED_TREEBANKS: dict[str, tuple[str, ...]] = {
    "en_ewt": ("train", "dev", "test"),
    "en_gum": ("train", "dev", "test"),
    "en_pud": ("test",),
    "es_pud": ("test",),
    "es_gsd": ("dev", "test"),
}
SPLITS = ("train", "dev", "test")  # UD's split names, in this order


def discover_treebanks() -> dict[str, tuple[str, ...]]:
    """Every treebank under `<data root>/ud/`: the shipped ones, plus each folder `ud/NAME/` holding
    UD's usual files `NAME-ud-SPLIT.conllu` (SPLIT one of train, dev, test), with the splits found.

    So a new language or a new parallel pair (two folders whose test files share sent_ids, as PUD's
    do) is one copy into the data root, no code change. Read afresh on each call: a treebank
    copied in while the process runs (or a data root set later through $BERTOLOGY_DATA) is seen.
    """
    from workbench.paths import data_root

    found = dict(SHIPPED_TREEBANKS)
    ud = data_root(required=False) / "ud"
    if ud.is_dir():
        for folder in sorted(ud.iterdir()):
            splits = tuple(s for s in SPLITS if (folder / f"{folder.name}-ud-{s}.conllu").is_file())
            if splits and folder.name not in found:
                found[folder.name] = splits
    return found


class _Treebanks(Mapping):
    """`TREEBANKS`: name -> splits, a read-only view of `discover_treebanks()` (looked up afresh)."""

    def __getitem__(self, name: str) -> tuple[str, ...]:
        return discover_treebanks()[name]

    def __iter__(self):
        return iter(discover_treebanks())

    def __len__(self) -> int:
        return len(discover_treebanks())

    def __contains__(self, name) -> bool:
        return name in discover_treebanks()

    def __repr__(self) -> str:
        return f"TREEBANKS({discover_treebanks()!r})"


TREEBANKS: Mapping[str, tuple[str, ...]] = _Treebanks()

_INT_ID = re.compile(r"[1-9][0-9]*\Z")
_RANGE_ID = re.compile(r"([1-9][0-9]*)-([1-9][0-9]*)\Z")
_EMPTY_ID = re.compile(r"(0|[1-9][0-9]*)\.[1-9][0-9]*\Z")
_HEAD = re.compile(r"(0|[1-9][0-9]*)\Z")


@dataclass
class Sentence:
    """One sentence: the syntactic words (integer ids) and their annotation.

    Multiword-token ranges (`3-4 don't`) and empty nodes (`8.1`) are not words here; the surface
    text keeps the multiword tokens. `line` is the 1-based line where the sentence block starts;
    `word_lines[i]` is the line of word i (for error messages further down the pipeline).
    """

    sent_id: str
    text: str
    words: list[str]
    lemmas: list[str]
    upos: list[str]
    xpos: list[str]
    feats: list[str]
    heads: list[int]
    deprels: list[str]
    misc: list[str]
    doc_id: str | None
    path: str
    line: int
    word_lines: list[int] = field(default_factory=list, repr=False)
    entity_fields: tuple[str, ...] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.words)


def treebank_path(name: str, split: str) -> Path:
    treebanks = discover_treebanks()
    if name not in treebanks:
        raise ValueError(f"unknown treebank {name!r}; known: {sorted(treebanks)}")
    if split not in treebanks[name]:
        raise ValueError(f"treebank {name} has no {split!r} split; it has {treebanks[name]}")
    return data_path("ud", name, f"{name}-ud-{split}.conllu")


def load_treebank(name: str, split: str) -> list[Sentence]:
    """A UD treebank split from the data root, e.g. `load_treebank("en_ewt", "train")`."""
    return read_conllu(treebank_path(name, split))


class _Block:
    """The lines of one sentence while it is being read."""

    __slots__ = ("start", "comments", "rows", "tokens", "space_after", "mwt_end")

    def __init__(self, start: int):
        self.start = start
        self.comments: dict[str, str] = {}
        self.rows: list[tuple[int, list[str]]] = []
        self.tokens: list[str] = []  # surface tokens, for sentences without `# text`
        self.space_after: list[bool] = []
        self.mwt_end = 0  # last word id covered by the current multiword token


def read_conllu(path: str | Path) -> list[Sentence]:
    """Read and validate a CoNLL-U file.

    Raises DataFormatError(path, line, ...) for: a token line without exactly 10 tab-separated
    columns, an empty column, a malformed or out-of-sequence ID, a bad multiword range, a
    non-integer HEAD, a HEAD outside 0..n, a cycle in the tree, not exactly one root, a sentence
    with no words, and undecodable UTF-8.
    """
    path = Path(path)
    sentences: list[Sentence] = []
    doc_id: str | None = None
    entity_fields: tuple[str, ...] | None = None
    block: _Block | None = None
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = path.read_bytes()[: e.start].count(b"\n") + 1
        raise DataFormatError(path, line, f"not UTF-8: {e.reason}") from None
    lines = raw.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for lineno, line in enumerate(lines, start=1):
        line = line.rstrip("\r")
        if not line.strip():
            if block is not None:
                sentences.append(_finish(block, path, doc_id, entity_fields))
                block = None
            continue
        if block is None:
            block = _Block(lineno)
        if line.startswith("#"):
            if block.rows:
                raise DataFormatError(path, lineno, "comment line inside a sentence's token lines")
            key, sep, value = line[1:].partition("=")
            key = key.strip()
            value = value.strip() if sep else ""
            if key == "newdoc id" or (key == "newdoc" and not sep):
                doc_id = value or f"{path.name}:{lineno}"
            elif key == "global.Entity":
                entity_fields = tuple(value.split("-"))
            block.comments.setdefault(key, value)
            continue
        cols = line.split("\t")
        if len(cols) != 10:
            raise DataFormatError(path, lineno, f"expected 10 tab-separated columns, found {len(cols)}")
        if any(c == "" for c in cols):
            raise DataFormatError(path, lineno, f"empty column {cols.index('') + 1}")
        tid = cols[0]
        expected = len(block.rows) + 1
        if _INT_ID.match(tid):
            if int(tid) != expected:
                raise DataFormatError(path, lineno, f"word id {tid} out of sequence (expected {expected})")
            if not _HEAD.match(cols[6]):
                raise DataFormatError(path, lineno, f"HEAD {cols[6]!r} of word {tid} is not an integer")
            block.rows.append((lineno, cols))
            if expected > block.mwt_end:
                block.tokens.append(cols[1])
                block.space_after.append("SpaceAfter=No" not in cols[9])
        elif m := _RANGE_ID.match(tid):
            first, last = int(m.group(1)), int(m.group(2))
            if first != expected or last <= first:
                raise DataFormatError(path, lineno, f"multiword range {tid} does not start at word {expected}")
            block.mwt_end = last
            block.tokens.append(cols[1])
            block.space_after.append("SpaceAfter=No" not in cols[9])
        elif _EMPTY_ID.match(tid):
            continue  # empty nodes belong to enhanced dependencies only
        else:
            raise DataFormatError(path, lineno, f"malformed ID {tid!r}")
    if block is not None:
        sentences.append(_finish(block, path, doc_id, entity_fields))
    return sentences


def _finish(block: _Block, path: Path, doc_id: str | None, entity_fields) -> Sentence:
    rows = block.rows
    if not rows:
        raise DataFormatError(path, block.start, "sentence has no words")
    n = len(rows)
    if block.mwt_end > n:
        raise DataFormatError(path, block.start, f"multiword range ends at word {block.mwt_end}, sentence has {n}")
    heads = [int(cols[6]) for _, cols in rows]
    for (lineno, cols), head in zip(rows, heads):
        if head > n:
            raise DataFormatError(path, lineno, f"HEAD {head} of word {cols[0]} is outside 0..{n}")
    _check_tree(heads, rows, path)
    if "text" in block.comments:
        text = block.comments["text"]
    else:
        text = "".join(t + (" " if sp else "") for t, sp in zip(block.tokens, block.space_after)).rstrip()
    return Sentence(
        sent_id=block.comments.get("sent_id") or f"{path.name}:{block.start}",
        text=text,
        words=[c[1] for _, c in rows],
        lemmas=[c[2] for _, c in rows],
        upos=[c[3] for _, c in rows],
        xpos=[c[4] for _, c in rows],
        feats=[c[5] for _, c in rows],
        heads=heads,
        deprels=[c[7] for _, c in rows],
        misc=[c[9] for _, c in rows],
        doc_id=doc_id,
        path=str(path),
        line=block.start,
        word_lines=[ln for ln, _ in rows],
        entity_fields=entity_fields,
    )


def _check_tree(heads: list[int], rows, path: Path) -> None:
    """Every word must reach the root (no cycle), and exactly one word hangs from 0."""
    n = len(heads)
    state = [0] * (n + 1)  # 0 unseen, 1 on the current path, 2 reaches the root
    state[0] = 2
    for start in range(1, n + 1):
        walk = []
        node = start
        while state[node] == 0:
            state[node] = 1
            walk.append(node)
            node = heads[node - 1]
        if state[node] == 1:
            cycle = walk[walk.index(node):]
            lineno = rows[node - 1][0]
            raise DataFormatError(path, lineno, f"cycle in the dependency tree through words {sorted(cycle)}")
        for w in walk:
            state[w] = 2
    roots = [i for i, h in enumerate(heads) if h == 0]
    if len(roots) != 1:
        raise DataFormatError(path, rows[roots[1]][0], f"{len(roots)} words attach to the root (HEAD 0); expected 1")


# --------------------------------------------------------------------------- coreference (GUM)

DEFAULT_ENTITY_FIELDS = ("eid", "etype")


@dataclass
class Mention:
    """A mention: words start..end (inclusive, 0-based) of sentences[sent_index].

    `entity_id` is document-qualified (`"<doc_id>/<GUM id>"`) because GUM's ids restart in every
    document; `chains[entity_id]` lists the entity's mentions in text order.
    """

    doc_id: str
    sent_index: int
    start: int
    end: int
    entity_id: str
    entity_type: str
    text: str = ""


_CLOSE = re.compile(r"([^()\s]+)\)")


def _entity_items(value: str, sentence: Sentence, w: int):
    """Split one `Entity=` value into ('open'|'single', fields) and ('close', eid) items."""
    pos = 0
    n = len(value)
    while pos < n:
        if value[pos] == "(":
            j = pos + 1
            while j < n and value[j] not in "()":
                j += 1
            spec = value[pos + 1 : j]
            if not spec:
                raise DataFormatError(sentence.path, sentence.word_lines[w], f"empty mention in Entity={value}")
            if j < n and value[j] == ")":
                yield "single", spec
                pos = j + 1
            else:
                yield "open", spec
                pos = j
        else:
            m = _CLOSE.match(value, pos)
            if not m:
                raise DataFormatError(sentence.path, sentence.word_lines[w], f"cannot parse Entity={value} at {pos}")
            yield "close", m.group(1)
            pos = m.end()


def read_gum_coref(sentences: list[Sentence]) -> tuple[list[Mention], dict[str, list[Mention]]]:
    """Mentions and coreference chains from the MISC `Entity=` attribute (CorefUD brackets).

    The field order of an opening bracket comes from the `# global.Entity` header (GUM:
    GRP-etype-infstat-salience-centering-minspan-link-identity); the last field may itself
    contain hyphens (Wikipedia identities), so a spec is split into at most that many fields.
    A closing bracket closes the most recent open mention of that entity. Every mention must
    close inside its sentence (GUM mentions never cross sentences); a mention left open, or a
    close without an open, raises DataFormatError naming the file and line.
    Singletons (entities with one mention) are kept: they are chains of length 1.
    """
    mentions: list[Mention] = []
    for si, sent in enumerate(sentences):
        fields = sent.entity_fields or DEFAULT_ENTITY_FIELDS
        type_at = fields.index("etype") if "etype" in fields else 1
        doc = sent.doc_id or sent.path
        open_: dict[str, list[tuple[int, str]]] = {}
        for w, misc in enumerate(sent.misc):
            if "Entity=" not in misc:
                continue
            for attr in misc.split("|"):
                if not attr.startswith("Entity="):
                    continue
                for kind, spec in _entity_items(attr[len("Entity="):], sent, w):
                    if kind == "close":
                        stack = open_.get(spec)
                        if not stack:
                            raise DataFormatError(
                                sent.path, sent.word_lines[w], f"entity {spec} closes but is not open in {sent.sent_id}"
                            )
                        start, etype = stack.pop()
                        mentions.append(_mention(doc, si, start, w, spec, etype, sent))
                        continue
                    parts = spec.split("-", len(fields) - 1)
                    eid = parts[0]
                    etype = parts[type_at] if type_at < len(parts) else ""
                    if kind == "single":
                        mentions.append(_mention(doc, si, w, w, eid, etype, sent))
                    else:
                        open_.setdefault(eid, []).append((w, etype))
        left = [(eid, start) for eid, stack in open_.items() for start, _ in stack]
        if left:
            eid, start = left[0]
            raise DataFormatError(
                sent.path, sent.word_lines[start], f"mention of entity {eid} opens here and never closes in {sent.sent_id}"
            )
    mentions.sort(key=lambda m: (m.sent_index, m.start, -m.end))
    chains: dict[str, list[Mention]] = {}
    for m in mentions:
        chains.setdefault(m.entity_id, []).append(m)
    return mentions, chains


def _mention(doc: str, si: int, start: int, end: int, eid: str, etype: str, sent: Sentence) -> Mention:
    return Mention(doc, si, start, end, f"{doc}/{eid}", etype, " ".join(sent.words[start : end + 1]))
