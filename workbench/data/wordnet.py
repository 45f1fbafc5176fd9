"""Princeton WordNet 3.0 (Miller, 1995; Fellbaum, 1998) through NLTK's WordNetCorpusReader.

The data root holds the WordNet database files but not `lexnames`, which the NLTK reader needs
(it maps each synset's lexicographer-file number to a name such as `noun.animal`). The data
root is read-only, so the reader is pointed at a copy of the folder under `cache_root()` (28 MB,
made once) with `lexnames` added: the fixed list of the 45 lexicographer files of WordNet 3.0
(wndb(5WN) / lexnames(5WN)). A copy rather than links because NLTK 3.10's path sandbox
(`nltk.pathsec`) refuses symlinks and any folder not on `nltk.data.path`; the copy's folder is
appended to `nltk.data.path` so the reader may open it.

Used by the oLMpics-style cloze probes (Talmor et al., 2020): antonyms, hypernyms, synonyms.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
import warnings
from pathlib import Path

from workbench.io import atomic_dir
from workbench.paths import cache_root, data_path

# (number, name, syntactic category: 1 noun, 2 verb, 3 adjective, 4 adverb)
LEXNAMES: list[tuple[int, str, int]] = [
    (0, "adj.all", 3), (1, "adj.pert", 3), (2, "adv.all", 4), (3, "noun.Tops", 1),
    (4, "noun.act", 1), (5, "noun.animal", 1), (6, "noun.artifact", 1), (7, "noun.attribute", 1),
    (8, "noun.body", 1), (9, "noun.cognition", 1), (10, "noun.communication", 1), (11, "noun.event", 1),
    (12, "noun.feeling", 1), (13, "noun.food", 1), (14, "noun.group", 1), (15, "noun.location", 1),
    (16, "noun.motive", 1), (17, "noun.object", 1), (18, "noun.person", 1), (19, "noun.phenomenon", 1),
    (20, "noun.plant", 1), (21, "noun.possession", 1), (22, "noun.process", 1), (23, "noun.quantity", 1),
    (24, "noun.relation", 1), (25, "noun.shape", 1), (26, "noun.state", 1), (27, "noun.substance", 1),
    (28, "noun.time", 1), (29, "verb.body", 2), (30, "verb.change", 2), (31, "verb.cognition", 2),
    (32, "verb.communication", 2), (33, "verb.competition", 2), (34, "verb.consumption", 2),
    (35, "verb.contact", 2), (36, "verb.creation", 2), (37, "verb.emotion", 2), (38, "verb.motion", 2),
    (39, "verb.perception", 2), (40, "verb.possession", 2), (41, "verb.social", 2), (42, "verb.stative", 2),
    (43, "verb.weather", 2), (44, "adj.ppl", 3),
]


def lexnames_text() -> str:
    return "".join(f"{num:02d}\t{name}\t{cat}\n" for num, name, cat in LEXNAMES)


def wordnet_dir() -> Path:
    """A reader-ready WordNet folder under the cache root (built once, atomically)."""
    src = data_path("wordnet-3.0")
    key = hashlib.sha256(f"{src.resolve()}\n{lexnames_text()}".encode()).hexdigest()[:16]
    out = cache_root() / "wordnet" / f"wordnet-3.0-{key}"
    files = sorted(f for f in src.iterdir() if f.is_file())
    fresh = (out / "lexnames").is_file() and all(
        (out / f.name).is_file() and (out / f.name).stat().st_size == f.stat().st_size for f in files
    )
    if not fresh:
        with atomic_dir(out) as tmp:
            for f in files:
                shutil.copyfile(f, tmp / f.name)
            (tmp / "lexnames").write_text(lexnames_text(), encoding="utf-8")
    return out


@functools.lru_cache(maxsize=1)
def wordnet():
    """The NLTK WordNetCorpusReader over WordNet 3.0 (English only: no Open Multilingual WordNet)."""
    import nltk.data
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    root = str(wordnet_dir())
    if root not in nltk.data.path:
        nltk.data.path.append(root)
    class WordNet30(WordNetCorpusReader):
        def map_wn(self, version="wordnet"):
            # NLTK maps this WordNet onto its downloadable `wordnet` resource for the
            # multilingual (OMW) functions; this IS WordNet 3.0 and OMW is not used.
            return None

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The multilingual functions are not available")
        return WordNet30(root, None)


def _name(lemma_name: str) -> str:
    return lemma_name.replace("_", " ")


def _unique(items) -> list[str]:
    return list(dict.fromkeys(items))


def _sorted(synsets_or_lemmas):
    # NLTK keeps pointers in sets, so their order changes with PYTHONHASHSEED; sort for stable output.
    return sorted(synsets_or_lemmas, key=lambda x: x.name() if hasattr(x, "name") else str(x))


def synsets(word: str, pos: str | None = None):
    """Synsets of `word` (morphy-lemmatised by NLTK), most frequent sense first."""
    return wordnet().synsets(word.replace(" ", "_"), pos=pos)


def synonyms(word: str, pos: str | None = None) -> list[str]:
    """Other lemmas of the synsets of `word`, in sense order, without `word` itself."""
    w = word.lower()
    return [n for n in _unique(_name(lm.name()) for s in synsets(word, pos) for lm in s.lemmas()) if n.lower() != w]


def antonyms(word: str, pos: str | None = None) -> list[str]:
    """Direct antonyms of the lemmas of `word` (WordNet's lexical antonymy, e.g. hot -> cold)."""
    w = word.lower()
    return _unique(
        _name(a.name())
        for s in synsets(word, pos)
        for lm in s.lemmas()
        if lm.name().lower() == w.replace(" ", "_")
        for a in _sorted(lm.antonyms())
    )


def hypernyms(word: str, pos: str | None = None, instances: bool = True) -> list[str]:
    """Lemmas of the direct hypernyms (and instance hypernyms) of the synsets of `word`, in sense
    order, each sense's hypernyms sorted by synset name."""
    out = []
    for s in synsets(word, pos):
        parents = _sorted(s.hypernyms()) + (_sorted(s.instance_hypernyms()) if instances else [])
        out.extend(_name(lm.name()) for p in parents for lm in p.lemmas())
    return _unique(out)


def hypernym_synsets(word: str, pos: str | None = None):
    """(synset, its direct hypernym synsets) for every synset of `word`."""
    return [(s, _sorted(s.hypernyms()) + _sorted(s.instance_hypernyms())) for s in synsets(word, pos)]
