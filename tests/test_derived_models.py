"""Models made from models (`ModelHandle.derive`): a derived handle runs a transformed copy, has the
identity of what it runs, never touches its parent or the parent's cached activations, saves as an
ordinary checkpoint whose manifest records its lineage; the random-init twin is one such derivation
with the very weights the old construction gave."""

from __future__ import annotations

import copy
import hashlib
import json

import numpy as np
import pytest
import torch

from workbench.activations import cache_path, extract
from workbench.store.checkpoints import read_manifest
from workbench.data.conllu import load_treebank
from workbench.errors import CheckpointError, WorkbenchError
from workbench.store.identity import state_dict_hash, weights_hash
from workbench.running.models import ModelHandle, random_init_twin

HEAD = 1  # the attention head masked in layer 0 (tiny BERT: 2 heads of 16 dimensions)


def mask_head(model, layer: int, head: int):
    """Remove one self-attention head by zeroing its slice of the attention output projection's input
    columns (transformers 5 ignores `head_mask`): the head's context vectors no longer reach the
    residual stream, exactly as if its attention output were zero (Michel et al. 2019's head mask)."""
    attn = model.bert.encoder.layer[layer].attention
    d = model.config.hidden_size // model.config.num_attention_heads
    with torch.no_grad():
        attn.output.dense.weight[:, head * d:(head + 1) * d] = 0
    return model


def states(handle, sentences) -> np.ndarray:
    return np.concatenate([np.array(s) for s in handle.word_states(sentences)], axis=1)  # [L+1, N, H]


@pytest.fixture(scope="module")
def sentences():
    return [s.words for s in load_treebank("en_ewt", "dev")[:12]]


def _file_digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns


def test_masked_head_has_its_own_activations_and_leaves_the_parent_cache_alone(tiny_checkpoint, sentences, tmp_path):
    parent = ModelHandle.load(tiny_checkpoint)
    before_weights = {k: v.clone() for k, v in parent.model.state_dict().items()}
    parent_acts = extract(parent, sentences, "ewt-dev-12", cache_dir=tmp_path, progress=False)
    parent_vectors = np.array(parent_acts.layers)
    layers_file = parent_acts.path / "layers.npy"
    digest_before = _file_digest(layers_file)

    derived = parent.derive("head_mask", {"layer": 0, "head": HEAD}, apply=mask_head)

    # the parent is not modified, and the derived model is what a head mask means: the parent run
    # with that head's context zeroed before the output projection (a hook, no weight touched)
    for k, v in parent.model.state_dict().items():
        assert torch.equal(v, before_weights[k]), k
    d = parent.config.hidden_size // parent.config.num_attention_heads

    def zero_head(module, args):
        x = args[0].clone()
        x[..., HEAD * d:(HEAD + 1) * d] = 0
        return (x,)

    hook = parent.model.bert.encoder.layer[0].attention.output.dense.register_forward_pre_hook(zero_head)
    try:
        reference = states(parent, sentences)
    finally:
        hook.remove()
    got = states(derived, sentences)
    np.testing.assert_allclose(got, reference, rtol=1e-5, atol=1e-5)
    assert np.abs(got[1:] - states(parent, sentences)[1:]).max() > 1e-3  # the mask changes the blocks' outputs

    # identity: its own hash, stable across two identical derivations, another for another head
    assert derived.checkpoint_hash != parent.checkpoint_hash
    assert derived.checkpoint_hash == state_dict_hash(derived.model)
    again = parent.derive("head_mask", {"layer": 0, "head": HEAD}, apply=mask_head)
    assert again.checkpoint_hash == derived.checkpoint_hash
    other = parent.derive("head_mask", {"layer": 0, "head": 1 - HEAD}, apply=mask_head)
    assert other.checkpoint_hash not in (derived.checkpoint_hash, parent.checkpoint_hash)
    assert derived.lineage.parent == str(tiny_checkpoint) and derived.lineage.parent_hash == weights_hash(tiny_checkpoint)
    assert derived.lineage.transform == "head_mask" and derived.lineage.params == {"layer": 0, "head": HEAD}

    # its activations: another cache entry, the masked model's vectors (the embeddings, layer 0, agree)
    derived_acts = extract(derived, sentences, "ewt-dev-12", cache_dir=tmp_path, progress=False)
    assert derived_acts.path != parent_acts.path
    assert cache_path(derived, sentences, "ewt-dev-12", cache_dir=tmp_path) == derived_acts.path
    np.testing.assert_allclose(np.array(derived_acts.layers), got, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.array(derived_acts.layers)[0], parent_vectors[0])
    assert np.abs(np.array(derived_acts.layers)[1:] - parent_vectors[1:]).max() > 1e-3

    # the parent's entry is untouched: same bytes, same mtime, and re-reading gives the parent's vectors
    assert _file_digest(layers_file) == digest_before
    reread = extract(ModelHandle.load(tiny_checkpoint), sentences, "ewt-dev-12", cache_dir=tmp_path, progress=False)
    assert reread.path == parent_acts.path
    np.testing.assert_array_equal(np.array(reread.layers), parent_vectors)


