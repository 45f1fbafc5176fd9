"""Cross-lingual and cross-model alignment, layer by layer: where do two spaces line up?

Mikolov et al. (2013) mapped one language's word vectors onto another's with a linear map; with an
orthogonality constraint the map is orthogonal Procrustes (Xing et al. 2015), and Artetxe et al.
(2017) bootstrapped it from shared numerals alone. This probe asks that of every layer of contextual
models, and reuses the machinery to compare any two models. The maths is `probes.core.geometry`;
where the vectors come from is `probes.align.reps`; corpora, dictionaries and seeds are data named
in the settings, so a new language pair is a config (`--src-corpus columns:nltk/conll2002/ned.train
--dictionary swadesh:en-nl` for English-Dutch).

Tasks (`bertology probe align --tasks ...`)
- `bli`: bilingual lexicon induction from type-level anchors (a word's contextual vectors averaged
  over its occurrences; Schuster et al. 2019) of `src_corpus` (through the checkpoint) and
  `tgt_corpus` (through `target_checkpoint`, or the same model when empty). Per layer: P@1/5/10 on
  the held-out part of `dictionary` after a Procrustes map fitted on the rest (CSLS retrieval,
  Conneau et al. 2018), P@1 by cosine, P@1 from the unsupervised seed (`seed_dictionary`, default the
  shared numerals) refined by self-learning, P@1 with no map (same model only) and after a random
  rotation (baseline). Layer 0 also gets the static input-embedding rows (`static_` metrics).
- `fake-language`: the same on a bilingual model trained on English plus Fake-English
  (`workbench.data.fake_language`, K et al. 2020): the target side is the source text shifted into
  the disjoint alphabet, so the dictionary is exact (word <-> shifted word). With
  `target_checkpoint` and `--no-shift-target` the target side is another model reading the same
  English: a separately trained model, the "two monolingual models" comparison.
- `parallel`: sentence retrieval between the `parallel_src`/`parallel_tgt` treebanks paired by
  `sent_id` (UD PUD English/Spanish), mean-pooled per layer, before a map (same model only), after a
  Procrustes map fitted on `parallel_train_fraction` of the pairs and after a random rotation, on
  the other pairs; plus word alignment inside test sentence pairs where the lemmas match a
  `dictionary` entry (a word map fitted on the train sentences' matches).
- `model-pair`: the same word tokens (`pair_corpus`) through every checkpoint (and twin); the `finish`
  hook writes, for every pair of models, the i x j matrices of linear CKA (Kornblith et al. 2019) and
  of retrieval accuracy after Procrustes (fitted on half of the tokens, tested on the other half) and
  after a random rotation. Each unit also writes CKA between each layer and its own layer 0.
- `diachronic`: type vectors from `old_corpus` (Brown, 1961) and `new_corpus` (WikiText-2 + EWT)
  through the same model, aligned on the `anchors` most frequent shared words (Hamilton et al. 2016
  align whole vocabularies; frequent words are the stable ones); displacement = 1 - cos. Controls:
  the split-half displacement of each word inside the old corpus (sampling noise of an average of
  few occurrences), rescaled to the old-vs-new occurrence counts (`noise_floor`), and a regression
  on log frequency (Hamilton et al.'s law of conformity); the most-moved words rank by displacement
  minus that noise floor.

Baselines: `random_init` (the runner's twin; for `bli`/`parallel` with a `target_checkpoint`, the
target model's twin too, seed + 1; the target model is the runner's `target` role, loaded once per run) and `random_rotation` (a Haar-random orthogonal map in place of the
learned one). Rows: probe="align", n = test words/sentences/tokens, CI = 95% percentile bootstrap
over test items for P@1 and retrieval accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from probes.core import geometry as ac
from probes.align import reps
from probes.core import baselines, runner
from workbench.errors import ConfigError
from workbench.results import decode_extra

NAME = "align"
TASKS = ("bli", "fake-language", "parallel", "model-pair", "diachronic")
KS = (1, 5, 10)


@dataclass
class Settings(runner.Settings):
    BASELINES = ("random_init", "random_rotation")

    baselines: tuple[str, ...] = field(default=("random_init", "random_rotation"), metadata={
        "help": "comma-separated baselines ('' for none): random_init (fresh weights), random_rotation"})
    src_corpus: str = field(default="raw:wikitext2", metadata={
        "help": "source-language corpus spec (raw:<name>, ud:<treebank>[:<split>], columns:<path>, a+b)"})
    tgt_corpus: str = field(default="raw:cess_esp+raw:conll2002_esp", metadata={"help": "target-language corpus spec"})
    dictionary: str = field(default="swadesh:en-es", metadata={"help": "swadesh:<src>-<tgt> or tsv:<path>"})
    seed_dictionary: str = field(default="numerals", metadata={
        "help": "unsupervised seed: numerals | identical | a dictionary spec"})
    target_checkpoint: str = field(default="", metadata={
        "help": "model for the target side of bli/parallel/fake-language ('' = the same model)"})
    shift_target: bool = field(default=True, metadata={
        "help": "fake-language: shift the target text into the fake alphabet (off: another model reads plain text)"})
    fake_corpus: str = field(default="raw:wikitext2", metadata={"help": "fake-language: English corpus spec"})
    vocab_size: int = field(default=2000, metadata={"help": "most frequent word types per side"})
    min_count: int = field(default=3, metadata={"help": "occurrences a word type needs"})
    max_sentences: int = field(default=3000, metadata={"help": "sentences sampled per corpus (0 = all)"})
    max_words: int = field(default=64, metadata={"help": "words kept per sentence"})
    lowercase: bool = field(default=True, metadata={"help": "word types are lowercased"})
    test_fraction: float = field(default=0.5, metadata={"help": "held-out part of the dictionary (bli)"})
    retrieval: str = field(default="csls", metadata={"help": "csls | cosine"})
    csls_k: int = field(default=10, metadata={"help": "CSLS neighbourhood"})
    refine_iters: int = field(default=5, metadata={"help": "self-learning iterations from the seed"})
    center: bool = field(default=True, metadata={"help": "unit length, mean centring, unit length before mapping"})
    parallel_src: str = field(default="ud:en_pud", metadata={"help": "parallel: source treebank spec"})
    parallel_tgt: str = field(default="ud:es_pud", metadata={"help": "parallel: target treebank spec (same sent_ids)"})
    parallel_train_fraction: float = field(default=0.5, metadata={"help": "parallel: pairs used to fit the map"})
    pair_corpus: str = field(default="ud:en_ewt:dev", metadata={"help": "model-pair: corpus spec"})
    pair_words: int = field(default=4000, metadata={"help": "model-pair: word tokens compared"})
    old_corpus: str = field(default="raw:brown", metadata={"help": "diachronic: older corpus spec"})
    new_corpus: str = field(default="raw:wikitext2+raw:ewt_raw", metadata={"help": "diachronic: newer corpus spec"})
    anchors: int = field(default=1000, metadata={"help": "diachronic: frequent shared words the map is fitted on"})
    top_moved: int = field(default=20, metadata={"help": "diachronic: most-moved words listed"})
    moved_layer: int = field(default=-1, metadata={"help": "diachronic: layer whose most-moved words are listed"})
    permutations: int = field(default=0, metadata={
        "help": "diachronic: random re-splits of the two corpora's pooled documents (by document, the independent "
                "unit) giving each word's displacement a null distribution (0 = none; needs raw:/split: corpora)"})

    def validate(self, spec) -> None:
        super().validate(spec)
        if self.retrieval not in ac.METHODS:
            raise ConfigError(f"retrieval must be one of {ac.METHODS}, got {self.retrieval!r}")
        for name in ("vocab_size", "min_count", "csls_k", "refine_iters", "max_words", "pair_words", "anchors",
                     "top_moved"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_sentences < 0:
            raise ConfigError(f"max_sentences must be >= 0 (0 = all), got {self.max_sentences}")
        if self.permutations < 0:
            raise ConfigError(f"permutations must be >= 0 (0 = none), got {self.permutations}")
        for name in ("test_fraction", "parallel_train_fraction"):
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in (0, 1), got {getattr(self, name)}")
        for name in ("src_corpus", "tgt_corpus", "fake_corpus", "parallel_src", "parallel_tgt", "pair_corpus",
                     "old_corpus", "new_corpus"):
            _check_spec(name, getattr(self, name))
        if self.permutations and "diachronic" in self.tasks:
            for name in ("old_corpus", "new_corpus"):
                for part in getattr(self, name).split("+"):
                    if part.strip().partition(":")[0] not in ("raw", "split"):
                        raise ConfigError(f"{name}: permutations re-split documents, so every part must be raw:<name> "
                                          f"or split:<corpus>:<rule>, got {part.strip()!r}")
        if self.seed_dictionary not in ("numerals", "identical") and ":" not in self.seed_dictionary:
            raise ConfigError(f"seed_dictionary must be numerals, identical or a dictionary spec, "
                              f"got {self.seed_dictionary!r}")


def _check_spec(name: str, spec: str) -> None:
    from probes.align import communities

    for part in spec.split("+"):
        kind, sep, arg = part.strip().partition(":")
        if kind not in ("raw", "ud", "columns", "split") or not sep or not arg:
            raise ConfigError(f"{name}: corpus spec {part!r} must be raw:<name>, ud:<treebank>[:<split>], "
                              f"columns:<path> or split:<corpus>:<rule>")
        if kind == "split":
            try:
                communities.parse(arg)
            except ConfigError as e:
                raise ConfigError(f"{name}: {e}") from None


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
        data["parallel"] = _parallel_pairs(settings)
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


def _parallel_pairs(settings: Settings) -> dict[str, Any]:
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


# --------------------------------------------------------------------------- helpers


def _prep(X: np.ndarray, center: bool) -> np.ndarray:
    """Artetxe et al. (2018)'s 'unit, center, unit' (or unit length only)."""
    X = ac.normalize(X)
    return ac.normalize(X, center=True) if center else X


