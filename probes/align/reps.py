"""Where the alignment probes' vectors come from: corpora and dictionaries named as data, and the
three representations (type-level anchors, static input embeddings, mean-pooled sentences).

Corpora, dictionaries and seeds are strings in a config, so a new language pair is a config:

| spec | meaning |
|---|---|
| `raw:<name>` | a raw corpus of `workbench.data.raw` (brown, wikitext2, ewt_raw, cess_esp, conll2002_esp, ...), lines tokenised at word/punctuation boundaries |
| `ud:<treebank>[:<split>]` | the words of a UD treebank split (all splits when none is given), e.g. `ud:en_pud`, `ud:es_gsd:dev` |
| `split:<corpus>:<rule>` | the speeches of `state_union` or `inaugural` that a rule keeps: `party=<party>` or `years=<from>-<to>` (`probes.align.communities`), e.g. `split:state_union:party=Democratic` |
| `columns:<path>` | a column file under the data root (CoNLL-2002/2003 style: the first column is the word, blank lines end sentences, `-DOCSTART-` lines skipped), e.g. `columns:nltk/conll2002/ned.train` |
| `a+b` | the sentences of several specs, in order |

Dictionaries: `swadesh:<src>-<tgt>` (every variant on each side, Swadesh 1955 lists of NLTK) or
`tsv:<path>` (one `source<TAB>target` pair per line; a path under the data root or absolute).
Seeds for self-learning: `numerals` (identical digit strings, Artetxe et al. 2017), `identical`
(all identically spelled words), or a dictionary spec.

Representations (all layer-major `[L+1, n, H]`, layer 0 = embedding output):
- `type_vectors`: a word type's contextual vectors averaged over its occurrences (the "anchors" of
  Schuster et al. 2019), from the cached word activations;
- `sentence_vectors`: the mean of a sentence's word vectors;
- `static_vectors`: rows of the input embedding matrix (the mean over a word's subword rows), the
  static case of Mikolov et al. (2013) / Conneau et al. (2018).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy import sparse

from workbench.errors import ConfigError, DataFormatError
from workbench.paths import data_path

_TOKEN = re.compile(r"\w+(?:[-'’.]\w+)*|[^\w\s]")


def tokenize(line: str) -> list[str]:
    """Words and single punctuation marks ("don't" and "3.5" stay whole)."""
    return _TOKEN.findall(line)


@dataclass
class Corpus:
    """Word-tokenised sentences from one spec, with the data files they came from (for manifests)."""

    spec: str
    sentences: list[list[str]]
    files: list[Path]
    sent_ids: list[str] | None = None  # UD sentence ids (for parallel treebanks)
    lemmas: list[list[str]] | None = None
    docs: list[str] | None = None  # each sentence's document id (raw and split corpora: the independent unit)


def _raw(name: str) -> Corpus:
    from workbench.data import raw

    if name not in raw.RAW_CORPORA:
        raise ConfigError(f"raw:{name}: unknown raw corpus; known: {sorted(raw.RAW_CORPORA)}")
    return _documents(f"raw:{name}", raw.load_documents(name), list(raw.source_files(name)))


def _documents(spec: str, documents, files: list[Path]) -> Corpus:
    """Every non-empty line of the documents as a sentence, with its document id."""
    sents, docs = [], []
    for doc in documents:
        for line in doc.text.split("\n"):
            words = tokenize(line)
            if words:
                sents.append(words)
                docs.append(doc.doc_id)
    return Corpus(spec, sents, files, docs=docs)


def _split(arg: str) -> Corpus:
    """The documents of a raw corpus that a grouping rule keeps (`probes.align.communities`)."""
    from probes.align import communities
    from workbench.data import raw

    name, key, value = communities.parse(arg)
    kept = [d for d in raw.load_documents(name) if communities.keeps(d.doc_id, key, value)]
    if not kept:
        raise ConfigError(f"split:{arg}: no {name} speech matches {key}={value}")
    names = {d.doc_id.rsplit("/", 1)[-1] for d in kept}
    return _documents(f"split:{arg}", kept, [f for f in raw.source_files(name) if f.name in names])


def _ud(arg: str) -> Corpus:
    from workbench.data import conllu

    name, _, split = arg.partition(":")
    if name not in conllu.TREEBANKS:
        raise ConfigError(f"ud:{arg}: unknown treebank; known: {sorted(conllu.TREEBANKS)}")
    splits = [split] if split else list(conllu.TREEBANKS[name])
    sents, ids, lemmas, files, docs = [], [], [], [], []
    for sp in splits:
        if sp not in conllu.TREEBANKS[name]:
            raise ConfigError(f"ud:{arg}: treebank {name} has no split {sp!r} (it has {conllu.TREEBANKS[name]})")
        path = conllu.treebank_path(name, sp)
        files.append(path)
        for s in conllu.read_conllu(path):
            if s.words:
                sents.append(list(s.words))
                ids.append(s.sent_id)
                lemmas.append(list(s.lemmas))
                docs.append(f"{name}:{sp}/{s.doc_id}" if s.doc_id is not None else None)
    # the `# newdoc id` each sentence belongs to (the independent unit), when the treebank marks every one
    return Corpus(f"ud:{arg}", sents, files, ids, lemmas, docs=docs if None not in docs else None)


def _columns(rel: str) -> Corpus:
    path = data_path(*Path(rel).parts)
    if not path.is_file():
        raise ConfigError(f"columns:{rel}: no such file under the data root ({path})")
    from workbench.data.raw import decode

    sents, words, docs, doc, marked = [], [], [], 0, False
    for lineno, line in enumerate(decode(path).split("\n") + [""], start=1):
        line = line.strip()
        word = line.split()[0] if line else ""
        if not line or word == "-DOCSTART-":
            if words:
                sents.append(words)
                docs.append(f"columns:{rel}#{doc}")
            words = []
            if word == "-DOCSTART-":  # a new document begins (CoNLL-2002/2003)
                doc, marked = doc + (1 if docs else 0), True
            continue
        if not word:
            raise DataFormatError(path, lineno, "empty word column")
        words.append(word)
    if not sents:
        raise DataFormatError(path, None, "no sentences (expected one word per line, blank lines between sentences)")
    return Corpus(f"columns:{rel}", sents, [path], docs=docs if marked else None)


_READERS = {"raw": _raw, "ud": _ud, "columns": _columns, "split": _split}


def load_corpus(spec: str) -> Corpus:
    """Sentences of a corpus spec (see the module docstring); `a+b` concatenates."""
    parts = [p.strip() for p in spec.split("+") if p.strip()]
    if not parts:
        raise ConfigError(f"empty corpus spec {spec!r}")
    out = []
    for part in parts:
        kind, sep, arg = part.partition(":")
        if not sep or kind not in _READERS or not arg:
            raise ConfigError(f"corpus spec {part!r}: expected one of {sorted(_READERS)} followed by ':<name>'")
        out.append(_READERS[kind](arg))
    if len(out) == 1:
        return out[0]
    has_ids = all(c.sent_ids is not None for c in out)
    has_docs = all(c.docs is not None for c in out)
    return Corpus(spec, [s for c in out for s in c.sentences], [f for c in out for f in c.files],
                  [i for c in out for i in c.sent_ids] if has_ids else None,
                  [l for c in out for l in c.lemmas] if has_ids else None,
                  [d for c in out for d in c.docs] if has_docs else None)


def _sample_index(n: int, max_sentences: int, seed: int) -> np.ndarray:
    if max_sentences and n > max_sentences:
        return np.sort(np.random.default_rng(seed).choice(n, max_sentences, replace=False))
    return np.arange(n)


def sample_sentences(sentences: list[list[str]], max_sentences: int, seed: int,
                     max_words: int = 128) -> list[list[str]]:
    """At most `max_sentences` sentences (a seeded sample, original order kept), each cut to
    `max_words` words so one long line cannot dominate extraction time."""
    return [sentences[i][:max_words] for i in _sample_index(len(sentences), max_sentences, seed)]


def sample_corpus(corpus: Corpus, max_sentences: int, seed: int, max_words: int = 128) -> Corpus:
    """`sample_sentences` of a corpus, its document ids kept beside the sampled sentences."""
    idx = _sample_index(len(corpus.sentences), max_sentences, seed)
    docs = [corpus.docs[i] for i in idx] if corpus.docs is not None else None
    return Corpus(corpus.spec, [corpus.sentences[i][:max_words] for i in idx], corpus.files, docs=docs)


# --------------------------------------------------------------------------- dictionaries


def load_dictionary(spec: str, lowercase: bool = True) -> tuple[list[tuple[str, str]], list[Path]]:
    """(source word, target word) pairs of a dictionary spec, and the files read."""
    kind, sep, arg = spec.partition(":")
    if kind == "swadesh" and sep:
        from workbench.data.swadesh import bilingual_dictionary, swadesh_languages

        src, dash, tgt = arg.partition("-")
        known = swadesh_languages()
        if not dash or src not in known or tgt not in known:
            raise ConfigError(f"dictionary {spec!r}: expected swadesh:<src>-<tgt> with languages from {known}")
        pairs = bilingual_dictionary(src, tgt, all_variants=True)
        files = [data_path("nltk", "swadesh", src), data_path("nltk", "swadesh", tgt)]
    elif kind == "tsv" and sep:
        path = Path(arg) if Path(arg).is_absolute() else data_path(*Path(arg).parts)
        if not path.is_file():
            raise ConfigError(f"dictionary {spec!r}: no such file {path}")
        pairs = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
            if not line.strip():
                continue
            cols = line.rstrip("\r").split("\t")
            if len(cols) != 2 or not cols[0].strip() or not cols[1].strip():
                raise DataFormatError(path, lineno, f"expected 'source<TAB>target', found {line!r}")
            pairs.append((cols[0].strip(), cols[1].strip()))
        files = [path]
    else:
        raise ConfigError(f"dictionary {spec!r}: expected swadesh:<src>-<tgt> or tsv:<path>")
    if lowercase:
        pairs = [(a.lower(), b.lower()) for a, b in pairs]
    # multi-word Swadesh variants ("lie down") cannot be a single type vector
    pairs = list(dict.fromkeys((a, b) for a, b in pairs if " " not in a and " " not in b))
    return pairs, files


# --------------------------------------------------------------------------- vocabularies


def key(word: str, lowercase: bool) -> str:
    return word.lower() if lowercase else word


def build_vocabulary(sentences: Sequence[Sequence[str]], size: int, min_count: int, lowercase: bool,
                     keep: Sequence[str] = ()) -> tuple[list[str], np.ndarray]:
    """The `size` most frequent word types with at least `min_count` occurrences (alphabetic order
    breaks ties), plus any `keep` words that occur at least `min_count` times; frequency order.
    Returns the words and their counts."""
    counts = Counter(key(w, lowercase) for s in sentences for w in s)
    ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    chosen = ranked[:size]
    have = set(chosen)
    extra = sorted({k for k in keep if counts.get(k, 0) >= min_count and k not in have}, key=lambda w: (-counts[w], w))
    words = chosen + extra
    return words, np.array([counts[w] for w in words], dtype=np.int64)


# --------------------------------------------------------------------------- representations


def _averaging_matrix(groups: np.ndarray, n_groups: int) -> sparse.csr_matrix:
    """Sparse [n_groups, N]: row g averages the positions whose group id is g (-1 = none)."""
    keep = np.flatnonzero(groups >= 0)
    g = groups[keep]
    counts = np.bincount(g, minlength=n_groups).astype(np.float64)
    weights = 1.0 / counts[g]
    return sparse.csr_matrix((weights, (g, keep)), shape=(n_groups, len(groups)))


def word_index(sentences: Sequence[Sequence[str]], vocab: Sequence[str], lowercase: bool = True) -> np.ndarray:
    """Each word position's vocabulary index (-1 when the word is not in `vocab`)."""
    index = {w: i for i, w in enumerate(vocab)}
    return np.fromiter((index.get(key(w, lowercase), -1) for s in sentences for w in s), dtype=np.int64)


