"""workbench.store.checkpoints: step folders, a training folder's steps, a checkpoint's manifest, the weights hash."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
import torch

from tests.conftest import tiny_bert
from workbench.store.checkpoints import (expand_checkpoints, list_steps, read_manifest, seed_dir, step_dir, step_number,
                                   weight_files)
from workbench.errors import CheckpointError
from workbench.store.identity import weights_hash
from workbench.store.manifest import checkpoint_record
from workbench.running.models import ModelHandle


@pytest.fixture(scope="module")
def saved_bert(tmp_path_factory, tokenizers):
    """A tiny BERT saved with `save_pretrained` plus its tokenizer: a checkpoint folder."""
    folder = tmp_path_factory.mktemp("ckpt") / "tiny-bert"
    tok = tokenizers["bert"]
    tiny_bert(tok).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _fake_step(folder, manifest=None):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    if manifest is not None:
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def test_step_folder_layout():
    assert step_dir("run", 8).as_posix() == "run/step-0000008"
    assert step_number(step_dir("run", 1234567)) == 1234567
    assert step_number("run/step-x") is None and step_number("run/checkpoint-8") is None
    assert step_dir(seed_dir("run", 3), 8).as_posix() == "run/seed-3/step-0000008"


def test_training_folder_lists_steps_in_numeric_order(tmp_path):
    run = tmp_path / "run"
    # seeds 10 and 2 (numeric order puts 2 first), steps whose names would sort wrongly as text
    # without the zero padding; plus things that are not complete checkpoints.
    for seed, step in [(10, 0), (2, 100), (2, 9), (10, 16)]:
        _fake_step(run / f"seed-{seed}" / f"step-{step}", {"family": "bert", "step": step, "seed": seed})
    (run / "seed-2" / "step-0000050").mkdir()  # no config.json: not a complete checkpoint
    _fake_step(run / "seed-2" / ".step-0000060.abc.tmp")  # a half-written checkpoint
    _fake_step(run / "seed-2" / "step-latest")  # not a step number
    _fake_step(run / "other" / "step-0000001")  # not a seed folder
    assert [(s, p.relative_to(run).as_posix()) for s, p in list_steps(run)] == [
        (9, "seed-2/step-9"), (100, "seed-2/step-100"), (0, "seed-10/step-0"), (16, "seed-10/step-16")]
    assert [s for s, _ in list_steps(run / "seed-2")] == [9, 100]
    ckpts = expand_checkpoints([run])
    assert [(c.name, c.step, c.seed, c.family) for c in ckpts] == [
        ("run/seed-2/step-9", 9, 2, "bert"), ("run/seed-2/step-100", 100, 2, "bert"),
        ("run/seed-10/step-0", 0, 10, "bert"), ("run/seed-10/step-16", 16, 10, "bert")]
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="empty: neither a checkpoint folder"):
        expand_checkpoints([tmp_path / "empty"])


def test_manifest_parse_error_names_the_file(tmp_path, saved_bert):
    assert read_manifest(tmp_path) is None  # no manifest: fine (any HF folder)
    good = _fake_step(tmp_path / "good", {"family": "gpt", "step": 3})
    assert read_manifest(good) == {"family": "gpt", "step": 3}

    bad = shutil.copytree(saved_bert, tmp_path / "bad")
    (bad / "manifest.json").write_text('{"family": "bert", "step": ')
    not_object = _fake_step(tmp_path / "list", ["bert"])
    bad_step = _fake_step(tmp_path / "bad-step", {"step": "eight"})
    for folder, call in [(bad, read_manifest), (bad, lambda f: expand_checkpoints([f])),
                         (bad, ModelHandle.load), (not_object, lambda f: expand_checkpoints([f])),
                         (bad_step, lambda f: expand_checkpoints([f]))]:
        with pytest.raises(CheckpointError) as e:
            call(folder)
        msg = str(e.value)
        assert msg.startswith(str(folder / "manifest.json") + ":") and "\n" not in msg, msg


def test_weights_hash_is_one_hash_and_ignores_non_weight_files(tmp_path, saved_bert):
    folder = shutil.copytree(saved_bert, tmp_path / "ckpt")
    weights = folder / "model.safetensors"
    expected = hashlib.sha256(b"model.safetensors" + hashlib.sha256(weights.read_bytes()).hexdigest().encode()).hexdigest()
    assert weight_files(folder) == [weights]
    assert weights_hash(folder) == expected

    # Files that do not change what the model computes: a Trainer's arguments and optimizer, our
    # trainer_state/, a sub-folder head, other frameworks' weights, an adapter, the manifest.
    (folder / "training_args.bin").write_bytes(b"pickled TrainingArguments")
    (folder / "optimizer.pt").write_bytes(b"adam moments")
    (folder / "trainer_state").mkdir()
    (folder / "trainer_state" / "model.pt").write_bytes(b"full training module")
    (folder / "sbo_head").mkdir()
    (folder / "sbo_head" / "model.safetensors").write_bytes(b"span boundary head")
    (folder / "tf_model.h5").write_bytes(b"tensorflow")
    (folder / "adapter_model.safetensors").write_bytes(b"lora")
    (folder / "pytorch_model.bin").write_bytes(b"unused when model.safetensors exists")
    (folder / "manifest.json").write_text(json.dumps({"family": "bert", "step": 4}))

    handle = ModelHandle.load(folder)
    assert handle.checkpoint_hash == expected
    assert checkpoint_record(folder)["sha256"] == expected
    assert checkpoint_record(handle)["sha256"] == expected
    assert checkpoint_record({"path": folder})["sha256"] == expected

    # A changed weight file changes it (the cache is keyed by size and mtime, not by path alone).
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert weights_hash(folder) != expected


def test_weight_files_follow_from_pretrained_preference(tmp_path):
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"w")
    (pickled / "training_args.bin").write_bytes(b"args")
    assert weight_files(pickled) == [pickled / "pytorch_model.bin"]

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": shards[1], "b": shards[0], "c": shards[1]}}))
    for s in shards:
        (sharded / s).write_bytes(s.encode())
    (sharded / "pytorch_model.bin").write_bytes(b"not read: safetensors come first")
    assert weight_files(sharded) == [sharded / s for s in shards]
    (sharded / shards[1]).unlink()
    with pytest.raises(CheckpointError, match="model.safetensors.index.json: names shard"):
        weight_files(sharded)

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "training_args.bin").write_bytes(b"args")
    assert weight_files(empty) == []
    with pytest.raises(CheckpointError, match="no weight files"):
        weights_hash(empty)


# ---- Hub names ------------------------------------------------------------------------------------


def _hub_cache(root, repo_id, folder, revision="0123456789abcdef0123456789abcdef01234567"):
    """`root/models--org--name/{blobs,snapshots/<revision>,refs/main}` as huggingface_hub lays out
    a download: snapshot files are symlinks into blobs/ named by content hash."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / revision
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in folder.iterdir():
        blob = repo / "blobs" / hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copyfile(f, blob)
        (snap / f.name).symlink_to(blob)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snap


