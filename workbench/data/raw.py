"""Raw text corpora as documents: the pretraining material and the sentiment sets.

A `Document.text` holds one sentence (or one source line/paragraph where the source has no
sentence split) per line, never an empty line. Documents are the unit of the corpus builder's
train/held-out split, so they are chosen as the natural independent units of each source:

| name | document | lines |
|---|---|---|
| brown | a Brown file (ca01 ... cr09, 500 samples of ~2,000 words; Francis & Kucera, 1979) | sentences, tags stripped |
| abc | a blank-line separated block of ABC rural/science news (a story, or a sub-headed section of one) | source lines |
| webtext | a webtext file (firefox, grail, overheard, pirates, singles, wine) | source lines |
| state_union, inaugural | a speech (one file) | paragraphs |
| wikitext2 | a Wikipedia article of WikiText-2 valid/test (Merity et al., 2016), split at ` = Title = ` | paragraphs and headings |
| ewt_raw, gum_raw | a treebank document (`# newdoc id`), all splits | `# text =` sentences |
| cess_esp | a CESS-ESP treebank file (Marti et al., 2007) | sentences (words of the trees) |
| conll2002_esp | an EFE news-wire article of CoNLL-2002 Spanish (Tjong Kim Sang, 2002), split at datelines | sentences |
| sentence_polarity | one rt-polarity snippet (Pang & Lee, 2005) | one |
| movie_reviews | one review (Pang & Lee, 2004) | sentences |
| subjectivity | one subjective/objective sentence (Pang & Lee, 2004) | one |

The sentiment sets also come as labelled examples: `load_labelled(name) -> [(text, label)]`, in
the same order as `load_documents(name)`.

Files are read as UTF-8 when they decode as UTF-8 and as Windows-1252 otherwise (several NLTK
files are Latin-1/cp1252); nothing is downloaded and nothing is written into the data root.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

from workbench.errors import DataFormatError
from workbench.paths import data_path


@dataclass
class Document:
    doc_id: str
    source: str
    text: str


class LabelledExample(NamedTuple):
    text: str
    label: str


def decode(path: Path) -> str:
    """UTF-8 if the bytes are valid UTF-8, else Windows-1252 (Latin-1 for its 5 unused bytes)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("cp1252")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def _lines(text: str) -> list[str]:
    """Source lines with CR/LF endings removed (only \\n splits: U+0085 and friends are text)."""
    return [line.rstrip("\r") for line in text.split("\n")]


def _nonempty(lines) -> list[str]:
    return [s for s in (" ".join(line.split()) for line in lines) if s]


def _files(folder: Path, pattern: str) -> list[Path]:
    rx = re.compile(pattern)
    files = sorted(p for p in folder.iterdir() if p.is_file() and rx.fullmatch(p.name))
    if not files:
        raise DataFormatError(folder, None, f"no files matching {pattern!r}")
    return files


# --------------------------------------------------------------------------- file lists

def _brown_files():
    return _files(data_path("nltk", "brown"), r"c[a-r]\d\d")


def _abc_files():
    return [data_path("nltk", "abc", "rural.txt"), data_path("nltk", "abc", "science.txt")]


def _webtext_files():
    return _files(data_path("nltk", "webtext"), r".+\.txt")


def _state_union_files():
    return _files(data_path("nltk", "state_union"), r".+\.txt")


def _inaugural_files():
    return _files(data_path("nltk", "inaugural"), r".+\.txt")


def _wikitext2_files():
    return [data_path("wikitext-2", "valid.txt"), data_path("wikitext-2", "test.txt")]


def _treebank_files(name):
    from workbench.data.conllu import TREEBANKS, treebank_path

    return [treebank_path(name, split) for split in TREEBANKS[name]]


def _cess_files():
    return _files(data_path("nltk", "cess_esp"), r".+\.tbf")


def _conll2002_files():
    return [data_path("nltk", "conll2002", f) for f in ("esp.train", "esp.testa", "esp.testb")]


