"""Membership by document (issue 26's audit): the layer probe's train/test split keeps a document on
one side, every CI resamples documents, samples spread over documents, the model-free TF-IDF control,
the reference attacks named for their sources, and the corpus recipe that rebuilds a checkpoint's
split when its corpus folder is gone."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from probes import membership as mem
from probes.membership import attacks as ma
from probes.core.statistics import auc, auc_bootstrap

# --------------------------------------------------------------------------- reference attacks


def test_reference_diff_and_ratio_equal_hand_computations():
    target, ref = np.array([2.0, 3.0, 1.5]), np.array([2.5, 2.0, 3.0])
    assert ma.reference_diff_score(target, ref) == pytest.approx([0.5, -1.0, 1.5])
    # Carlini et al. 2021: log ppl_target / log ppl_ref, low for a member -> score is its negative
    assert ma.reference_ratio_score(target, ref) == pytest.approx([-0.8, -1.5, -0.5])
    assert ma.reference_score is ma.reference_diff_score  # the old name
    with pytest.raises(ValueError, match="positive reference NLL"):
        ma.reference_ratio_score(target, np.array([1.0, 0.0, 1.0]))


def test_reference_alias_gives_the_diff_rows():
    s = mem.Sample(ids=["a", "b"], doc_ids=["a", "b"], texts=["x y", "z w"], is_member=np.array([True, False]),
                   lengths=np.array([2, 2]))
    st, ref = mem.Stats(np.array([1.0, 2.0]), np.zeros(2)), mem.Stats(np.array([4.0, 2.5]), np.zeros(2))
    settings = mem.Settings(attacks=("reference", "reference_ratio"), reference="REF")
    out = mem.attack_scores(s, st, settings, ref)
    assert set(out) == {"reference_diff", "reference_ratio"}
    assert out["reference_diff"] == pytest.approx([3.0, 0.5]) and out["reference_ratio"] == pytest.approx([-0.25, -0.8])


# --------------------------------------------------------------------------- splitting and sampling by document


def test_grouped_split_keeps_documents_whole_and_halves_each_group():
    rng = np.random.default_rng(0)
    docs = np.repeat([f"d{i}" for i in range(60)], rng.integers(1, 12, 60))
    member_docs = {f"d{i}" for i in range(0, 60, 2)}
    y = np.array([d in member_docs for d in docs])
    train = ma.grouped_split(docs, y, seed=3)
    assert not set(docs[train]) & set(docs[~train])
    for label in (True, False):
        share = train[y == label].mean()
        assert 0.35 < share < 0.65
    assert (ma.grouped_split(docs, y, seed=3) == train).all() and (ma.grouped_split(docs, y, seed=4) != train).any()
    with pytest.raises(ValueError, match="more than one label"):
        ma.grouped_split(["a", "a", "b"], [1, 0, 1], seed=0)


def test_capped_sampling_spreads_both_groups_over_documents_the_same_way():
    # 20 non-member documents of 50 passages, 200 member documents of 5; all passages the same length
    non_groups = np.repeat([f"n{i}" for i in range(20)], 50)
    mem_groups = np.repeat([f"m{i}" for i in range(200)], 5)
    keys_m, keys_n = np.full(len(mem_groups), 32), np.full(len(non_groups), 32)
    im, inn, cap = ma.capped_length_matched(keys_m, keys_n, mem_groups, non_groups, 40, seed=0)
    assert len(im) == len(inn) == 40 and cap == 2  # one per document gives 20 non-members: too few
    counts = np.unique(non_groups[inn], return_counts=True)[1]
    assert len(counts) == 20 and (counts == 2).all()  # two of each of the 20, not a random mix
    assert np.unique(mem_groups[im], return_counts=True)[1].max() <= 2  # the same cap for members
    # the uncapped draw takes some documents many times and leaves others out
    um, un = ma.length_matched(keys_m, keys_n, 40, seed=0)
    assert np.unique(non_groups[un], return_counts=True)[1].max() > 2 and len(set(non_groups[un])) < 20
    # nested caps: the passages kept at cap c are kept at c + 1
    rank = ma.rank_in_group(non_groups, seed=0)
    assert all(((rank == k).sum() == 20) for k in range(50))


def test_document_ci_equals_the_statistics_bootstrap_and_is_wider_on_clustered_scores():
    rng = np.random.default_rng(1)
    docs = np.repeat(np.arange(40), 25)
    y = np.isin(docs, np.arange(20))
    offset = rng.normal(0, 1.0, 40)[docs]  # passages of a document share a score offset
    scores = offset + 0.3 * y + rng.normal(0, 0.3, len(docs))
    r = ma.roc_metrics(scores, y, n_boot=300, seed=2, units=docs)
    point, lo, hi = auc_bootstrap(scores, y, units=docs, n_boot=300, seed=2)
    assert r.auc == pytest.approx(point) == pytest.approx(auc(scores, y))
    assert r.auc_ci == pytest.approx((lo, hi))
    by_passage = ma.roc_metrics(scores, y, n_boot=300, seed=2)
    assert (hi - lo) > 2 * (by_passage.auc_ci[1] - by_passage.auc_ci[0])


def _topic_sample(n_docs=60, per_doc=12, seed=0):
    """Documents with their own topic words; membership is random per document, so the texts carry
    no membership signal, only each document's identity."""
    rng = np.random.default_rng(seed)
    common = [f"w{k}" for k in range(200)]
    texts, docs = [], []
    for d in range(n_docs):
        topic = [f"topic{d}x{k}" for k in range(8)]
        for _ in range(per_doc):
            words = list(rng.choice(common, 24)) + list(rng.choice(topic, 8))
            rng.shuffle(words)
            texts.append(" ".join(words))
            docs.append(f"doc{d}")
    member = rng.permutation(n_docs) < n_docs // 2
    y = np.array([member[int(d[3:])] for d in docs])
    return texts, np.array(docs), y