@pytest.fixture
def hub_env(monkeypatch, tmp_path):
    """An empty Hugging Face home in tmp_path; nothing else in the environment names a cache."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "hf-home" / "hub"


def test_hub_name_resolves_through_the_local_cache(hub_env, monkeypatch, tmp_path, saved_bert, ewt_train):
    snap = _hub_cache(hub_env, "org/tiny-bert", saved_bert)
    [ck] = expand_checkpoints(["org/tiny-bert"])
    assert ck.name == "org/tiny-bert" and ck.path == snap and (ck.family, ck.step, ck.seed) == (None, None, None)

    from_hub, direct = ModelHandle.load("org/tiny-bert"), ModelHandle.load(saved_bert)
    assert from_hub.path == snap and expand_checkpoints([from_hub])[0].name == "org/tiny-bert"
    sents = [s.words for s in ewt_train[:5]]
    out_hub, out_direct = from_hub.forward(sents), direct.forward(sents)
    assert len(out_hub.hidden_states["encoder"]) == 3
    for a, b in zip(out_hub.hidden_states["encoder"], out_direct.hidden_states["encoder"]):
        assert torch.equal(a, b)
    assert from_hub.checkpoint_hash == direct.checkpoint_hash == weights_hash(snap) == checkpoint_record(snap)["sha256"]

    # HF_HUB_CACHE wins over HF_HOME, as in huggingface_hub.
    other = tmp_path / "elsewhere"
    snap2 = _hub_cache(other, "org/tiny-bert", saved_bert, revision="v1-tag")
    monkeypatch.setenv("HF_HUB_CACHE", str(other))
    assert expand_checkpoints(["org/tiny-bert"])[0].path == snap2

    # A local folder of that name comes first, as in from_pretrained.
    monkeypatch.chdir(tmp_path)
    shutil.copytree(saved_bert, tmp_path / "org" / "tiny-bert")
    [local] = expand_checkpoints(["org/tiny-bert"])
    assert local.path.resolve() == (tmp_path / "org" / "tiny-bert").resolve() and local.name == "tiny-bert"


def test_hub_name_not_cached_is_one_line(hub_env, saved_bert):
    _hub_cache(hub_env, "org/tiny-bert", saved_bert)
    for call in (lambda n: expand_checkpoints([n]), ModelHandle.load):
        for name in ("org/not-downloaded", "bert-base-uncased"):
            with pytest.raises(CheckpointError) as e:
                call(name)
            msg = str(e.value)
            assert msg.startswith(f"{name}: neither a local checkpoint folder nor a model in the Hugging Face cache "
                                  f"{hub_env};") and "\n" not in msg, msg
            assert f"hf download {name}" in msg and "--checkpoint" in msg
    # Not a Hub id either (two slashes, absolute): the plain "does not exist".
    with pytest.raises(CheckpointError, match=r"runs/train/x: checkpoint does not exist"):
        expand_checkpoints(["runs/train/x"])
    # refs/main names a snapshot that is not there: not cached.
    (hub_env / "models--org--tiny-bert" / "refs" / "main").write_text("deadbeef")
    with pytest.raises(CheckpointError, match="org/tiny-bert: neither a local checkpoint folder"):
        expand_checkpoints(["org/tiny-bert"])
