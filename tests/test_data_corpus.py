"""Corpus builder: seeded document-level splits with a manifest that records membership."""

import json

import pytest

from workbench.data.corpus import (
    PRETRAINING_SOURCES,
    CorpusSplit,
    build_corpus,
    default_pretraining_sources,
)
from workbench.data.raw import load_documents, source_files
from workbench.errors import ConfigError, DataFormatError
from workbench.io import sha256_file
from workbench.paths import data_root

SMALL = ["inaugural", "state_union", "webtext"]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus") / "c0"
    return build_corpus(SMALL, out, heldout_fraction=0.1, seed=0)


def test_splits_are_disjoint_and_cover_every_document(small):
    all_ids = [d.doc_id for s in SMALL for d in load_documents(s)]
    train, held = small.doc_ids("train"), small.doc_ids("heldout")
    assert not set(train) & set(held)
    assert sorted(train + held) == sorted(all_ids)
    # per source, round(0.1 * n) half up: inaugural 59 -> 6, state_union 65 -> 7, webtext 6 -> 1
    held_by_source = {s: sum(i.startswith(s + "/") for i in held) for s in SMALL}
    assert held_by_source == {"inaugural": 6, "state_union": 7, "webtext": 1}


def test_documents_round_trip_and_counts(small):
    originals = {d.doc_id: d for s in SMALL for d in load_documents(s)}
    for split in ("train", "heldout"):
        docs = small.documents(split)
        assert [d.doc_id for d in docs] == small.doc_ids(split)
        assert all(d == originals[d.doc_id] for d in docs)
        counts = small.manifest["counts"][split]
        assert counts["documents"] == len(docs)
        assert counts["words"] == sum(len(d.text.split()) for d in docs)
        assert counts["characters"] == sum(len(d.text) for d in docs)
    by_source = small.manifest["counts"]["by_source"]
    assert sum(c["train"]["words"] + c["heldout"]["words"] for c in by_source.values()) == sum(
        len(d.text.split()) for d in originals.values()
    )


def test_manifest_records_checksums_and_settings(small):
    m = small.manifest
    assert (m["sources"], m["seed"], m["heldout_fraction"], m["max_documents"]) == (SMALL, 0, 0.1, None)
    root = data_root()
    for source in SMALL:
        files = m["source_files"][source]
        assert sorted(files) == sorted(str(p.relative_to(root)) for p in source_files(source))
        for rel, digest in list(files.items())[:5]:
            assert digest == sha256_file(root / rel)
    assert len(m["source_files"]["inaugural"]) == 59
    assert sorted(p.name for p in small.dir.iterdir()) == ["heldout.jsonl", "manifest.json", "train.jsonl"]
    assert not [p for p in small.dir.parent.iterdir() if p.name.startswith(".")]  # no temp folders left


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_other_split(small, tmp_path):
    again = build_corpus(SMALL, tmp_path / "again", heldout_fraction=0.1, seed=0)
    for name in ("manifest.json", "train.jsonl", "heldout.jsonl"):
        assert (again.dir / name).read_bytes() == (small.dir / name).read_bytes()
    other = build_corpus(SMALL, tmp_path / "other", heldout_fraction=0.1, seed=1)
    assert set(other.doc_ids("heldout")) != set(small.doc_ids("heldout"))
    assert len(other.doc_ids("heldout")) == len(small.doc_ids("heldout"))
    # a source's split does not depend on which other sources are built with it
    alone = build_corpus(["inaugural"], tmp_path / "alone", heldout_fraction=0.1, seed=0)
    assert alone.doc_ids("heldout") == [i for i in small.doc_ids("heldout") if i.startswith("inaugural/")]


def test_max_documents_and_rebuild_in_place(tmp_path):
    c = build_corpus(["inaugural", "webtext"], tmp_path / "c", heldout_fraction=0.5, seed=3, max_documents=4)
    assert len(c.doc_ids("train")) == len(c.doc_ids("heldout")) == 4  # 2 + 2 per source
    c2 = build_corpus(["inaugural"], tmp_path / "c", heldout_fraction=0.0, seed=3)  # replaces the folder
    assert len(c2.doc_ids("train")) == 59 and c2.doc_ids("heldout") == []
    assert CorpusSplit.load(tmp_path / "c").manifest["sources"] == ["inaugural"]