def test_tfidf_control_leaks_with_a_passage_split_and_not_with_a_document_split():
    texts, docs, y = _topic_sample()
    rng = np.random.default_rng(0)
    passage_split = np.zeros(len(y), bool)
    for label in (True, False):  # the old split: half of each group's passages at random
        idx = rng.permutation(np.nonzero(y == label)[0])
        passage_split[idx[: len(idx) // 2]] = True
    leak = ma.tfidf_control_scores(texts, y, passage_split)
    a, lo, _ = auc_bootstrap(leak, y[~passage_split], units=docs[~passage_split], n_boot=300)
    assert a > 0.9 and lo > 0.75  # the planted topic words identify the document, hence its label
    by_doc = ma.grouped_split(docs, y, seed=0)
    clean = ma.tfidf_control_scores(texts, y, by_doc)
    a, lo, hi = auc_bootstrap(clean, y[~by_doc], units=docs[~by_doc], n_boot=300)
    assert lo < 0.5 < hi


def test_tfidf_control_is_at_chance_on_real_documents_split_at_random(tmp_path):
    """Real speeches, held out at random per document (membership is random): on the grouped split the
    control's document-level CI covers 0.5."""
    from workbench.data.corpus import build_corpus

    corpus = build_corpus(["inaugural", "state_union"], tmp_path / "c", heldout_fraction=0.5, seed=0)
    s = mem.pretrain_sample(None, n_examples=400, seed=0, corpus_dir=corpus.dir)
    docs = np.asarray(s.doc_ids)
    assert s.info["documents_per_group"] == mem.documents_per_group(docs, s.is_member)
    assert min(s.info["documents_per_group"].values()) >= 50  # spread over the documents
    train = ma.grouped_split(docs, s.is_member, seed=0)
    scores = ma.tfidf_control_scores(s.texts, s.is_member, train)
    a, lo, hi = auc_bootstrap(scores, s.is_member[~train], units=docs[~train], n_boot=500)
    print(f"TF-IDF control on real speeches, split by document: AUC {a:.3f} [{lo:.3f}, {hi:.3f}]")
    assert lo < 0.5 < hi


# --------------------------------------------------------------------------- a trained checkpoint


@pytest.fixture(scope="module")
def tiny_gpt_run(tmp_path_factory):
    from tests.training_helpers import run_tiny_training

    root = tmp_path_factory.mktemp("mia-recipe")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BERTOLOGY_RUNS", str(root / "runs"))
        run = run_tiny_training("gpt", 4, root / "runs" / "train" / "tiny-gpt")
        yield run, root


def _probe(checkpoint, store_root, runs_root, monkeypatch, tasks=("attacks", "layers")):
    from probes.core import runner
    from workbench.store.results import ResultsStore

    monkeypatch.setenv("BERTOLOGY_RUNS", str(runs_root))
    settings = {"tasks": list(tasks), "attacks": ["loss"], "n_examples": 60, "min_words": 4, "n_boot": 100,
                "baselines": [], "progress": False}
    run_id, rows = runner.run_probe("membership", [checkpoint], settings, store=ResultsStore(store_root))
    return rows, ResultsStore(store_root).manifest(run_id)["notes"]


def test_probe_rows_report_documents_and_the_tfidf_control(tiny_gpt_run, tmp_path, monkeypatch):
    run, root = tiny_gpt_run
    rows, notes = _probe(run.checkpoint, tmp_path / "store", root / "runs", monkeypatch)
    extra = lambda r: json.loads(r) if isinstance(r, str) else r
    loss = rows[(rows["task"] == "loss") & (rows["metric"] == "auc")].iloc[0]
    info = next(iter(notes["membership_samples"].values()))
    assert extra(loss["extra"])["documents"] == info["documents_per_group"]
    probe = rows[(rows["task"] == "layer_probe") & (rows["metric"] == "auc")]
    control = rows[(rows["task"] == "tfidf_control") & (rows["metric"] == "auc")]
    assert len(control) == 1 and control["layer"].isna().all()
    assert extra(control["extra"].iloc[0])["baseline"] == "model_free_tfidf"
    assert probe["layer"].notna().all()
    layer_extra = extra(probe["extra"].iloc[0])
    assert layer_extra["split"] == "by document"
    total = info["documents_per_group"]
    for group in ("members", "nonmembers"):  # no document on both sides of the split
        assert layer_extra["documents"][group] + layer_extra["documents_train"][group] == total[group]
    text = mem.summary(rows)
    assert "documents" in text and "TF-IDF control" in text


def test_checkpoint_copied_alone_rebuilds_and_verifies_its_corpus(tiny_gpt_run, tmp_path, monkeypatch):
    from workbench.store.checkpoints import read_manifest
    from workbench.data.corpus import CorpusSplit, resolve_corpus_manifest
    from workbench.errors import CheckpointError, DataFormatError

    run, root = tiny_gpt_run
    m = read_manifest(run.checkpoint)
    assert m["corpus_recipe"]["recipe"] == 1 and m["corpus_recipe"]["source_files"]
    cached = resolve_corpus_manifest(run.checkpoint, m["corpus"], root / "runs").parent
    shutil.copytree(cached, tmp_path / "original-corpus")
    original = CorpusSplit.load(tmp_path / "original-corpus")
    shutil.rmtree(cached)  # the corpus folder is gone
    alone = tmp_path / "elsewhere" / "ckpt"
    shutil.copytree(run.checkpoint, alone)
    empty_runs = tmp_path / "other-runs"
    monkeypatch.setenv("BERTOLOGY_RUNS", str(empty_runs))
    with pytest.raises(CheckpointError, match="not found"):
        resolve_corpus_manifest(alone, m["corpus"])
    rows, notes = _probe(alone, tmp_path / "store", empty_runs, monkeypatch, tasks=("attacks",))
    assert not rows.empty and "corpus-rebuilt" in next(iter(notes["membership_samples"].values()))["ground_truth"]
    corpus, path = mem.corpus_of(alone)
    assert path.is_relative_to(empty_runs) and path.parent.parent.name == "corpus-rebuilt"
    for split in ("train", "heldout"):
        assert corpus.doc_ids(split) == original.doc_ids(split)
        assert [d.text for d in corpus.documents(split)] == [d.text for d in original.documents(split)]
    sample = mem.pretrain_sample(alone, n_examples=40, min_words=4)
    assert sample.ids == mem.pretrain_sample(None, n_examples=40, min_words=4, corpus_dir=original.dir).ids

    # a data file that differs from the recorded hash is a clear error naming it
    data = tmp_path / "data"
    for source in ("inaugural", "state_union"):  # the tiny run's sources (a copy of the data root's folders)
        shutil.copytree(_data_root() / "nltk" / source, data / "nltk" / source)
    rel, _ = sorted(next(iter(m["corpus_recipe"]["source_files"].values())).items())[0]
    with open(data / rel, "a", encoding="utf-8") as f:
        f.write("\nA planted extra line.\n")
    monkeypatch.setenv("BERTOLOGY_DATA", str(data))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "third-runs"))
    with pytest.raises(DataFormatError, match=rf"{rel.split('/')[-1]}.*sha256.*not the data the model was trained on"):
        mem.corpus_of(alone)


