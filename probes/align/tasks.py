"""The alignment tasks, one function each, and `model_pair_matrices` (see the package docstring)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pandas as pd

from probes.align import reps
from probes.align.settings import (KS, NAME, Settings, layer_accuracy_ci, paired_layers, target_side, unit_center_unit,
                                   word_activations)
from probes.core import baselines, runner
from workbench import geometry as ac
from workbench.errors import ConfigError


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
        x, y = unit_center_unit(X[layer], settings.center), unit_center_unit(Y[layer], settings.center)
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
    ci = {"p_at_1": layer_accuracy_ci(np.array(correct1), settings, twin_offset)}
    if correct1_seed:
        ci["p_at_1_seeded"] = layer_accuracy_ci(np.array(correct1_seed), settings, twin_offset + 1)
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
    acts = word_activations(handle, unit, corpus.sentences, key, settings)
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
    lmap = paired_layers(len(X), len(Y))
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


def bli_task(unit, prepared, settings) -> list[pd.DataFrame]:
    """Task `bli`: bilingual lexicon induction between the two corpora's word vectors with the
    dictionary (Procrustes, CSLS; Conneau et al. 2018), per layer."""
    d = prepared.data
    tgt_handle, tgt_name = target_side(unit, settings)
    return _bli_rows(unit, "bli", settings, prepared, d["corpora"][settings.src_corpus],
                     d["corpora"][settings.tgt_corpus], d["dictionary"], tgt_handle, tgt_name,
                     same_space=tgt_handle is unit.handle)


def fake_language_task(unit, prepared, settings) -> list[pd.DataFrame]:
    """Task `fake-language`: BLI between a corpus and its shifted copy (the exact dictionary), per layer."""
    from workbench.data.fake_language import shift_text

    src = prepared.data["corpora"][settings.fake_corpus]
    shift = shift_text if settings.shift_target else (lambda w: w)
    tgt = reps.Corpus(src.spec + ("@shifted" if settings.shift_target else ""),
                      [[shift(w) for w in s] for s in src.sentences], src.files)
    vocab, _ = reps.build_vocabulary(src.sentences, settings.vocab_size, settings.min_count, settings.lowercase)
    pairs = [(w, shift(w)) for w in vocab]  # the exact dictionary
    tgt_handle, tgt_name = target_side(unit, settings)
    return _bli_rows(unit, "fake-language", settings, prepared, src, tgt, pairs, tgt_handle, tgt_name,
                     same_space=tgt_handle is unit.handle, seeds_allowed=False,
                     tgt_vocab_fn=lambda vs: [shift(w) for w in vs])


# --------------------------------------------------------------------------- parallel sentences


def parallel_task(unit, prepared, settings) -> list[pd.DataFrame]:
    """Task `parallel`: sentence retrieval between parallel treebanks after a map fitted on a train
    share of the pairs, per layer."""
    p = prepared.data["parallel"]
    tgt_handle, tgt_name = target_side(unit, settings)
    same = tgt_handle is unit.handle
    a = word_activations(unit.handle, unit, p["src"], "align:parallel:src", settings)
    b = word_activations(tgt_handle, unit, p["tgt"], "align:parallel:tgt", settings)
    S = reps.sentence_vectors(a.layers, a.sentence_offsets)
    T = reps.sentence_vectors(b.layers, b.sentence_offsets)
    lmap = paired_layers(len(S), len(T))
    T = T[lmap]
    n = S.shape[1]
    perm = np.random.default_rng(settings.seed).permutation(n)
    n_train = int(round(settings.parallel_train_fraction * n))
    train, test = np.sort(perm[:n_train]), np.sort(perm[n_train:])
    method, k = settings.retrieval, settings.csls_k
    metrics: dict[str, list] = {}
    correct = []
    for layer in range(len(S)):
        x, y = unit_center_unit(S[layer], settings.center), unit_center_unit(T[layer], settings.center)
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
    ci = {"accuracy": layer_accuracy_ci(np.array(correct), settings, off)}
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
    ci = {"word_alignment": layer_accuracy_ci(np.array(correct), settings, 5)}
    return ({m: np.array(v) for m, v in metrics.items()}, ci, len(te), {"word_train_pairs": len(tr)})


# --------------------------------------------------------------------------- model pairs


def _pair_vectors(handle, unit_or_none, prepared, settings, stack=None) -> np.ndarray:
    c = prepared.data["corpora"][settings.pair_corpus]
    key = "align:model-pair"
    if unit_or_none is not None:
        acts = unit_or_none.activations(c.sentences, key)
    else:
        from workbench.activations import CACHE_DTYPES, extract

        acts = extract(handle, c.sentences, key, stack=stack, batch_size=settings.batch_size,
                       cache_dir=settings.cache_dir, dtype=CACHE_DTYPES[settings.cache_dtype], progress=settings.progress)
    idx = prepared.data["pair_index"]
    return np.stack([np.asarray(acts.layers[l][idx], dtype=np.float32) for l in range(acts.num_layers)])


def model_pair_task(unit, prepared, settings) -> list[pd.DataFrame]:
    """Task `model-pair`: one model's per-layer vectors of the pair corpus (kept for
    `model_pair_matrices`) and their CKA to layer 0 (Kornblith et al. 2019)."""
    V = _pair_vectors(unit.handle, unit, prepared, settings)
    prepared.data["pair_vectors"][(unit.model, unit.stack)] = V
    metrics = {"cka_to_layer0": [ac.linear_cka(V[0], V[l]) for l in range(len(V))]}
    if "standardized" in settings.pair_cka:
        metrics["top_dim_variance_share"] = [ac.top_dimension_variance_share(V[l]) for l in range(len(V))]
    return [unit.rows("model-pair", metrics, split="all", n=V.shape[1], extra={"corpus": settings.pair_corpus})]


def model_pair_matrices(results: list[runner.UnitResult], prepared, settings) -> list[pd.DataFrame]:
    """i x j CKA and Procrustes-retrieval matrices for every pair of models of the run."""
    from workbench.store.results import validate_rows

    if "model-pair" not in settings.tasks:
        return []
    units = [(r.model, r.stack, r.checkpoint, r.is_twin) for r in results if r.task == "model-pair"]
    vecs = prepared.data["pair_vectors"]
    for model, stack, ck, is_twin in units:
        if (model, stack) not in vecs:  # a unit reused from an interrupted attempt: re-read its cached vectors
            from workbench.running.models import ModelHandle

            h = ck.handle.with_dtype(settings.dtype) if ck.handle is not None else ModelHandle.load(ck.path, dtype=settings.dtype)
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
            mats = {}
            if "linear" in settings.pair_cka:
                mats["cka"] = ac.cka_matrix(list(A), list(B))
            if "standardized" in settings.pair_cka:
                mats["cka_standardized"] = ac.cka_matrix(list(A), list(B), standardize=True)
            mats["retrieval"] = ac.procrustes_retrieval_matrix(list(A), list(B), train, test, settings.retrieval,
                                                               settings.csls_k, settings.center)
            if "random_rotation" in settings.baselines:
                mats["retrieval_rotation"] = _rotation_matrix(A, B, test, settings)
            for metric, M in mats.items():
                is_cka = metric.startswith("cka")  # over all compared words; retrieval over the test half
                for i in range(M.shape[0]):
                    for j in range(M.shape[1]):
                        rows.append({"model": ma, "family": cka_a.family, "seed": cka_a.seed, "step": cka_a.step,
                                     "probe": NAME, "task": "model-pair", "split": "all" if is_cka else "test",
                                     "stack": sa, "layer": i, "metric": metric, "value": float(M[i, j]),
                                     "n": n if is_cka else len(test),
                                     "extra": {"other_model": mb, "other_stack": sb, "other_layer": j,
                                               "corpus": settings.pair_corpus}})
    return [validate_rows(rows)] if rows else []


def _rotation_matrix(A, B, test, settings) -> np.ndarray:
    out = np.zeros((len(A), len(B)))
    for i in range(len(A)):
        x = unit_center_unit(A[i], settings.center)
        for j in range(len(B)):
            y = unit_center_unit(B[j], settings.center)
            Rr = ac.random_rotation(max(x.shape[1], y.shape[1]), settings.seed + 1000 + 31 * i + j)
            out[i, j] = ac.retrieval_accuracy(ac.apply_map(x[test], Rr), y[test], settings.retrieval,
                                              settings.csls_k).mean()
    return out


# --------------------------------------------------------------------------- diachronic


def word_displacement(x: np.ndarray, y: np.ndarray, anchor: np.ndarray, center: bool) -> np.ndarray:
    """1 - cos between each word's two vectors after a Procrustes map fitted on the anchor words
    (Hamilton et al. 2016; a word absent on one side has a zero row and gets displacement 1)."""
    x, y = unit_center_unit(x, center), unit_center_unit(y, center)
    R = ac.procrustes(x[anchor], y[anchor])
    return 1 - np.sum(ac.normalize(ac.apply_map(x, R)) * ac.normalize(y), axis=1)


def permutation_displacements(ao, an, old, new, vocab, anchor, settings) -> np.ndarray:
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
            d = word_displacement(mean_a.astype(np.float64), mean_b.astype(np.float64), anchor, settings.center)
            out[l, p] = np.where(ok, d, np.nan)
    return out


def split_half_mask(corpus: reps.Corpus, seed: int) -> tuple[np.ndarray, str, list[int]]:
    """The split-half control's two halves of one corpus: (bool per word position, True = half 1; the
    unit split; the number of units in each half).

    By document when the corpus records them (raw:, split:, ud: and columns: files with -DOCSTART-
    lines): a seeded half of the distinct documents, whole, on each side, so that a document's own
    usage (a speech's pet phrase, a topic) never sits on both sides and passes for agreement. Occurrences
    cluster in documents, so halves of sentences share that usage and understate how much two
    independent samples of text differ (Hamilton et al. 2016 compare whole corpora; the permutation
    null, the membership split and the CIs of this workbench all move whole documents). A corpus with
    fewer than two documents, or none recorded, falls back to a seeded half of its sentences (the unit
    is named in the rows' extra)."""
    lengths = [len(s) for s in corpus.sentences]
    rng = np.random.default_rng(seed)
    names = list(dict.fromkeys(corpus.docs)) if corpus.docs is not None else []
    if len(names) >= 2:
        first = set(np.asarray(names, dtype=object)[rng.permutation(len(names))[: len(names) // 2]])
        by_sentence = np.array([d in first for d in corpus.docs], dtype=bool)
        unit, counts = "document", [len(first), len(names) - len(first)]
    else:
        by_sentence = rng.random(len(corpus.sentences)) < 0.5
        unit, counts = "sentence", [int(by_sentence.sum()), int((~by_sentence).sum())]
    return np.repeat(by_sentence, lengths), unit, counts


def diachronic_task(unit, prepared, settings) -> list[pd.DataFrame]:
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
    # split-half control: the old corpus in two seeded halves of its documents (`split_half_mask`)
    ids, half_unit, half_sizes = split_half_mask(old, settings.seed)
    if half_unit != "document":
        unit.log(f"diachronic: {settings.old_corpus} records no documents; its split-half control splits sentences")
    T1 = reps.type_vectors(ao.layers, old.sentences, vocab, lc, mask=ids)
    T2 = reps.type_vectors(ao.layers, old.sentences, vocab, lc, mask=~ids)
    both = (np.abs(T1).sum(axis=(0, 2)) > 0) & (np.abs(T2).sum(axis=(0, 2)) > 0)
    positions = reps.word_index(old.sentences, vocab, lc)
    n_half1 = np.bincount(positions[(positions >= 0) & ids], minlength=len(vocab)).astype(np.float64)
    n_half2 = np.bincount(positions[(positions >= 0) & ~ids], minlength=len(vocab)).astype(np.float64)
    n_anchor = min(settings.anchors, len(vocab))
    anchor = np.arange(n_anchor)
    perm = (permutation_displacements(ao, an, old, new, vocab, anchor, settings)
            if settings.permutations else None)
    freq = np.log(np.array([min(fo[w], fn[w]) for w in vocab], dtype=np.float64))
    n_old = np.array([fo[w] for w in vocab], dtype=np.float64)
    n_new = np.array([fn[w] for w in vocab], dtype=np.float64)
    metrics: dict[str, list] = {}
    layer_words: list[Any] = []
    from scipy.stats import spearmanr

    for layer in range(len(Told)):
        disp = word_displacement(Told[layer], Tnew[layer], anchor, settings.center)
        split = word_displacement(T1[layer], T2[layer], anchor, settings.center)
        # for averages of n1 and n2 draws the expected 1 - cos grows like 1/n1 + 1/n2 (while it is
        # small), so the noise floor of the old-vs-new comparison is split * (1/n_old + 1/n_new) /
        # (1/n1 + 1/n2) with each word's counts in the two halves (a first-order correction; before
        # issue 40 the halves were taken as even, n_old/2 each: split * (1 + n_old/n_new) / 4). Where
        # 1 - cos is not small the rescaling understates the floor; the permutation null needs none
        # (docs/evidence/align.md: model-free checks, experiments/align/noise_floor_check.py)
        floor = split * (1 / n_old + 1 / n_new) / (1 / np.maximum(n_half1, 1) + 1 / np.maximum(n_half2, 1))
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
            "anchors": n_anchor, "split_half_words": int(both.sum()), "split_half_unit": half_unit,
            "split_half_sizes": half_sizes}
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


def model_pair_vectors(checkpoint, s: Settings) -> tuple[np.ndarray, np.ndarray]:
    """(vectors [layers, words, width], the sentence index of each word [words]) of the `model-pair`
    words for one checkpoint (the last step of a training folder), read from the activation cache the
    task fills (extracted here when absent): what a caller needs to resample the task's CKA matrix
    by sentence (`workbench.geometry.cka_matrix_bootstrap`). `s`: the probe's resolved settings
    (`probes.core.runner.resolve_settings(probes.align.PROBE, ...)`), as the run that wrote the CKA rows had them."""
    from probes.align.prepare import prepare
    from workbench.running.models import ModelHandle
    from workbench.store.checkpoints import expand_checkpoints

    prepared = prepare(s)
    ck = expand_checkpoints([checkpoint])[-1]
    handle = ck.handle.with_dtype(s.dtype) if ck.handle is not None else ModelHandle.load(ck.path, dtype=s.dtype)
    V = _pair_vectors(handle, None, prepared, s, s.stack)
    ends = np.cumsum([len(words) for words in prepared.data["corpora"][s.pair_corpus].sentences])
    return V, np.searchsorted(ends, prepared.data["pair_index"], side="right")