def test_bad_arguments_and_tampered_files(small, tmp_path):
    with pytest.raises(ConfigError):
        build_corpus(["nope"], tmp_path / "x")
    with pytest.raises(ConfigError):
        build_corpus(["inaugural", "inaugural"], tmp_path / "x")
    with pytest.raises(ConfigError):
        build_corpus(["inaugural"], tmp_path / "x", heldout_fraction=1.0)
    assert not (tmp_path / "x").exists()
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("manifest.json", "train.jsonl", "heldout.jsonl"):
        (copy / name).write_bytes((small.dir / name).read_bytes())
    lines = (copy / "train.jsonl").read_text(encoding="utf-8").split("\n")
    lines[1], lines[2] = lines[2], lines[1]
    (copy / "train.jsonl").write_text("\n".join(lines), encoding="utf-8")
    with pytest.raises(DataFormatError) as err:
        CorpusSplit.load(copy).documents("train")
    assert err.value.line == 2 and err.value.path.endswith("train.jsonl")
    with pytest.raises(DataFormatError):
        CorpusSplit.load(tmp_path / "missing")


@pytest.mark.slow
def test_default_pretraining_corpus(tmp_path):
    sources = default_pretraining_sources()
    assert sources == list(PRETRAINING_SOURCES) == ["brown", "abc", "webtext", "state_union", "inaugural", "wikitext2"]
    assert "ewt_raw" not in sources and "gum_raw" not in sources
    assert default_pretraining_sources(include_probe_text=True)[-2:] == ["ewt_raw", "gum_raw"]
    c = build_corpus(sources, tmp_path / "default", heldout_fraction=0.1, seed=0)
    counts = c.manifest["counts"]
    total_words = counts["train"]["words"] + counts["heldout"]["words"]
    total_docs = counts["train"]["documents"] + counts["heldout"]["documents"]
    print(f"default pretraining corpus: {total_docs} documents, {total_words:,} words "
          f"(train {counts['train']['words']:,}, heldout {counts['heldout']['words']:,})")
    assert total_docs == 500 + 3_189 + 6 + 65 + 59 + 122
    assert total_words == 1_161_192 + 663_964 + 300_501 + 349_711 + 138_096 + 455_097 == 3_068_561
    assert counts["heldout"]["documents"] == 50 + 319 + 1 + 7 + 6 + 12
    with open(c.dir / "heldout.jsonl", encoding="utf-8") as f:
        assert sum(1 for _ in f) == counts["heldout"]["documents"]
    assert json.loads((c.dir / "manifest.json").read_text())["source_files"]["brown"]["nltk/brown/ca01"]


def test_corpus_recipe_is_a_training_setting_that_leaves_recipe_1_hashes_alone(tmp_path, monkeypatch):
    """`corpus.recipe: 2` selects the block hold-out (membership non-members from every webtext
    file); recipe 1, the default, keeps the training hash and corpus cache folder every model
    trained before it had."""
    import hashlib

    from workbench.config import load_train_config
    from workbench.drivers.train import corpus_dir_for

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path))
    base = {"family": "bert", "preset": "tiny", "steps": 3}
    one, two = load_train_config(base), load_train_config({**base, "corpus": {"recipe": 2}})
    assert one.corpus.recipe == 1 and two.corpus.recipe == 2
    assert one.training_hash() != two.training_hash()
    # the main job's config hashes as it did before the key existed (computed on commit eb2d399):
    # its run folders keep resuming (with the dropout masks of then: `dropout_masks` is newer still)
    assert load_train_config("experiments/train/deberta_small.yaml",
                       {"dropout_masks": "bernoulli"}).training_hash() == "2c2bea118852b470"
    c = one.corpus
    old_key = json.dumps({"sources": c.sources, "heldout_fraction": c.heldout_fraction, "seed": c.seed,
                          "max_documents": c.max_documents}, sort_keys=True)
    assert corpus_dir_for(one).name == hashlib.sha256(old_key.encode()).hexdigest()[:20]  # as before the key existed
    assert corpus_dir_for(two) != corpus_dir_for(one)
    with pytest.raises(ConfigError):
        load_train_config({**base, "corpus": {"recipe": "two"}})