def _target_handle(unit: runner.Unit, settings: Settings):
    """The handle reading the target side: the unit's own, or the `target` role (`target_checkpoint`,
    loaded once per run by the runner; its random-init twin for a twin unit)."""
    target = unit.roles.get("target")
    if target is None:
        return unit.handle, unit.model
    from workbench.checkpoints import checkpoint_name

    name = checkpoint_name(target.path)
    if not unit.is_twin:
        return target, name
    if "target_twin" not in unit.state:
        unit.state["target_twin"] = target.derive("random_init", {"seed": settings.seed + runner.TWIN_SEED_OFFSET + 1})
    return unit.state["target_twin"], name + runner.RANDOM_INIT_SUFFIX


def _activations(handle, unit: runner.Unit, sentences, key: str, settings: Settings):
    """Cached word activations from any handle (the unit's accessor when it is the unit's model)."""
    if handle is unit.handle:
        return unit.activations(sentences, key)
    from workbench.activations import extract

    stack = handle.stacks[0] if unit.stack not in handle.stacks else unit.stack
    return extract(handle, sentences, key, stack=stack, batch_size=settings.batch_size,
                   cache_dir=settings.cache_dir, progress=settings.progress)


def _layer_map(n_src: int, n_tgt: int) -> list[int]:
    """Target layer paired with each source layer: the same relative depth (identity for equal depths)."""
    if n_src == n_tgt:
        return list(range(n_src))
    return [int(round(l * (n_tgt - 1) / max(n_src - 1, 1))) for l in range(n_src)]