def _polarity_files():
    return [data_path("nltk", "sentence_polarity", f) for f in ("rt-polarity.pos", "rt-polarity.neg")]


def _movie_review_files():
    return _files(data_path("nltk", "movie_reviews", "pos"), r".+\.txt") + _files(
        data_path("nltk", "movie_reviews", "neg"), r".+\.txt"
    )


def _subjectivity_files():
    return [data_path("nltk", "subjectivity", f) for f in ("quote.tok.gt9.5000", "plot.tok.gt9.5000")]


# --------------------------------------------------------------------------- readers

_PTB_QUOTES = {"``": '"', "''": '"'}


def _brown() -> list[Document]:
    """Tokens `word/tag` -> word; PTB-style `` and '' become a plain double quote."""
    docs = []
    for path in _brown_files():
        sents = []
        for lineno, line in enumerate(_lines(decode(path)), start=1):
            toks = line.split()
            if not toks:
                continue
            words = []
            for tok in toks:
                word, slash, tag = tok.rpartition("/")
                if not slash or not word or not tag:
                    raise DataFormatError(path, lineno, f"Brown token {tok!r} is not word/TAG")
                words.append(_PTB_QUOTES.get(word, word))
            sents.append(" ".join(words))
        docs.append(Document(f"brown/{path.name}", "brown", "\n".join(sents)))
    return docs


def _abc() -> list[Document]:
    docs = []
    for path in _abc_files():
        block: list[str] = []
        blocks: list[list[str]] = []
        for line in _lines(decode(path)) + [""]:
            if line.strip():
                block.append(line)
            elif block:
                blocks.append(block)
                block = []
        for i, b in enumerate(blocks, start=1):
            docs.append(Document(f"abc/{path.stem}/{i:04d}", "abc", "\n".join(_nonempty(b))))
    return docs


def _per_file(source: str, files: Callable[[], list[Path]]) -> Callable[[], list[Document]]:
    def read() -> list[Document]:
        return [
            Document(f"{source}/{p.name}", source, "\n".join(_nonempty(_lines(decode(p))))) for p in files()
        ]

    read.__doc__ = f"One document per {source} file, one non-empty source line per line."
    return read


_WIKI_TITLE = re.compile(r" = [^=].* = \Z")


def _wikitext2() -> list[Document]:
    """Articles start at a level-1 heading line ` = Title = ` (sub-headings are ` = = ... = = `)."""
    docs = []
    for path in _wikitext2_files():
        articles: list[list[str]] = []
        for line in _lines(decode(path)):
            if _WIKI_TITLE.match(line) or (not articles and line.strip()):
                articles.append([])
            if not articles:
                continue  # blank lines before the first heading
            articles[-1].append(line)
        for i, art in enumerate(articles, start=1):
            text = "\n".join(_nonempty(art))
            if text:
                docs.append(Document(f"wikitext2/{path.stem}/{i:04d}", "wikitext2", text))
    return docs


def _treebank_raw(name: str, source: str) -> Callable[[], list[Document]]:
    def read() -> list[Document]:
        from workbench.data.conllu import TREEBANKS, load_treebank

        docs: dict[str, list[str]] = {}
        for split in TREEBANKS[name]:
            for sent in load_treebank(name, split):
                doc = sent.doc_id or sent.sent_id
                docs.setdefault(f"{name}/{split}/{doc}", []).append(sent.text)
        return [Document(doc_id, source, "\n".join(_nonempty(lines))) for doc_id, lines in docs.items()]

    read.__doc__ = f"The `# text` sentences of {name} (all splits), one document per `# newdoc id`."
    return read


_TBF_LEAF = re.compile(r"\(([^\s()]+) ([^\s()]+)(?: ([^\s()]+))?\)")
_TBF_INNER = re.compile(r"\([^()]*\)")
_CESS_WORDS = {"-Fpa-": "(", "-Fpt-": ")", "-fe-": '"'}


