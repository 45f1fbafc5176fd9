"""`workbench.store.identity`: every checkpoint-identity hash in one module with one cache (issue 41, item 3).

The values must not move: stored run ids, manifests, resume keys and activation caches hold them.
The constants below were recorded by running the code this module replaced, taken from git
(`git show e783439:workbench/store/checkpoints.py`, `.../manifest.py`, the `state_dict_hash` function of
`.../models.py` and `tests/weight_pins.py`), on the planted files and tensors built here. The files
are planted bytes and the tensors exact values (arange / powers of two), so the hashes depend on no
CPU kind and no library version.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from pathlib import Path

import pytest
import torch

from workbench.store import identity
from workbench.errors import CheckpointError
from workbench.store.manifest import checkpoint_record, data_file_record

ROOT = Path(__file__).resolve().parents[1]

# Recorded with the replaced functions (see the module docstring).
OLD = {
    "weights_hash": {
        "single": "9ccf885e91e4f8db87f340a3fba9fb7c7a8dd05a83077ef6cad73db9af71c288",
        "sharded": "925b85e131a283f01b358ac761aee94ac302f5002298b2e615aebf0ea12d56e6",
        "binary": "359905a6ad7bafd79339803c730314dc791246fdaa58d8c5334f0d7f1a628d6e",
    },
    "file": "83e83600a2b8b74b0f13f49361d48c78e6ed724b013884d1faf728499b3d914a",  # manifest.checkpoint_hash and data_file_record
    "state_dict_hash": "80d3a59afaa908c9d4ca9869dc7e33db1c03e35b81f2b6472d4b8e633ff0b39b",
    "pin_state_hash": "f3ef7a2625ab018d86d3e8b671103ea456996828d92a4f8306d31fd75f63b496",
}


def _plant(folder: Path, files: dict[str, bytes | str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data if isinstance(data, bytes) else data.encode())
    return folder


@pytest.fixture
def planted(tmp_path):
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                            "c": "model-00001-of-00002.safetensors"}}
    return {
        "single": _plant(tmp_path / "single", {"model.safetensors": bytes(range(256)) * 3, "config.json": "{}",
                                               "manifest.json": "{}"}),
        "sharded": _plant(tmp_path / "sharded", {"model.safetensors.index.json": json.dumps(index),
                                                 "model-00001-of-00002.safetensors": b"first shard" * 10,
                                                 "model-00002-of-00002.safetensors": b"second shard" * 7}),
        "binary": _plant(tmp_path / "binary", {"pytorch_model.bin": b"\x80\x02torch pickle stand-in" * 5,
                                               "tokenizer.json": "{}"}),
        "file": _plant(tmp_path, {"weights.bin": b"a single weights file" * 9}) / "weights.bin",
    }


def _state() -> dict[str, torch.Tensor]:
    return {"b.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3) / 7,
            "a.bias": torch.arange(3, dtype=torch.int64) - 1,
            "c.half": (torch.arange(4, dtype=torch.float32) / 8).to(torch.bfloat16),
            "d.mask": torch.tensor([True, False, True])}


class _Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        for name, t in _state().items():
            self.register_buffer(name.replace(".", "_"), t)

    def state_dict(self, *args, **kwargs):  # the planted names, dots included
        return _state()


@pytest.fixture(autouse=True)
def fresh_cache():
    identity.HASH_CACHE.clear()
    yield
    identity.HASH_CACHE.clear()


def test_file_hashes_are_the_replaced_functions_values(planted):
    for name in ("single", "sharded", "binary"):
        assert identity.weights_hash(planted[name]) == OLD["weights_hash"][name], name
        assert identity.checkpoint_hash(planted[name]) == OLD["weights_hash"][name], name
    assert identity.checkpoint_hash(planted["file"]) == OLD["file"]
    assert identity.file_sha256(planted["file"]) == OLD["file"]
    assert data_file_record(planted["file"])["sha256"] == OLD["file"]
    assert checkpoint_record(planted["single"])["sha256"] == OLD["weights_hash"]["single"]


def test_tensor_hashes_are_the_replaced_functions_values():
    assert identity.state_dict_hash(_Module()) == OLD["state_dict_hash"]
    assert identity.state_dict_hash(_state()) == OLD["state_dict_hash"]  # a state dict itself
    assert identity.tensors_hash(_state().items(), header_end="|") == OLD["pin_state_hash"]
    from tests.weight_pins import state_hash

    assert state_hash(_state()) == OLD["pin_state_hash"]
    # the hash reads every byte: one value changed moves it
    changed = _state()
    changed["a.bias"][0] = 5
    assert identity.state_dict_hash(changed) != OLD["state_dict_hash"]


def test_tokenizer_hash_is_the_replaced_formula():
    """`tokenization.tokenizer_hash` and the activation cache's backend hash were both sha256 of the
    backend's JSON (`to_str()`); a WordLevel tokenizer built here (no training) is hashed that way."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "cat": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")
    old = hashlib.sha256(tok.backend_tokenizer.to_str().encode("utf-8")).hexdigest()
    assert identity.tokenizer_hash(tok) == identity.backend_tokenizer_hash(tok.backend_tokenizer) == old
    backend2 = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "dog": 2}, unk_token="[UNK]"))
    assert identity.backend_tokenizer_hash(backend2) != old


def test_one_cache_reads_each_file_once_and_again_after_a_rewrite(planted, monkeypatch):
    reads = []
    real = identity.sha256_file

    def counting(path, *a, **k):
        reads.append(Path(path).name)
        return real(path, *a, **k)

    monkeypatch.setattr(identity, "sha256_file", counting)
    f = planted["file"]
    # the checkpoint record, the data-file record and the identity function: one read
    assert identity.checkpoint_hash(f) == data_file_record(f)["sha256"] == identity.file_sha256(f) == OLD["file"]
    assert reads == ["weights.bin"]
    # a folder: its weight files hashed once whichever way it is asked for
    folder = planted["single"]
    assert identity.weights_hash(folder) == checkpoint_record(folder)["sha256"] == identity.checkpoint_hash(folder)
    assert len(identity.HASH_CACHE) == 2
    # a file rewritten in place (new size and mtime) is hashed again, with its new value
    f.write_bytes(b"other bytes")
    os.utime(f, ns=(1, 1))
    assert identity.file_sha256(f) == hashlib.sha256(b"other bytes").hexdigest()
    assert reads == ["weights.bin", "weights.bin"]


def test_a_folder_without_weights_is_one_checkpoint_error(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no weight files"):
        identity.weights_hash(tmp_path / "empty")
    with pytest.raises(CheckpointError, match="does not exist"):
        identity.checkpoint_hash(tmp_path / "missing")


def test_no_other_module_defines_an_identity_hash():
    """One place: no module of workbench/, probes/ or app/ defines a module-level function of these
    names but `workbench.store.identity` (the replaced ones lived in checkpoints, manifest, models and
    tokenization; `ModelHandle.checkpoint_hash` is a property that calls it)."""
    names = {"weights_hash", "checkpoint_hash", "state_dict_hash", "tokenizer_hash", "backend_tokenizer_hash",
             "file_sha256", "tensors_hash"}
    found = []
    for top in ("workbench", "probes", "app"):
        for path in (ROOT / top).rglob("*.py"):
            if path == ROOT / "workbench" / "store" / "identity.py":
                continue
            for node in ast.parse(path.read_text(encoding="utf-8")).body:  # module level (not a handle's property)
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.name}")
    assert not found, found
