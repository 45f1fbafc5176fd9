"""What the alignment probe loads once per run (`prepare`): corpora, dictionaries, parallel pairs."""

from __future__ import annotations

from typing import Any

import numpy as np

from probes.align import reps
from probes.align.settings import Settings
from probes.core import runner
from workbench.errors import ConfigError


# --------------------------------------------------------------------------- data (once per run)


def prepare(settings: Settings) -> runner.Prepared:
    data: dict[str, Any] = {"corpora": {}, "pair_vectors": {}, "targets": {}}
    files: list = []
    notes: dict[str, Any] = {"corpora": {}}

    def corpus(spec: str, cap: bool = True) -> reps.Corpus:
        if spec not in data["corpora"]:
            c = reps.load_corpus(spec)
            if cap:
                c = reps.sample_corpus(c, settings.max_sentences, settings.seed, settings.max_words)
            data["corpora"][spec] = c
            files.extend(c.files)
            notes["corpora"][spec] = {"sentences": len(c.sentences), "words": sum(map(len, c.sentences))}
        return data["corpora"][spec]

    tasks = set(settings.tasks)
    if "bli" in tasks:
        corpus(settings.src_corpus)
        corpus(settings.tgt_corpus)
    if tasks & {"bli", "parallel"}:
        pairs, dfiles = reps.load_dictionary(settings.dictionary, settings.lowercase)
        data["dictionary"] = pairs
        files.extend(dfiles)
        notes["dictionary"] = {"spec": settings.dictionary, "pairs": len(pairs)}
    if "bli" in tasks and ":" in settings.seed_dictionary:
        data["seed_pairs"], dfiles = reps.load_dictionary(settings.seed_dictionary, settings.lowercase)
        files.extend(dfiles)
    if "fake-language" in tasks:
        corpus(settings.fake_corpus)
    if "parallel" in tasks:
        data["parallel"] = parallel_pairs(settings)
        files.extend(data["parallel"]["files"])
        notes["parallel"] = {"pairs": len(data["parallel"]["src"])}
    if "model-pair" in tasks:
        c = corpus(settings.pair_corpus, cap=False)
        n_words = sum(map(len, c.sentences))
        rng = np.random.default_rng(settings.seed)
        data["pair_index"] = np.sort(rng.choice(n_words, min(settings.pair_words, n_words), replace=False))
    if "diachronic" in tasks:
        corpus(settings.old_corpus)
        corpus(settings.new_corpus)
    return runner.Prepared(data=data, files=sorted(set(files)), notes=notes)


def parallel_pairs(settings: Settings) -> dict[str, Any]:
    a, b = reps.load_corpus(settings.parallel_src), reps.load_corpus(settings.parallel_tgt)
    if a.sent_ids is None or b.sent_ids is None:
        raise ConfigError("parallel_src and parallel_tgt must be UD treebanks (pairs are matched by sent_id)")
    bi = {sid: i for i, sid in enumerate(b.sent_ids)}
    pairs = [(i, bi[sid]) for i, sid in enumerate(a.sent_ids) if sid in bi]
    if len(pairs) < 10:
        raise ConfigError(f"{settings.parallel_src} and {settings.parallel_tgt} share only {len(pairs)} sent_ids")
    cut = settings.max_words

    def pick(c, idx):
        return [c.sentences[i][:cut] for i in idx], [c.lemmas[i][:cut] for i in idx]

    src, src_lem = pick(a, [i for i, _ in pairs])
    tgt, tgt_lem = pick(b, [j for _, j in pairs])
    return {"src": src, "tgt": tgt, "src_lemmas": src_lem, "tgt_lemmas": tgt_lem, "files": a.files + b.files}