def _cess_sentences(path: Path, defects: list[str]) -> list[str]:
    """The words of each tree, read from the leaves `(tag word lemma)`.

    A tree starts at a line holding only `(` in column 0 (that is how every one of the 6,016
    trees is laid out). `(sn.e-SUJ *0*)` leaves are empty elements (elided subjects) and are
    dropped; multiword names joined by `_` get their spaces back; `-Fpa-`/`-Fpt-`/`-fe-` are
    the treebank's escapes for ( ) ". Three source files have one bracket too many or too few
    in a tree; that does not change which words a tree has, so such trees are kept and listed
    in `defects` (file:line) instead of failing the whole corpus.
    """
    sents: list[list[str]] = []
    balance = 0
    tree_line = 0
    for lineno, line in enumerate(_lines(decode(path)), start=1):
        if line.rstrip() == "(":
            if sents and balance != 0:
                defects.append(f"{path}:{tree_line}: tree has {balance:+d} unmatched brackets")
            sents.append([])
            balance, tree_line = 0, lineno
        elif line.strip() and not sents:
            raise DataFormatError(path, lineno, "text before the first tree")
        balance += line.count("(") - line.count(")")
        for group in _TBF_INNER.findall(line):
            m = _TBF_LEAF.fullmatch(group)
            if m is None:
                raise DataFormatError(path, lineno, f"leaf {group} is not (tag word lemma)")
            tag, word, lemma = m.groups()
            if lemma is None:
                if word != "*0*":
                    raise DataFormatError(path, lineno, f"leaf {group} has no lemma")
                continue
            sents[-1].append(_CESS_WORDS.get(word, word.replace("_", " ")))
    if sents and balance != 0:
        defects.append(f"{path}:{tree_line}: tree has {balance:+d} unmatched brackets")
    return [" ".join(words) for words in sents if words]


def _cess_esp() -> list[Document]:
    defects: list[str] = []
    docs = [Document(f"cess_esp/{p.stem}", "cess_esp", "\n".join(_cess_sentences(p, defects))) for p in _cess_files()]
    if defects:
        warnings.warn(f"cess_esp: {len(defects)} trees with unbalanced brackets kept (words unaffected): " + "; ".join(defects))
    return docs


_DATELINE = re.compile(r"\b\d{1,2} [a-z]{3} \( EFE\w* \) \.?$")


def _conll2002_esp() -> list[Document]:
    """Sentences are blank-line separated `word POS IOB` lines; an article starts at an EFE
    dateline sentence (`Santander , 25 may ( EFE ) .`)."""
    docs = []
    for path in _conll2002_files():
        articles: list[list[str]] = []
        words: list[str] = []
        for lineno, line in enumerate(_lines(decode(path)) + [""], start=1):
            if line.strip():
                cols = line.split(" ")
                if len(cols) != 3:
                    raise DataFormatError(path, lineno, f"expected 'word POS tag', found {line!r}")
                words.append(cols[0])
                continue
            if not words:
                continue
            sent = " ".join(words)
            words = []
            if _DATELINE.search(sent) or not articles:
                articles.append([])
            articles[-1].append(sent)
        for i, art in enumerate(articles, start=1):
            docs.append(Document(f"conll2002_esp/{path.name}/{i:04d}", "conll2002_esp", "\n".join(art)))
    return docs


def _example_per_line(corpus: str, files: list[Path], labels: tuple[str, ...]) -> list[tuple[str, LabelledExample]]:
    """One example per non-empty line, one file per label (sentence_polarity, subjectivity)."""
    out = []
    for path, label in zip(files, labels):
        for i, line in enumerate(_nonempty(_lines(decode(path))), start=1):
            out.append((f"{corpus}/{label}/{i:05d}", LabelledExample(line, label)))
    return out


def _polarity_labelled() -> list[tuple[str, LabelledExample]]:
    return _example_per_line("sentence_polarity", _polarity_files(), ("pos", "neg"))


