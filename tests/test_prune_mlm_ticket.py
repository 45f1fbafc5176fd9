"""The pretraining ticket (workbench.drivers.pretraining_ticket, `bertology prune` method imp_mlm):
IMP for the masked-LM loss of a tiny BERT pretrained here, then the task fine-tuning with the
mask kept (Chen et al. 2020, Sec. 5). Exact invariants: after k rounds the sparsity is 0.1 k,
counted in the weights; masks are nested; pruned weights stay zero through the MLM rounds and
through the fine-tuning; each round starts from the pretrained weights times the mask."""

from __future__ import annotations

import importlib

import pytest
import torch

from tests.training_helpers import tiny_config
from workbench.compress.masks import load_masks
from workbench.drivers.pretraining_ticket import MaskedStart, MlmTicketSettings, mlm_tickets, transfer_masks
from workbench.drivers.prune_sweep import load_prune_config, run_prune
from workbench.compress.unstructured import dense_layers, magnitude_masks
from workbench.errors import ConfigError
from workbench.store.results import ResultsStore
from workbench.drivers.train import train_from_config

FT = {"task": "sentence_polarity", "seeds": [0], "epochs": 1, "lr": 1e-3, "max_train_examples": 48,
      "max_eval_examples": 16, "batch_size": 16, "baselines": False, "device": "cpu"}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("BERTOLOGY_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("BERTOLOGY_RUNS", str(tmp_path_factory.mktemp("runs")))
    yield
    mp.undo()


@pytest.fixture(scope="module")
def pretrained(env, tmp_path_factory):
    cfg = tiny_config("bert", 6, tmp_path_factory.mktemp("bert"), objective={"nsp": False},
                      corpus={"sources": ["inaugural"], "max_documents": 12, "heldout_fraction": 0.2, "seed": 0},
                      tokenizer={"vocab_size": 400}, max_len=32, batch_size=4, eval={"batches": 1})
    (final,) = train_from_config(cfg)
    return final


@pytest.fixture(scope="module")
def sweep(pretrained, tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    cfg, ft = load_prune_config({"finetune": {**FT, "checkpoint": str(pretrained)}, "methods": ["imp_mlm"],
                                 "sparsities": [0.1, 0.2], "mlm": {"steps": 3, "lr": 1e-3},
                                 "output_dir": str(root / "sweep"), "progress": False})
    # the MLM rounds called directly first (same folder: the sweep then finds them finished)
    masks, pretrainer, found_by = mlm_tickets(pretrained, 0.2, 0.1, MlmTicketSettings(steps=3, lr=1e-3), root / "sweep" / "mlm",
                                    log=lambda _: None)
    result = run_prune(cfg, ft, store=ResultsStore(root / "runs"))
    return result, masks, pretrainer, root / "sweep", found_by


def test_masked_start_loads_the_pretrained_weights_times_the_mask(pretrained):
    loader = importlib.import_module("workbench.families.bert").load_pretrainer
    source, module = loader(pretrained), loader(pretrained)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(1.0)  # anything but the pretrained weights
    names = list(dense_layers(source))
    masks = magnitude_masks(source, names, 0.3)
    MaskedStart(source.state_dict(), masks, {})(module)
    got, want = dict(module.named_parameters()), dict(source.named_parameters())
    for n, p in want.items():
        expected = p * masks[n] if n in masks else p
        assert torch.equal(got[n], expected), n
    assert sum(int((~m).sum()) for m in masks.values()) == round(0.3 * sum(m.numel() for m in masks.values()))


@pytest.mark.slow
def test_mlm_rounds_prune_a_tenth_each_and_keep_the_mask_through_training(sweep, pretrained):
    _, masks, pretrainer, folder, _ = sweep
    total = sum(m.numel() for m in masks[0.1].values())
    for k, amount in enumerate((0.1, 0.2), start=1):
        assert sum(int((~m).sum()) for m in masks[amount].values()) == round(0.1 * k * total)
    for n in masks[0.1]:  # nested: what round 1 pruned stays pruned
        assert not (masks[0.2][n] & ~masks[0.1][n]).any()
    loader = importlib.import_module("workbench.families.bert").load_pretrainer
    round2 = loader(sorted((folder / "mlm" / "round-2" / "seed-0").glob("step-*"))[-1])
    start = dict(pretrainer.named_parameters())
    moved = 0
    for n, p in round2.named_parameters():
        if n in masks[0.1]:
            assert (p[~masks[0.1][n]] == 0).all(), n  # trained 3 MLM steps under round 1's mask: still zero
            moved += int((p[masks[0.1][n]] != start[n][masks[0.1][n]]).sum())
    assert moved > 0  # the kept weights did train


@pytest.mark.slow
def test_ticket_fine_tuned_with_the_mask_kept_and_the_sparsity_counted(sweep):
    from workbench.running.classifier_loading import load_classifier

    result, masks, pretrainer, _, _ = sweep
    points = {p["amount"]: p for p in result.points if p["method"] == "imp_mlm"}
    assert set(points) == {0.1, 0.2}
    for k, amount in enumerate((0.1, 0.2), start=1):
        p = points[amount]
        assert p["sparsity_measured"] == pytest.approx(0.1 * k, abs=0.5 / p["prunable"])
        saved = load_masks(p["checkpoint"])
        model = load_classifier(p["checkpoint"])
        assert saved.keys() == transfer_masks(masks[amount], pretrainer, model).keys()
        params = dict(model.named_parameters())
        for n, m in transfer_masks(masks[amount], pretrainer, model).items():
            assert torch.equal(saved[n], m)
            assert (params[n][~m] == 0).all(), n
    from workbench.drivers.prune_rows import over_seeds

    assert result.rows["seed"].notna().all()  # per-seed rows only (issue 41)
    assert "imp_mlm" not in set(over_seeds(result.rows, "test", "wins")["model"])  # 1 seed: no sd, no wins


@pytest.mark.slow
def test_ticket_cost_counts_the_masked_lm_rounds_that_found_its_mask(sweep, pretrained):
    """A pretraining ticket's total cost = the pretrained model's + the masked-LM rounds 1..k that
    found its mask + its own fine-tuning (issue 29: a derived model carries all that made it)."""
    from pathlib import Path

    from workbench.cost import checkpoint_cost

    result, _, _, _, found_by = sweep
    base = checkpoint_cost(pretrained)["total"]["flops"]
    points = {p["amount"]: p for p in result.points if p["method"] == "imp_mlm"}
    for k, amount in enumerate((0.1, 0.2), start=1):
        rounds = found_by[amount]
        assert len(rounds) == k
        rounds_flops = sum(checkpoint_cost(r)["own"]["flops"] for r in rounds)
        cost = checkpoint_cost(points[amount]["checkpoint"])
        assert base > 0 and rounds_flops > 0 and cost["own"]["flops"] > 0
        assert cost["total"]["flops"] == pytest.approx(base + rounds_flops + cost["own"]["flops"])
        assert [Path(r).resolve() for r in cost["prior"]["search"]] == [Path(r).resolve() for r in rounds]


@pytest.mark.slow  # the pretrained fixture trains a tiny model
def test_bad_imp_mlm_configs_are_one_line(pretrained, tmp_path):
    base = {"finetune": {**FT, "checkpoint": str(pretrained)}, "methods": ["imp_mlm"], "sparsities": [0.1],
            "output_dir": str(tmp_path / "s")}
    with pytest.raises(ConfigError, match=r"mlm: steps: must be >= 1, got 0"):
        load_prune_config({**base, "mlm": {"steps": 0}})
    with pytest.raises(ConfigError, match=r"mlm.*stpes"):
        load_prune_config({**base, "mlm": {"stpes": 3}})
    with pytest.raises(ConfigError, match=r"mlm: settings for method imp_mlm"):
        load_prune_config({**base, "methods": ["imp"], "mlm": {"steps": 3}})
    with pytest.raises(ConfigError, match=r"not a multiple of imp_step"):
        load_prune_config({**base, "sparsities": [0.15]})
    with pytest.raises(ConfigError, match=r"mlm: sparsities\[0\]: 0.25 is not a multiple of imp_step"):
        load_prune_config({**base, "mlm": {"sparsities": [0.25]}})
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in pretrained.iterdir():
        if f.is_file() and f.name != "manifest.json":  # a Hub-style folder: weights, no manifest
            (bare / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ConfigError, match=r"methods: imp_mlm: .* not a checkpoint pretrained by `bertology train`"):
        load_prune_config({**base, "finetune": {**FT, "checkpoint": str(bare)}})


@pytest.mark.slow  # the pretrained fixture trains a tiny model
def test_prune_seeds_override_takes_a_comma_list(pretrained):
    """`bertology prune CONFIG --seeds 1,2` (one process per seed) replaces finetune.seeds."""
    base = {"finetune": {**FT, "checkpoint": str(pretrained)}, "methods": ["imp"], "sparsities": [0.1]}
    assert load_prune_config(base, None, {"seeds": "1,2"})[1].seeds == [1, 2]
    assert load_prune_config(base, None, {"seeds": None})[1].seeds == [0]