def _ci(correct: np.ndarray, settings: Settings, offset: int = 0):
    """95% bootstrap over test items (each its own unit) of per-layer accuracies; correct: [L, n] bool."""
    from probes.core import statistics  # imported here: this hunk stays apart from the module's imports

    _, low, high = statistics.ratio_bootstrap(correct.astype(np.float64), None, None, n_boot=settings.n_boot,
                                              seed=settings.seed + offset)
    return low, high


# --------------------------------------------------------------------------- bli and fake-language


def _bli_layers(X: np.ndarray, Y: np.ndarray, lex: ac.Lexicon, settings: Settings, seed_pairs, same_space: bool,
                twin_offset: int) -> tuple[dict[str, np.ndarray], dict[str, tuple], int, dict[str, Any]]:
    """BLI metrics for every layer. X: [L, Vs, H] source type vectors, Y: [L, Vt, H'] target ones."""
    train, gold = lex.split(settings.test_fraction, settings.seed)
    if not train:
        raise ConfigError("the dictionary split leaves no training pairs")
    ts, tt = (list(v) for v in zip(*train))
    method, k = settings.retrieval, settings.csls_k
    metrics: dict[str, list] = {}
    correct1, correct1_seed = [], []
    info: dict[str, Any] = {"train_pairs": len(train), "test_words": len(gold), "seed_pairs": len(seed_pairs)}
    for layer in range(len(X)):
        x, y = _prep(X[layer], settings.center), _prep(Y[layer], settings.center)
        R = ac.procrustes(x[ts], y[tt])
        res = ac.bli(x, y, gold, R, method, k, KS)
        for kk in KS:
            metrics.setdefault(f"p_at_{kk}", []).append(res.p_at(kk))
        correct1.append(res.correct[1])
        metrics.setdefault("p_at_1_cosine", []).append(ac.bli(x, y, gold, R, "cosine", k, (1,)).p_at(1))
        if "random_rotation" in settings.baselines:
            Rr = ac.random_rotation(R.shape[0], settings.seed + 1000 + layer)
            metrics.setdefault("p_at_1_rotation", []).append(ac.bli(x, y, gold, Rr, method, k, (1,)).p_at(1))
        if same_space:
            metrics.setdefault("p_at_1_unmapped", []).append(ac.bli(x, y, gold, None, method, k, (1,)).p_at(1))
        if seed_pairs:
            sl = ac.self_learning(x, y, seed_pairs, settings.refine_iters, k)
            r = ac.bli(x, y, gold, sl.R, method, k, (1,))
            metrics.setdefault("p_at_1_seeded", []).append(r.p_at(1))
            correct1_seed.append(r.correct[1])
            info.setdefault("induced_pairs", []).append(len(sl.pairs))
    ci = {"p_at_1": _ci(np.array(correct1), settings, twin_offset)}
    if correct1_seed:
        ci["p_at_1_seeded"] = _ci(np.array(correct1_seed), settings, twin_offset + 1)
    return {m: np.array(v) for m, v in metrics.items()}, ci, len(gold), info


def _seed_pairs(settings: Settings, prepared: runner.Prepared, src_vocab, tgt_vocab, test_sources: set[int]):
    if settings.seed_dictionary == "numerals":
        pairs = ac.identical_seed(src_vocab, tgt_vocab, numerals_only=True)
    elif settings.seed_dictionary == "identical":
        pairs = ac.identical_seed(src_vocab, tgt_vocab, numerals_only=False)
    else:
        pairs = ac.Lexicon.from_word_pairs(src_vocab, tgt_vocab, prepared.data["seed_pairs"]).pairs
    return [(s, t) for s, t in pairs if s not in test_sources]  # never seed with a test word


def _type_space(handle, unit, settings, corpus: reps.Corpus, keep: Sequence[str], key: str,
                vocab: list[str] | None = None):
    """(vocabulary, counts, [L+1, V, H] type vectors, static [V, E]) of a corpus through a handle."""
    if vocab is None:
        vocab, counts = reps.build_vocabulary(corpus.sentences, settings.vocab_size, settings.min_count,
                                              settings.lowercase, keep)
    else:
        counts = None
    acts = _activations(handle, unit, corpus.sentences, key, settings)
    T = reps.type_vectors(acts.layers, corpus.sentences, vocab, settings.lowercase)
    return vocab, counts, T, reps.static_vectors(handle, vocab)