def _movie_reviews_labelled() -> list[tuple[str, LabelledExample]]:
    out = []
    for path in _movie_review_files():
        label = path.parent.name
        out.append((f"movie_reviews/{label}/{path.stem}", LabelledExample("\n".join(_nonempty(_lines(decode(path)))), label)))
    return out


def _subjectivity_labelled() -> list[tuple[str, LabelledExample]]:
    return _example_per_line("subjectivity", _subjectivity_files(), ("subj", "obj"))


_LABELLED: dict[str, Callable[[], list[tuple[str, LabelledExample]]]] = {
    "sentence_polarity": _polarity_labelled,
    "movie_reviews": _movie_reviews_labelled,
    "subjectivity": _subjectivity_labelled,
}
LABELS = {"sentence_polarity": ("pos", "neg"), "movie_reviews": ("pos", "neg"), "subjectivity": ("subj", "obj")}


def _labelled_docs(name: str) -> Callable[[], list[Document]]:
    def read() -> list[Document]:
        return [Document(doc_id, name, ex.text) for doc_id, ex in _LABELLED[name]()]

    read.__doc__ = f"{name}: one document per labelled example."
    return read


RAW_CORPORA: dict[str, Callable[[], list[Document]]] = {
    "brown": _brown,
    "abc": _abc,
    "webtext": _per_file("webtext", _webtext_files),
    "state_union": _per_file("state_union", _state_union_files),
    "inaugural": _per_file("inaugural", _inaugural_files),
    "wikitext2": _wikitext2,
    "ewt_raw": _treebank_raw("en_ewt", "ewt_raw"),
    "gum_raw": _treebank_raw("en_gum", "gum_raw"),
    "cess_esp": _cess_esp,
    "conll2002_esp": _conll2002_esp,
    "sentence_polarity": _labelled_docs("sentence_polarity"),
    "movie_reviews": _labelled_docs("movie_reviews"),
    "subjectivity": _labelled_docs("subjectivity"),
}

SOURCE_FILES: dict[str, Callable[[], list[Path]]] = {
    "brown": _brown_files,
    "abc": _abc_files,
    "webtext": _webtext_files,
    "state_union": _state_union_files,
    "inaugural": _inaugural_files,
    "wikitext2": _wikitext2_files,
    "ewt_raw": lambda: _treebank_files("en_ewt"),
    "gum_raw": lambda: _treebank_files("en_gum"),
    "cess_esp": _cess_files,
    "conll2002_esp": _conll2002_files,
    "sentence_polarity": _polarity_files,
    "movie_reviews": _movie_review_files,
    "subjectivity": _subjectivity_files,
}

LANGUAGE = {name: "en" for name in RAW_CORPORA} | {"cess_esp": "es", "conll2002_esp": "es"}


def _check_name(name: str) -> None:
    if name not in RAW_CORPORA:
        raise ValueError(f"unknown raw corpus {name!r}; known: {sorted(RAW_CORPORA)}")


def load_documents(name: str) -> list[Document]:
    """All documents of a raw corpus, in a fixed order (sorted files, then file order)."""
    _check_name(name)
    return RAW_CORPORA[name]()


def source_files(name: str) -> list[Path]:
    """The data-root files a corpus is read from (for checksums in manifests)."""
    _check_name(name)
    return SOURCE_FILES[name]()


def load_labelled(name: str) -> list[LabelledExample]:
    """(text, label) examples of a sentiment set, in the order of `load_documents(name)`."""
    return [ex for _, ex in load_labelled_with_ids(name)]


def load_labelled_with_ids(name: str) -> list[tuple[str, LabelledExample]]:
    """(example id, (text, label)) pairs; the ids (`sentence_polarity/pos/00001`) are the
    documents' ids, stable across runs, so a split or a membership list can name its examples."""
    if name not in _LABELLED:
        raise ValueError(f"{name!r} has no labels; labelled sets: {sorted(_LABELLED)}")
    return _LABELLED[name]()


def count_words(text: str) -> int:
    """Whitespace-separated words: the corpus size measure used in manifests."""
    return len(text.split())
