"""CoNLL-2002 named entities (Tjong Kim Sang 2002): Spanish (EFE news wire) and Dutch (De Morgen),
one `word POS tag` line per token, BIO tags over PER, ORG, LOC and MISC, sentences separated by
blank lines; the data root holds NLTK's copy (`nltk/conll2002/`).

Splits as the shared task used them: train = `*.train`, dev = `*.testa`, test = `*.testb`.
The Dutch files start their documents with a `-DOCSTART-` line, dropped here (it is no sentence).
"""

from __future__ import annotations

from dataclasses import dataclass

from workbench.errors import ConfigError
from workbench.paths import data_path

LANGUAGES = {"es": "esp", "nl": "ned"}
SPLITS = {"train": "train", "dev": "testa", "test": "testb"}


@dataclass(frozen=True)
class NerSentence:
    sent_id: str
    words: tuple[str, ...]
    tags: tuple[str, ...]


def conll2002_path(language: str, split: str):
    if language not in LANGUAGES:
        raise ConfigError(f"conll2002: unknown language {language!r} (known: {', '.join(LANGUAGES)})")
    if split not in SPLITS:
        raise ConfigError(f"conll2002: unknown split {split!r} (known: {', '.join(SPLITS)})")
    return data_path("nltk", "conll2002", f"{LANGUAGES[language]}.{SPLITS[split]}")


def load_conll2002(language: str, split: str) -> list[NerSentence]:
    """The split's sentences, ids `conll2002_<lang>/<split>/<n>` (n counts sentences in the file)."""
    path = conll2002_path(language, split)
    sentences: list[NerSentence] = []
    words: list[str] = []
    tags: list[str] = []

    def flush():
        if words and words[0] != "-DOCSTART-":
            sentences.append(NerSentence(f"conll2002_{language}/{split}/{len(sentences)}", tuple(words), tuple(tags)))
        words.clear()
        tags.clear()

    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.split()
        if not parts:
            flush()
            continue
        if len(parts) < 2:
            raise ConfigError(f"{path}:{n}: expected 'word [POS] tag', got {line!r}")
        words.append(parts[0])
        tags.append(parts[-1])
    flush()
    return sentences