def _bli_rows(unit, task, settings, prepared, src_corpus, tgt_corpus, lexicon_pairs, tgt_handle, tgt_name,
              same_space, seeds_allowed=True, tgt_vocab_fn=None) -> list[pd.DataFrame]:
    src_keep = [a for a, _ in lexicon_pairs]
    vs, cs, X, Xs = _type_space(unit.handle, unit, settings, src_corpus, src_keep, f"align:{task}:src")
    if tgt_vocab_fn is not None:
        vt = tgt_vocab_fn(vs)
        _, _, Y, Ys = _type_space(tgt_handle, unit, settings, tgt_corpus, (), f"align:{task}:tgt", vocab=vt)
    else:
        vt, _, Y, Ys = _type_space(tgt_handle, unit, settings, tgt_corpus, [b for _, b in lexicon_pairs],
                                   f"align:{task}:tgt")
    lex = ac.Lexicon.from_word_pairs(vs, vt, lexicon_pairs)
    if len(lex.sources()) < 4:
        raise ConfigError(f"{task}: only {len(lex.sources())} dictionary words occur in both corpora "
                          f"(>= {settings.min_count} times); use larger corpora or a lower min_count")
    _, gold = lex.split(settings.test_fraction, settings.seed)
    seeds = _seed_pairs(settings, prepared, vs, vt, set(gold)) if seeds_allowed else []
    lmap = _layer_map(len(X), len(Y))
    Y = Y[lmap]
    off = 17 if unit.is_twin else 0
    metrics, ci, n, info = _bli_layers(X, Y, lex, settings, seeds, same_space, off)
    extra = {"target_model": tgt_name, "target_layers": lmap, "dictionary_pairs": len(lex.pairs),
             "src_vocab": len(vs), "tgt_vocab": len(vt), "retrieval": settings.retrieval, **info}
    rows = [unit.rows(task, metrics, split="test", n=n, ci=ci, extra=extra)]
    rows[0] = baselines.mark_baselines(rows[0], {"p_at_1_rotation": ("random_rotation", "p_at_1"), "p_at_1_unmapped": ("unmapped", "p_at_1")})
    # static case: input-embedding rows (Mikolov et al. 2013 / Conneau et al. 2018 on word embeddings)
    smetrics, sci, _, _ = _bli_layers(Xs[None], Ys[None], lex, settings, seeds, same_space, off + 2)
    rows.append(unit.rows(task, {f"static_{m}": v for m, v in smetrics.items()}, split="test", layers=[0], n=n,
                          ci={f"static_{m}": c for m, c in sci.items()}, extra={**extra, "representation": "static"}))
    unit.log(f"{task}: P@1 by layer " + " ".join(f"{v:.2f}" for v in metrics["p_at_1"]))
    return rows


def _bli(unit, prepared, settings) -> list[pd.DataFrame]:
    d = prepared.data
    tgt_handle, tgt_name = _target_handle(unit, settings)
    return _bli_rows(unit, "bli", settings, prepared, d["corpora"][settings.src_corpus],
                     d["corpora"][settings.tgt_corpus], d["dictionary"], tgt_handle, tgt_name,
                     same_space=tgt_handle is unit.handle)


def _fake_language(unit, prepared, settings) -> list[pd.DataFrame]:
    from workbench.data.fake_language import shift_text

    src = prepared.data["corpora"][settings.fake_corpus]
    shift = shift_text if settings.shift_target else (lambda w: w)
    tgt = reps.Corpus(src.spec + ("@shifted" if settings.shift_target else ""),
                      [[shift(w) for w in s] for s in src.sentences], src.files)
    vocab, _ = reps.build_vocabulary(src.sentences, settings.vocab_size, settings.min_count, settings.lowercase)
    pairs = [(w, shift(w)) for w in vocab]  # the exact dictionary
    tgt_handle, tgt_name = _target_handle(unit, settings)
    return _bli_rows(unit, "fake-language", settings, prepared, src, tgt, pairs, tgt_handle, tgt_name,
                     same_space=tgt_handle is unit.handle, seeds_allowed=False,
                     tgt_vocab_fn=lambda vs: [shift(w) for w in vs])


# --------------------------------------------------------------------------- parallel sentences