def type_vectors(layers: np.ndarray, sentences: Sequence[Sequence[str]], vocab: Sequence[str],
                 lowercase: bool = True, layer_ids: Sequence[int] | None = None,
                 mask: np.ndarray | None = None) -> np.ndarray:
    """[len(layer_ids), V, H]: each vocabulary word's vectors averaged over its occurrences
    (Schuster et al. 2019's anchors). `layers` is `Activations.layers` for exactly `sentences`;
    `mask` (bool per word position) restricts the occurrences used (split-half controls).
    A word with no occurrence gets a zero row."""
    ids = word_index(sentences, vocab, lowercase)
    if len(ids) != layers.shape[1]:
        raise ConfigError(f"{len(ids)} words in the sentences but {layers.shape[1]} activation rows")
    if mask is not None:
        ids[~np.asarray(mask, dtype=bool)] = -1
    M = _averaging_matrix(ids, len(vocab))
    layer_ids = range(layers.shape[0]) if layer_ids is None else layer_ids
    return np.stack([M @ np.asarray(layers[l], dtype=np.float64) for l in layer_ids])


def sentence_vectors(layers: np.ndarray, offsets: np.ndarray, layer_ids: Sequence[int] | None = None) -> np.ndarray:
    """[len(layer_ids), S, H]: mean of each sentence's word vectors."""
    lengths = np.diff(offsets)
    groups = np.repeat(np.arange(len(lengths)), lengths)
    M = _averaging_matrix(groups, len(lengths))
    layer_ids = range(layers.shape[0]) if layer_ids is None else layer_ids
    return np.stack([M @ np.asarray(layers[l], dtype=np.float64) for l in layer_ids])


def static_vectors(handle, words: Sequence[str]) -> np.ndarray:
    """[V, E]: the mean input-embedding row of each word's subword tokens (no special tokens;
    a word mapped to no token gets a zero row)."""
    import torch

    emb = handle.model.get_input_embeddings().weight.detach().to("cpu", torch.float64).numpy()
    out = np.zeros((len(words), emb.shape[1]))
    for i, w in enumerate(words):
        ids = handle.tokenizer(w, add_special_tokens=False)["input_ids"]
        if ids:
            out[i] = emb[ids].mean(axis=0)
    return out