def _data_root():
    from workbench.paths import data_root

    return data_root()


# --------------------------------------------------------------------------- corpus recipes


def test_recipe_1_manifest_is_unchanged_and_recipe_2_holds_out_blocks_of_every_webtext_file(tmp_path):
    from workbench.data.corpus import build_corpus, corpus_recipe, rebuild_corpus
    from workbench.data.raw import load_documents

    v1 = build_corpus(["webtext", "inaugural"], tmp_path / "v1", heldout_fraction=0.1, seed=0)
    assert "recipe" not in v1.manifest  # an old manifest and a new recipe-1 one are the same bytes
    assert v1.manifest["split_method"] == ("per source: permutation by numpy default_rng([seed, crc32(source)]); "
                                           "first round(fraction * n) held out")
    held_files_v1 = {d.split("#")[0] for d in v1.doc_ids("heldout") if d.startswith("webtext/")}
    assert len(held_files_v1) == 1  # the audit's finding: one whole file held out

    v2 = build_corpus(["webtext", "inaugural"], tmp_path / "v2", heldout_fraction=0.1, seed=0, recipe=2)
    assert v2.manifest["recipe"] == 2 and v2.manifest["block_lines"] == {"webtext": 20}
    assert v2.doc_ids("heldout")[-5:] == v1.doc_ids("heldout")[-5:]  # inaugural: split as in recipe 1
    files = [d.doc_id for d in load_documents("webtext")]
    held = [d for d in v2.doc_ids("heldout") if d.startswith("webtext/")]
    assert {d.split("#")[0] for d in held} == set(files)  # every file has held-out blocks
    assert not set(v2.doc_ids("train")) & set(v2.doc_ids("heldout"))
    for f in files:  # the blocks of a file are its text, in order, ~10% of them held out
        blocks = sorted((d for d in v2.documents("train") + v2.documents("heldout") if d.doc_id.split("#")[0] == f),
                        key=lambda d: d.doc_id)
        original = next(d for d in load_documents("webtext") if d.doc_id == f)
        assert "\n".join(b.text for b in blocks) == original.text
        n_held = sum(d.split("#")[0] == f for d in held)
        assert n_held == int(np.floor(0.1 * len(blocks) + 0.5))
    again = rebuild_corpus(corpus_recipe(v2), "test", tmp_path / "rebuilt")
    assert (again.dir / "manifest.json").read_bytes() == (v2.dir / "manifest.json").read_bytes()


def test_checkpoint_from_before_the_recipe_rebuilds_from_its_corpus_record(tiny_gpt_run, tmp_path, monkeypatch):
    """A manifest without `corpus_recipe` (trained before it was recorded): recipe 1 from its `corpus`
    record, verified by the corpus manifest's sha256; a planted change of the split is refused."""
    from workbench.store.checkpoints import read_manifest
    from workbench.errors import CheckpointError

    run, root = tiny_gpt_run
    original, _ = mem.corpus_of(run.checkpoint)
    alone = tmp_path / "old" / "ckpt"
    shutil.copytree(run.checkpoint, alone)
    m = read_manifest(alone)
    del m["corpus_recipe"]
    (alone / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs-a"))
    corpus, _ = mem.corpus_of(alone)
    assert corpus.doc_ids("heldout") == original.doc_ids("heldout")
    m["corpus"]["seed"] = m["corpus"]["seed"] + 1  # a record that does not describe the recorded split
    (alone / "manifest.json").write_text(json.dumps(m))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs-b"))
    with pytest.raises(CheckpointError, match="the split differs"):
        mem.corpus_of(alone)