def _parallel(unit, prepared, settings) -> list[pd.DataFrame]:
    p = prepared.data["parallel"]
    tgt_handle, tgt_name = _target_handle(unit, settings)
    same = tgt_handle is unit.handle
    a = _activations(unit.handle, unit, p["src"], "align:parallel:src", settings)
    b = _activations(tgt_handle, unit, p["tgt"], "align:parallel:tgt", settings)
    S = reps.sentence_vectors(a.layers, a.sentence_offsets)
    T = reps.sentence_vectors(b.layers, b.sentence_offsets)
    lmap = _layer_map(len(S), len(T))
    T = T[lmap]
    n = S.shape[1]
    perm = np.random.default_rng(settings.seed).permutation(n)
    n_train = int(round(settings.parallel_train_fraction * n))
    train, test = np.sort(perm[:n_train]), np.sort(perm[n_train:])
    method, k = settings.retrieval, settings.csls_k
    metrics: dict[str, list] = {}
    correct = []
    for layer in range(len(S)):
        x, y = _prep(S[layer], settings.center), _prep(T[layer], settings.center)
        R = ac.procrustes(x[train], y[train])
        c = ac.retrieval_accuracy(ac.apply_map(x[test], R), y[test], method, k)
        correct.append(c)
        metrics.setdefault("accuracy", []).append(c.mean())
        if same:
            metrics.setdefault("accuracy_unmapped", []).append(ac.retrieval_accuracy(x[test], y[test], method, k).mean())
        if "random_rotation" in settings.baselines:
            Rr = ac.random_rotation(R.shape[0], settings.seed + 1000 + layer)
            metrics.setdefault("accuracy_rotation", []).append(
                ac.retrieval_accuracy(ac.apply_map(x[test], Rr), y[test], method, k).mean())
    off = 17 if unit.is_twin else 0
    ci = {"accuracy": _ci(np.array(correct), settings, off)}
    extra = {"target_model": tgt_name, "target_layers": lmap, "train_pairs": len(train), "chance": 1 / len(test),
             "retrieval": method}
    rows = [unit.rows("parallel", {m: np.array(v) for m, v in metrics.items()}, split="test", n=len(test), ci=ci,
                      extra=extra)]
    rows[0] = baselines.mark_baselines(rows[0], {"accuracy_unmapped": ("unmapped", "accuracy"), "accuracy_rotation": ("random_rotation", "accuracy")})
    word = _word_alignment(a, b, lmap, p, train, test, prepared.data.get("dictionary", []), settings)
    if word is not None:
        wm, wci, wn, winfo = word
        rows.append(baselines.mark_baselines(unit.rows("parallel", wm, split="test", n=wn, ci=wci, extra={**extra, **winfo}), {"word_alignment_unmapped": ("unmapped", "word_alignment"), "word_alignment_chance": ("chance", "word_alignment")}))
    unit.log("parallel: accuracy by layer " + " ".join(f"{v:.2f}" for v in metrics["accuracy"]))
    return rows


def _word_alignment(a, b, lmap, p, train, test, dictionary, settings):
    """Within each sentence pair, an English word whose lemma has a dictionary translation among the
    Spanish lemmas is aligned to its nearest Spanish word (cosine after a word-level Procrustes map
    fitted on the train sentences' matches); correct when that word's lemma is a gold translation."""
    trans: dict[str, set[str]] = {}
    for s, t in dictionary:
        trans.setdefault(s, set()).add(t)

    def matches(idx):
        out = []  # (src word row, tgt word row, sentence, gold tgt rows, candidate tgt rows)
        for si in idx:
            sl = [w.lower() for w in p["src_lemmas"][si]]
            tl = [w.lower() for w in p["tgt_lemmas"][si]]
            a0, b0 = a.sentence_offsets[si], b.sentence_offsets[si]
            for i, lem in enumerate(sl):
                gold = [j for j, t in enumerate(tl) if t in trans.get(lem, ())]
                if gold:
                    out.append((a0 + i, b0 + gold[0], [b0 + j for j in gold], np.arange(b0, b0 + len(tl))))
        return out

    tr, te = matches(train), matches(test)
    if len(tr) < 20 or len(te) < 20:
        return None
    src_rows = np.array([m[0] for m in tr])
    tgt_rows = np.array([m[1] for m in tr])
    metrics: dict[str, list] = {"word_alignment": [], "word_alignment_unmapped": [], "word_alignment_chance": []}
    correct = []
    for layer, tl in enumerate(lmap):
        A = np.asarray(a.layers[layer], dtype=np.float64)
        B = np.asarray(b.layers[tl], dtype=np.float64)
        R = ac.procrustes(ac.normalize(A[src_rows]), ac.normalize(B[tgt_rows]))
        c, cu = [], []
        for srow, _, gold, cands in te:
            sims = ac.cosine_matrix(ac.apply_map(A[srow][None], R), B[cands])[0]
            c.append(cands[int(np.argmax(sims))] in gold)
            if A.shape[1] == B.shape[1]:
                cu.append(cands[int(np.argmax(ac.cosine_matrix(A[srow][None], B[cands])[0]))] in gold)
        correct.append(np.array(c))
        metrics["word_alignment"].append(np.mean(c))
        metrics["word_alignment_unmapped"].append(np.mean(cu) if cu else float("nan"))
        metrics["word_alignment_chance"].append(np.mean([len(g) / len(cands) for _, _, g, cands in te]))
    ci = {"word_alignment": _ci(np.array(correct), settings, 5)}
    return ({m: np.array(v) for m, v in metrics.items()}, ci, len(te), {"word_train_pairs": len(tr)})


# --------------------------------------------------------------------------- model pairs


def _pair_vectors(handle, unit_or_none, prepared, settings, stack=None) -> np.ndarray:
    c = prepared.data["corpora"][settings.pair_corpus]
    key = "align:model-pair"
    if unit_or_none is not None:
        acts = unit_or_none.activations(c.sentences, key)
    else:
        from workbench.activations import extract

        acts = extract(handle, c.sentences, key, stack=stack, batch_size=settings.batch_size,
                       cache_dir=settings.cache_dir, progress=settings.progress)
    idx = prepared.data["pair_index"]
    return np.stack([np.asarray(acts.layers[l][idx], dtype=np.float32) for l in range(acts.num_layers)])


def _model_pair(unit, prepared, settings) -> list[pd.DataFrame]:
    V = _pair_vectors(unit.handle, unit, prepared, settings)
    prepared.data["pair_vectors"][(unit.model, unit.stack)] = V
    cka0 = [ac.linear_cka(V[0], V[l]) for l in range(len(V))]
    return [unit.rows("model-pair", {"cka_to_layer0": cka0}, split="all", n=V.shape[1],
                      extra={"corpus": settings.pair_corpus})]