def test_saved_derived_model_loads_as_a_plain_checkpoint_with_its_lineage(tiny_checkpoint, sentences, tmp_path):
    parent = ModelHandle.load(tiny_checkpoint)
    derived = parent.derive("head_mask", {"layer": 0, "head": HEAD}, apply=mask_head)
    folder = derived.save(tmp_path / "masked")
    loaded = ModelHandle.load(folder)
    np.testing.assert_array_equal(states(loaded, sentences), states(derived, sentences))
    m = read_manifest(folder)
    assert m["derived_from"]["parent"] == str(tiny_checkpoint)
    assert m["derived_from"]["parent_sha256"] == weights_hash(tiny_checkpoint)
    assert m["derived_from"]["transform"] == "head_mask" and m["derived_from"]["params"] == {"layer": 0, "head": HEAD}
    assert m["derived_from"]["content_sha256"] == derived.checkpoint_hash
    # the weights are the parent's, changed: its training record (family, step, seed) still describes them
    assert (m["family"], m["step"], m["seed"]) == ("bert", 7, 3)
    assert loaded.lineage == derived.lineage and "head_mask" in loaded.lineage.describe()
    assert loaded.checkpoint_hash == weights_hash(folder) != parent.checkpoint_hash
    # a chain: a model derived from the saved one records both steps
    second = loaded.derive("head_mask", {"layer": 1, "head": 0}, apply=mask_head)
    chain = second.lineage.describe()
    assert chain.startswith(str(tiny_checkpoint)) and chain.count("head_mask") == 2
    assert second.lineage.parent_lineage == derived.lineage
    # never over an existing folder unless asked; a failed save leaves nothing behind
    with pytest.raises(CheckpointError, match="already exists"):
        derived.save(folder)

    class Broken(RuntimeError):
        pass

    def broken(*a, **k):
        raise Broken("disk gone")

    derived.tokenizer = copy.copy(derived.tokenizer)
    derived.tokenizer.save_pretrained = broken
    with pytest.raises(Broken):
        derived.save(tmp_path / "half")
    assert not (tmp_path / "half").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".half")]


def _old_random_init_twin(handle, seed):
    """The twin as probes/engine.py built it before derived handles (commit eb2d399)."""
    model = handle.model
    config = copy.deepcopy(model.config)
    devices = [p.device for p in model.parameters()][:1] or [torch.device("cpu")]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        twin = type(model)(config)
    twin.to(devices[0]).eval()
    return ModelHandle(twin, handle.tokenizer, path=None, family=handle.family, max_length=handle.max_length)


def test_random_init_twin_is_a_derivation_with_the_old_weights(tiny_checkpoint, sentences, tmp_path):

    parent = ModelHandle.load(tiny_checkpoint)
    old = _old_random_init_twin(parent, 7919)
    twin = parent.derive("random_init", {"seed": 7919})
    for (name, a), (_, b) in zip(sorted(old.model.state_dict().items()), sorted(twin.model.state_dict().items())):
        assert torch.equal(a, b), name
    assert twin.checkpoint_hash == old.checkpoint_hash  # so its cache entries, unit keys and rows are as before
    assert random_init_twin(parent, 7919).checkpoint_hash == old.checkpoint_hash
    assert twin.lineage.transform == "random_init" and twin.lineage.params == {"seed": 7919} and twin.lineage.fresh_weights
    np.testing.assert_array_equal(states(twin, sentences), states(old, sentences))
    # saved, a fresh-weights model keeps how it is read (family) but not its parent's training record
    m = read_manifest(twin.save(tmp_path / "twin"))
    assert m["family"] == "bert" and "step" not in m and "seed" not in m and m["derived_from"]["fresh_weights"]


