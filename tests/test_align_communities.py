"""Alignment across communities (issue 29 part 3): corpus splits by party and era, and the
permutation baseline of the diachronic displacement, checked against hand facts and a planted shift."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from probes.align import communities, reps
from workbench.errors import ConfigError


def test_party_table_against_hand_facts_and_every_speech():
    assert communities.party("state_union/1961-Kennedy.txt") == "Democratic"
    assert communities.party("state_union/2001-GWBush-2.txt") == "Republican"
    assert communities.party("inaugural/1905-Roosevelt.txt") == "Republican"  # Theodore
    assert communities.party("inaugural/1933-Roosevelt.txt") == "Democratic"  # Franklin
    assert communities.party("inaugural/1841-Harrison.txt") == "Whig"  # William Henry
    assert communities.party("inaugural/1889-Harrison.txt") == "Republican"  # Benjamin
    assert communities.party("inaugural/1797-Adams.txt") == "Federalist"
    assert communities.speech("state_union/1965-Johnson-1.txt") == (1965, "Johnson")
    from workbench.data import raw

    for name in communities.SPLIT_CORPORA:  # every speech of both corpora has exactly one party
        parties = [communities.party(d.doc_id) for d in raw.load_documents(name)]
        assert len(parties) == len(raw.load_documents(name)) and set(parties) <= set(communities.PARTIES)


def test_splits_partition_the_speeches():
    dem = reps.load_corpus("split:state_union:party=Democratic")
    rep = reps.load_corpus("split:state_union:party=Republican")
    whole = reps.load_corpus("raw:state_union")
    assert len(dem.sentences) + len(rep.sentences) == len(whole.sentences)
    assert set(dem.docs) | set(rep.docs) == set(whole.docs) and not set(dem.docs) & set(rep.docs)
    assert "state_union/1961-Kennedy.txt" in dem.docs and "state_union/1981-Reagan.txt" in rep.docs
    assert {f.name for f in dem.files} == {d.split("/")[-1] for d in dem.docs}  # the manifest lists what was read
    early = reps.load_corpus("split:inaugural:years=1789-1899")
    late = reps.load_corpus("split:inaugural:years=1900-2021")
    assert len(set(early.docs)) == 28 and len(set(late.docs)) == 31  # 59 inaugural addresses, 1789-2021
    both = reps.load_corpus("split:inaugural:years=1789-1899+split:inaugural:years=1900-2021")
    assert both.docs == early.docs + late.docs
    sampled = reps.sample_corpus(dem, 50, seed=0, max_words=5)
    assert len(sampled.sentences) == 50 and all(len(s) <= 5 for s in sampled.sentences)
    assert all(d in dem.docs for d in sampled.docs) and len(sampled.docs) == 50


@pytest.mark.parametrize("spec, message", [
    ("split:brown:party=Democratic", "unknown corpus split 'brown'"),
    ("split:state_union:colour=red", "the rule must be"),
    ("split:state_union:party=Tory", "unknown party 'Tory'"),
    ("split:inaugural:years=2000-1990", "from <= to"),
    ("split:inaugural:years=1700-1710", "no inaugural speech matches"),
])
def test_bad_splits_are_one_clear_error(spec, message):
    with pytest.raises(ConfigError, match=message):
        reps.load_corpus(spec)


def test_unknown_split_exits_2_before_any_work(tmp_path):
    cmd = [sys.executable, "-m", "app.cli", "probe", "align", "--checkpoint", str(tmp_path / "no-such-model"),
           "--tasks", "diachronic", "--old-corpus", "split:brown:party=Democratic", "--runs-root", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    lines = [l for l in out.stderr.strip().splitlines() if l.strip()]
    assert len(lines) == 1 and "old_corpus" in lines[0] and "unknown corpus split 'brown'" in lines[0]
    written = [p.name for p in tmp_path.rglob("*") if p.is_file()]
    assert set(written) <= {"catalog.sqlite"}  # no results, cache or manifest: only the store's empty catalog


def test_permutations_need_documents():
    from probes import align
    from probes.align import Settings

    with pytest.raises(ConfigError, match="new_corpus: permutations re-split documents"):
        Settings(tasks=("diachronic",), permutations=10, new_corpus="ud:en_ewt:dev").validate(align.PROBE)


def _planted(seed=0, n_docs=12, vocab=60, H=8, shift=3.0):
    """Two corpora of documents whose word vectors are word + document + token noise; on the new side
    word 'w0' is pushed along a fixed direction (a planted move), every other word is unmoved."""
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab)]
    base = rng.standard_normal((vocab, H)) * 3
    direction = rng.standard_normal(H)
    corpora, layers = [], []
    for side in ("old", "new"):
        sents, docs, vecs = [], [], []
        for d in range(n_docs):
            doc_effect = rng.standard_normal(H) * 0.3
            for _ in range(4):
                ids = rng.integers(0, vocab, 25)
                ids[0] = 0  # w0 in every sentence
                sents.append([words[i] for i in ids])
                docs.append(f"{side}/{d}.txt")
                v = base[ids] + doc_effect + rng.standard_normal((len(ids), H)) * 0.5
                if side == "new":
                    v[ids == 0] += shift * direction
                vecs.append(v)
        corpora.append(reps.Corpus(side, sents, [], docs=docs))
        layers.append(SimpleNamespace(layers=np.concatenate(vecs)[None].astype(np.float32)))
    return words, corpora, layers


def test_permutation_baseline_finds_the_planted_move_and_nothing_else():
    from probes.align import word_displacement, permutation_displacements

    words, (old, new), (ao, an) = _planted()
    settings = SimpleNamespace(lowercase=True, seed=0, permutations=200, center=True)
    anchor = np.arange(1, 41)  # the map is fitted on unmoved words
    perm = permutation_displacements(ao, an, old, new, words, anchor, settings)
    assert perm.shape == (1, 200, len(words)) and not np.isnan(perm).any()
    To = reps.type_vectors(ao.layers, old.sentences, words)
    Tn = reps.type_vectors(an.layers, new.sentences, words)
    disp = word_displacement(To[0], Tn[0], anchor, True)
    z = (disp - perm[0].mean(axis=0)) / perm[0].std(axis=0, ddof=1)
    p = (1 + (perm[0] >= disp).sum(axis=0)) / 201
    assert z[0] > 10 and p[0] == pytest.approx(1 / 201)  # the planted word beats every random split
    assert abs(np.median(z[1:])) < 1.0 and np.mean(p[1:] < 0.05) < 0.2  # the others look like the null


def test_one_permutation_equals_the_procedure_on_that_split():
    """A permutation's displacement is the plain procedure (type vectors, Procrustes on the anchors,
    1 - cos) on the documents it drew: recomputed here from masks through `reps.type_vectors`."""
    from probes.align import word_displacement, permutation_displacements

    words, (old, new), (ao, an) = _planted(seed=1, n_docs=5)
    settings = SimpleNamespace(lowercase=True, seed=3, permutations=1, center=True)
    anchor = np.arange(1, 41)
    got = permutation_displacements(ao, an, old, new, words, anchor, settings)[0, 0]
    doc_names = list(dict.fromkeys([("old", d) for d in old.docs] + [("new", d) for d in new.docs]))
    in_a = np.zeros(len(doc_names), bool)
    in_a[np.random.default_rng(settings.seed + 1).permutation(len(doc_names))[:5]] = True
    side_a = {doc_names[i] for i in np.flatnonzero(in_a)}
    sents = old.sentences + new.sentences
    keys = [("old", d) for d in old.docs] + [("new", d) for d in new.docs]
    mask = np.repeat([k in side_a for k in keys], [len(s) for s in sents])
    layers = np.concatenate([ao.layers, an.layers], axis=1)
    A = reps.type_vectors(layers, sents, words, mask=mask)[0]
    B = reps.type_vectors(layers, sents, words, mask=~mask)[0]
    assert np.allclose(got, word_displacement(A, B, anchor, True), atol=1e-4)


@pytest.mark.slow
def test_party_split_end_to_end_on_a_tiny_model(tmp_path, tokenizers):
    from tests.conftest import tiny_bert
    from tests.test_align import run_align

    folder = tmp_path / "m"
    tiny_bert(tokenizers["bert"], seed=0, max_positions=128, hidden=32, layers=2).save_pretrained(folder)
    tokenizers["bert"].save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps({"family": "bert"}))
    rows = run_align([folder], {"tasks": "diachronic", "old_corpus": "split:state_union:party=Republican",
                           "new_corpus": "split:state_union:party=Democratic", "max_sentences": 300,
                           "max_words": 32, "vocab_size": 150, "anchors": 100, "min_count": 5, "permutations": 10,
                           "top_moved": 5, "baselines": ""}, tmp_path)
    perm = rows[rows["metric"] == "permutation_displacement"]
    assert len(perm) == 3 and all(json.loads(e)["baseline"] == "permutation" for e in perm["extra"])
    top = rows[rows["metric"] == "top_moved_z"]
    extra = json.loads(top["extra"].iloc[0])
    assert extra["permutations"] == 10 and min(extra["documents"]) >= 10
    listed = extra["top_moved"]
    assert len(listed) == 5 and all(w["count_old"] >= 5 and w["count_new"] >= 5 for w in listed)
    zs = [w["z"] for w in listed]
    assert zs == sorted(zs, reverse=True) and top["value"].iloc[0] == pytest.approx(np.mean(zs), abs=1e-3)
    assert all(round(1 / 11, 4) <= w["p_perm"] <= 1 for w in listed)  # never below the +1-corrected minimum


def test_moved_plot_draws_the_listed_z_with_both_counts():
    import pandas as pd

    from app.page_modules.align import moved_plot

    listed = [{"word": "fellow", "displacement": 0.02, "noise_floor": 0.0, "z": 7.4, "p_perm": 0.01,
               "count_old": 36, "count_new": 38},
              {"word": "wage", "displacement": 0.06, "noise_floor": 0.02, "z": 5.2, "p_perm": 0.01,
               "count_old": 10, "count_new": 30}]
    rows = pd.DataFrame([{"model": "m", "layer": 6, "metric": "top_moved_z", "value": 6.3, "task": "diachronic",
                          "extra": json.dumps({"permutations": 100, "top_moved": listed})}])
    drawn = moved_plot(rows, "t", {})
    bar = drawn.figure.data[0]
    assert list(bar.x) == [5.2, 7.4] and list(bar.y) == ["wage (10/30)", "fellow (36/38)"]  # ascending: top at top
    assert drawn.data["word"].tolist() == ["wage", "fellow"]
    no_z = pd.DataFrame([{**rows.iloc[0], "extra": json.dumps({"top_moved": [{k: v for k, v in w.items()
                                                                          if k not in ("z", "p_perm")}
                                                                         for w in listed]})}])
    assert list(moved_plot(no_z, "t", {}).figure.data[0].x) == pytest.approx([0.02, 0.04])  # excess over the floor