def _finish(results: list[runner.UnitResult], prepared, settings) -> list[pd.DataFrame]:
    """i x j CKA and Procrustes-retrieval matrices for every pair of models of the run."""
    from workbench.results import validate_rows

    if "model-pair" not in settings.tasks:
        return []
    units = [(r.model, r.stack, r.checkpoint, r.is_twin) for r in results if r.task == "model-pair"]
    vecs = prepared.data["pair_vectors"]
    for model, stack, ck, is_twin in units:
        if (model, stack) not in vecs:  # a unit reused from an interrupted attempt: re-read its cached vectors
            from workbench.models import ModelHandle

            h = ck.handle if ck.handle is not None else ModelHandle.load(ck.path)
            if is_twin:
                h = h.derive("random_init", {"seed": settings.seed + runner.TWIN_SEED_OFFSET})
            vecs[(model, stack)] = _pair_vectors(h, None, prepared, settings, stack)
    n = len(prepared.data["pair_index"])
    perm = np.random.default_rng(settings.seed + 1).permutation(n)
    train, test = np.sort(perm[: n // 2]), np.sort(perm[n // 2:])
    rows = []
    for ia in range(len(units)):
        for ib in range(ia + 1, len(units)):
            (ma, sa, cka_a, _), (mb, sb, _, _) = units[ia], units[ib]
            A, B = vecs[(ma, sa)], vecs[(mb, sb)]
            cka = ac.cka_matrix(list(A), list(B))
            ret = ac.procrustes_retrieval_matrix(list(A), list(B), train, test, settings.retrieval, settings.csls_k,
                                                 settings.center)
            mats = {"cka": cka, "retrieval": ret}
            if "random_rotation" in settings.baselines:
                mats["retrieval_rotation"] = _rotation_matrix(A, B, test, settings)
            for metric, M in mats.items():
                for i in range(M.shape[0]):
                    for j in range(M.shape[1]):
                        rows.append({"model": ma, "family": cka_a.family, "seed": cka_a.seed, "step": cka_a.step,
                                     "probe": NAME, "task": "model-pair", "split": "test" if metric != "cka" else "all",
                                     "stack": sa, "layer": i, "metric": metric, "value": float(M[i, j]),
                                     "n": len(test) if metric != "cka" else n,
                                     "extra": {"other_model": mb, "other_stack": sb, "other_layer": j,
                                               "corpus": settings.pair_corpus}})
    return [validate_rows(rows)] if rows else []


def _rotation_matrix(A, B, test, settings) -> np.ndarray:
    out = np.zeros((len(A), len(B)))
    for i in range(len(A)):
        x = _prep(A[i], settings.center)
        for j in range(len(B)):
            y = _prep(B[j], settings.center)
            Rr = ac.random_rotation(max(x.shape[1], y.shape[1]), settings.seed + 1000 + 31 * i + j)
            out[i, j] = ac.retrieval_accuracy(ac.apply_map(x[test], Rr), y[test], settings.retrieval,
                                              settings.csls_k).mean()
    return out


# --------------------------------------------------------------------------- diachronic


def _displacement(x: np.ndarray, y: np.ndarray, anchor: np.ndarray, center: bool) -> np.ndarray:
    """1 - cos between each word's two vectors after a Procrustes map fitted on the anchor words
    (Hamilton et al. 2016; a word absent on one side has a zero row and gets displacement 1)."""
    x, y = _prep(x, center), _prep(y, center)
    R = ac.procrustes(x[anchor], y[anchor])
    return 1 - np.sum(ac.normalize(ac.apply_map(x, R)) * ac.normalize(y), axis=1)


def _permutation_displacements(ao, an, old, new, vocab, anchor, settings) -> np.ndarray:
    """[L, P, V] displacements of the same procedure on random splits of the pooled documents of both
    corpora (each split gives side A as many documents as the old corpus has; whole documents move,
    the independent unit, so a speech's repeated phrasing cannot pass for a community's). A word
    missing from one side of a split gets NaN there."""
    from scipy import sparse

    lc = settings.lowercase
    ids = [reps.word_index(c.sentences, vocab, lc) for c in (old, new)]
    doc_names = list(dict.fromkeys([("old", d) for d in old.docs] + [("new", d) for d in new.docs]))
    doc_of = {d: i for i, d in enumerate(doc_names)}
    n_old_docs = len({d for d in old.docs})
    word_doc = [np.repeat(np.array([doc_of[(side, d)] for d in c.docs], dtype=np.int64),
                          [len(x) for x in c.sentences]) for side, c in (("old", old), ("new", new))]
    V, L = len(vocab), ao.layers.shape[0]

    def member(idx, keep):  # sparse [V, N] summing the kept positions of each vocabulary word
        pos = np.flatnonzero((idx >= 0) & keep)
        return sparse.csr_matrix((np.ones(len(pos), dtype=np.float32), (idx[pos], pos)), shape=(V, len(idx)))

    totals = [member(i, np.ones(len(i), bool)) for i in ids]
    total_counts = sum(np.asarray(t.sum(axis=1)).ravel() for t in totals)
    layers = (ao.layers, an.layers)
    total_sums = [sum(totals[k] @ np.asarray(layers[k][l], dtype=np.float32) for k in (0, 1)) for l in range(L)]
    rng = np.random.default_rng(settings.seed + 1)
    out = np.full((L, settings.permutations, V), np.nan)
    for p in range(settings.permutations):
        in_a = np.zeros(len(doc_names), dtype=bool)
        in_a[rng.permutation(len(doc_names))[:n_old_docs]] = True
        mats = [member(ids[k], in_a[word_doc[k]]) for k in (0, 1)]
        counts_a = sum(np.asarray(m.sum(axis=1)).ravel() for m in mats)
        counts_b = total_counts - counts_a
        ok = (counts_a > 0) & (counts_b > 0)
        for l in range(L):
            sums_a = sum(mats[k] @ np.asarray(layers[k][l], dtype=np.float32) for k in (0, 1))
            mean_a = sums_a / np.maximum(counts_a, 1)[:, None]
            mean_b = (total_sums[l] - sums_a) / np.maximum(counts_b, 1)[:, None]
            d = _displacement(mean_a.astype(np.float64), mean_b.astype(np.float64), anchor, settings.center)
            out[l, p] = np.where(ok, d, np.nan)
    return out


def _diachronic(unit, prepared, settings) -> list[pd.DataFrame]:
    """Two corpora (two periods, or two communities: `split:` specs) through the same model; see the
    module docstring. With `permutations`, each word's displacement also gets a z-score and a
    permutation p-value against the same procedure on random document splits, and the most-moved
    words rank by that z."""
    old = prepared.data["corpora"][settings.old_corpus]
    new = prepared.data["corpora"][settings.new_corpus]
    lc = settings.lowercase
    vo, co = reps.build_vocabulary(old.sentences, 10**9, settings.min_count, lc)
    vn, cn = reps.build_vocabulary(new.sentences, 10**9, settings.min_count, lc)
    fo, fn = dict(zip(vo, co)), dict(zip(vn, cn))
    # shared words (min_count on each side: the both-side frequency control), most frequent first by
    # the smaller of the two counts
    shared = sorted(set(fo) & set(fn), key=lambda w: (-min(fo[w], fn[w]), w))
    vocab = [w for w in shared if w.isalpha()][: settings.vocab_size]
    if len(vocab) < settings.anchors // 2 + 10:
        raise ConfigError(f"diachronic: only {len(vocab)} shared words; lower min_count or use larger corpora")
    ao = unit.activations(old.sentences, "align:diachronic:old")
    an = unit.activations(new.sentences, "align:diachronic:new")
    Told = reps.type_vectors(ao.layers, old.sentences, vocab, lc)
    Tnew = reps.type_vectors(an.layers, new.sentences, vocab, lc)
    # split-half control: the old corpus's sentences in two seeded halves
    half = np.random.default_rng(settings.seed).random(len(old.sentences)) < 0.5
    ids = np.repeat(half, [len(s) for s in old.sentences])
    T1 = reps.type_vectors(ao.layers, old.sentences, vocab, lc, mask=ids)
    T2 = reps.type_vectors(ao.layers, old.sentences, vocab, lc, mask=~ids)
    both = (np.abs(T1).sum(axis=(0, 2)) > 0) & (np.abs(T2).sum(axis=(0, 2)) > 0)
    n_anchor = min(settings.anchors, len(vocab))
    anchor = np.arange(n_anchor)
    perm = (_permutation_displacements(ao, an, old, new, vocab, anchor, settings)
            if settings.permutations else None)
    freq = np.log(np.array([min(fo[w], fn[w]) for w in vocab], dtype=np.float64))
    n_old = np.array([fo[w] for w in vocab], dtype=np.float64)
    n_new = np.array([fn[w] for w in vocab], dtype=np.float64)
    metrics: dict[str, list] = {}
    layer_words: list[Any] = []
    from scipy.stats import spearmanr

    for layer in range(len(Told)):
        disp = _displacement(Told[layer], Tnew[layer], anchor, settings.center)
        split = _displacement(T1[layer], T2[layer], anchor, settings.center)
        # the halves average half the occurrences each; for averages of n iid draws the expected
        # 1 - cos grows like 1/n1 + 1/n2, so the noise floor of the old-vs-new comparison is
        # split * (1/n_old + 1/n_new) / (4/n_old) (a first-order correction)
        floor = split * (1 + n_old / n_new) / 4
        excess = disp - floor
        # frequency control: residual of displacement after a least-squares line on log frequency
        coef = np.polyfit(freq, disp, 1)
        resid = disp - np.polyval(coef, freq)
        metrics.setdefault("displacement", []).append(float(disp.mean()))
        metrics.setdefault("split_half_displacement", []).append(float(split[both].mean()))
        metrics.setdefault("noise_floor", []).append(float(floor[both].mean()))
        metrics.setdefault("moved_fraction", []).append(float((excess[both] > 0).mean()))
        metrics.setdefault("freq_spearman", []).append(float(spearmanr(disp, freq).statistic))
        metrics.setdefault("freq_slope", []).append(float(coef[0]))
        word_stats: dict[str, np.ndarray] = {}
        if perm is not None:
            P = perm[layer]
            valid = np.sum(~np.isnan(P), axis=0)
            mu, sd = np.nanmean(P, axis=0), np.nanstd(P, axis=0, ddof=1)
            z = (disp - mu) / np.where(sd > 0, sd, np.nan)
            # permutation p-value with the +1 correction (Phipson & Smyth 2010): never 0
            pval = (1 + np.sum(np.nan_to_num(P, nan=-np.inf) >= disp, axis=0)) / (1 + valid)
            ranked = valid >= max(2, settings.permutations // 2)
            word_stats = {"permutation_mean": mu, "z": z, "p_perm": pval}
            metrics.setdefault("permutation_displacement", []).append(float(np.mean(mu[ranked])))
            metrics.setdefault("moved_fraction_permutation", []).append(float((pval[ranked] < 0.05).mean()))
            order = [i for i in np.argsort(-np.nan_to_num(z, nan=-np.inf), kind="stable") if ranked[i]]
        else:
            order = [i for i in np.argsort(-excess, kind="stable") if both[i]]
        layer_words.append([{"word": vocab[i], "displacement": round(float(disp[i]), 4),
                             "split_half": round(float(split[i]), 4), "noise_floor": round(float(floor[i]), 4),
                             "freq_residual": round(float(resid[i]), 4),
                             **{k: round(float(v[i]), 4) for k, v in word_stats.items()},
                             "count_old": int(fo[vocab[i]]), "count_new": int(fn[vocab[i]])}
                            for i in order[: settings.top_moved]])
    shown = settings.moved_layer if settings.moved_layer >= 0 else len(Told) + settings.moved_layer
    if not 0 <= shown < len(Told):
        raise ConfigError(f"moved_layer {settings.moved_layer} outside 0..{len(Told) - 1}")
    base = {"old_corpus": settings.old_corpus, "new_corpus": settings.new_corpus, "words": len(vocab),
            "anchors": n_anchor, "split_half_words": int(both.sum())}
    if perm is not None:
        base |= {"permutations": settings.permutations,
                 "documents": [len(set(old.docs)), len(set(new.docs))]}
    top = layer_words[shown]
    unit.log("diachronic: most moved at layer %d: %s" % (shown, ", ".join(w["word"] for w in top[:10])))
    baseline_of = {"noise_floor": ("noise_floor", "displacement")}
    if perm is not None:
        baseline_of["permutation_displacement"] = ("permutation", "displacement")
    listed = ({"top_moved_z": [np.mean([w["z"] for w in top])]} if perm is not None else
              {"top_moved_excess": [np.mean([w["displacement"] - w["noise_floor"] for w in top])]})
    return [baselines.mark_baselines(unit.rows("diachronic", {m: np.array(v) for m, v in metrics.items()}, split="all",
                                            n=len(vocab), extra=base), baseline_of),
            # one row carries the list: value = the mean excess displacement (or mean z) of the listed words
            unit.rows("diachronic", listed, split="all", layers=[shown], n=len(top), extra={**base, "top_moved": top})]


# --------------------------------------------------------------------------- entry points


_TASK_FUNCS = {"bli": _bli, "fake-language": _fake_language, "parallel": _parallel, "model-pair": _model_pair,
               "diachronic": _diachronic}


def run_task(unit: runner.Unit, prepared: runner.Prepared, task: str, settings: Settings) -> list[pd.DataFrame]:
    return _TASK_FUNCS[task](unit, prepared, settings)


def summary(rows: pd.DataFrame) -> str:
    """Per-layer tables for bli/fake-language/parallel/diachronic, i x j matrices for model pairs,
    and the most-moved words."""
    if rows is None or len(rows) == 0:
        return "(no rows)"
    extra = [decode_extra(e) for e in rows["extra"]]
    is_matrix = np.array(["other_model" in e for e in extra], dtype=bool)
    out = [runner.format_layer_table(rows[~is_matrix], max_metrics=10)] if (~is_matrix).any() else []
    mat = pd.DataFrame([(str(m), str(e["other_model"]), str(met), int(l), int(e["other_layer"]), float(v))
                        for m, e, met, l, v in zip(rows["model"], extra, rows["metric"], rows["layer"], rows["value"])
                        if "other_model" in e], columns=["model", "other", "metric", "i", "j", "value"])
    for (a, b, metric), sub in mat.groupby(["model", "other", "metric"], sort=False):
        M = sub.pivot_table(index="i", columns="j", values="value")
        table = [[f"{metric}: {a} (rows) x {b}"] + [str(j) for j in M.columns]]
        table += [[str(int(i))] + [f"{v:.2f}" for v in M.loc[i]] for i in M.index]
        out.append(runner.aligned(table))
    for e, (_, r) in zip(extra, rows.iterrows()):
        if "top_moved" in e:
            if "permutations" in e:  # ranked by z against random document splits
                words = ", ".join(f"{w['word']} (z {w['z']:.1f}, p {w['p_perm']:.3f}, n {w['count_old']}/{w['count_new']})"
                                  for w in e["top_moved"])
                out.append(f"most moved, {r['model']} layer {int(r['layer'])} (z against {e['permutations']} document "
                           f"permutations, counts old/new): {words}")
                continue
            words = ", ".join(f"{w['word']} ({w['displacement']:.2f}/{w['noise_floor']:.2f})" for w in e["top_moved"])
            out.append(f"most moved, {r['model']} layer {int(r['layer'])} (displacement/noise floor): {words}")
    return "\n\n".join(out)


PROBE = runner.ProbeSpec(
    name=NAME, tasks=TASKS, settings=Settings, prepare=prepare, run_task=run_task, finish=_finish, summary=summary,
    default_tasks=("bli",), roles={"target": runner.Role("target_checkpoint")},
    description="Cross-lingual and cross-model alignment per layer: Procrustes, CSLS, BLI, CKA (Conneau et al. 2018; "
                "Kornblith et al. 2019).",
)