def test_hash_follows_weights_changed_in_place(tiny_checkpoint, sentences, tmp_path):
    """A handle whose model is changed in place after all (not through derive) does not keep its
    file hash: its identity follows the changed tensors, so it cannot read the old cache entry."""
    handle = ModelHandle.load(tiny_checkpoint)
    file_hash = handle.checkpoint_hash
    assert file_hash == weights_hash(tiny_checkpoint)
    before = cache_path(handle, sentences, "ewt-dev-12", cache_dir=tmp_path)
    assert handle.checkpoint_hash == file_hash  # reading the hash again changes nothing
    with torch.no_grad():
        handle.model.bert.encoder.layer[1].output.dense.weight.mul_(0.5)
    with pytest.warns(UserWarning, match="changed in place"):
        changed = handle.checkpoint_hash
    assert changed != file_hash and changed == state_dict_hash(handle.model)
    assert cache_path(handle, sentences, "ewt-dev-12", cache_dir=tmp_path) != before


def test_derive_refuses_bad_transforms(tiny_checkpoint):
    parent = ModelHandle.load(tiny_checkpoint)
    with pytest.raises(WorkbenchError, match="unknown transform 'prune'"):
        parent.derive("prune", {"sparsity": 0.5})
    with pytest.raises(WorkbenchError, match="JSON values"):
        parent.derive("head_mask", {"mask": object()}, apply=mask_head)
    with pytest.raises(WorkbenchError, match="changed the parent model"):
        parent.derive("identity", {}, apply=lambda model: parent.model)

    assert json.dumps(parent.derive("identity", {"note": "a"}, apply=lambda m, note: None).lineage.record())

    def sneaky(model):  # changes the parent through a closure instead of the copy it is given
        with torch.no_grad():
            parent.model.bert.embeddings.word_embeddings.weight.mul_(1.0)
        return model

    with pytest.raises(WorkbenchError, match="changed the parent model"):
        parent.derive("sneaky", {}, apply=sneaky)


def test_probe_run_records_the_lineage_of_a_derived_checkpoint(tiny_checkpoint, sentences, tmp_path):
    """A saved derived folder is probed like any checkpoint; the run manifest records its lineage and
    `bertology runs show` prints it. Its rows are its own values, not the parent's."""
    from probes.core import runner
    from workbench.store.results import ResultsStore, format_manifest

    def run_task(unit, prepared, task, s):
        acts = unit.activations(prepared.data, "ewt-dev-12")
        return [unit.rows(task, {"mean_dim0": np.asarray(acts.layers[..., 0], dtype=np.float64).mean(axis=1)},
                          split="dev", n=acts.layers.shape[1])]

    spec = runner.ProbeSpec("lineage-toy", ("dim0",), runner.Settings, lambda s: runner.Prepared(data=sentences),
                            run_task)
    folder = ModelHandle.load(tiny_checkpoint).derive("head_mask", {"layer": 0, "head": HEAD}, apply=mask_head).save(
        tmp_path / "masked")
    store = ResultsStore(tmp_path / "runs")
    run_id, rows = runner.run_probe(spec, [tiny_checkpoint, folder],
                                    {"baselines": [], "progress": False, "cache_dir": str(tmp_path / "cache")}, store=store)
    m = store.manifest(run_id)
    parent_rec, derived_rec = m["checkpoints"]
    assert "lineage" not in parent_rec and derived_rec["derived_from"]["parent_sha256"] == parent_rec["sha256"]
    assert derived_rec["sha256"] == weights_hash(folder)
    assert f"derived: {tiny_checkpoint} -> head_mask" in format_manifest(m)
    by_model = {name: g.sort_values("layer")["value"].to_numpy() for name, g in rows.groupby("model")}
    expected = states(ModelHandle.load(folder), sentences)[..., 0].astype(np.float64).mean(axis=1)
    np.testing.assert_allclose(by_model["masked"], expected, rtol=1e-5)
    assert by_model["masked"][0] == pytest.approx(by_model["tiny-bert"][0])  # embeddings untouched
    assert not np.allclose(by_model["masked"][1:], by_model["tiny-bert"][1:])
