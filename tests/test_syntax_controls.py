"""Issue 49's syntax options: Hewitt & Liang (2019)'s edge control task for arcs beside the type-pair
analogue (`arc_control`), and the MLP probe for MDL (`mdl_probe`, Voita & Titov 2020's setting)."""

from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from probes.core import mdl, statistics as stats
from probes.syntax import syntax_cli_main
from probes.syntax.items import EDGE_BEHAVIOURS, arcs, build_edge_control_items, build_items, edge_control_heads
from probes.syntax.tasks import paired_accuracy_difference
from workbench.store.results import ResultsStore


def _sentence(words, heads):
    return SimpleNamespace(words=list(words), heads=list(heads), upos=["X"] * len(words))


def test_edge_control_gives_each_type_one_behaviour():
    """Hewitt & Liang's definition: a word type attaches to itself, to the first or to the last word,
    the same behaviour wherever it occurs; the three behaviours about equally often over types."""
    vocab = [f"w{i}" for i in range(3000)]
    rng = np.random.default_rng(0)
    seen: dict[str, set] = {}
    for _ in range(200):
        words = list(rng.choice(vocab[:40], size=int(rng.integers(2, 12))))
        heads = edge_control_heads(words, seed=5)
        for i, (w, h) in enumerate(zip(words, heads)):
            behaviour = "self" if h == i else "first" if h == 0 else "last"
            if h == i and (i == 0 or i == len(words) - 1):
                continue  # self at an edge reads as first / last too: not informative
            assert h in (i, 0, len(words) - 1)
            seen.setdefault(w, set()).add(behaviour)
    assert all(len(b) == 1 for b in seen.values())  # one behaviour per type
    # over many types the draw is uniform over the three behaviours
    long = [f"x{i}" for i in range(3000)]
    heads = edge_control_heads(["<first>"] + long + ["<last>"], seed=5)[1:-1]
    counts = Counter("self" if h == i + 1 else "first" if h == 0 else "last" for i, h in enumerate(heads))
    assert set(counts) == set(EDGE_BEHAVIOURS)
    assert all(abs(n / 3000 - 1 / 3) < 0.03 for n in counts.values())
    assert edge_control_heads(["<first>"] + long + ["<last>"], seed=6)[1:-1] != heads  # seeded


def test_edge_control_items_are_the_control_arcs_and_unlinked_pairs():
    sents = [_sentence(["the", "cat", "sat", "down", "the", "end"], [2, 3, 0, 3, 6, 3]),
             _sentence(["cat", "sat"], [2, 0])]
    off = np.array([0, 6, 8])
    items = build_edge_control_items(sents, off, seed=1)
    gold = build_items("arc", sents, off, seed=1)
    assert items.counts["positive_pairs"] == gold.counts["positive_pairs"] == 6  # the same dependents
    for k, s in enumerate(sents):
        control = edge_control_heads(s.words, 1)
        mine = [(int(a) - off[k], int(b) - off[k], lab) for a, b, lab, j in
                zip(items.cols[0], items.cols[1], items.labels, items.sentence) if j == k]
        pos = {(a, b) for a, b, lab in mine if lab == "arc"}
        assert pos == {(control[d], d) for d, h in enumerate(s.heads) if h > 0}
        linked = pos | {(b, a) for a, b in pos}
        neg = [(a, b) for a, b, lab in mine if lab == "none"]
        assert neg and not set(neg) & linked
        # a negative attaches a dependent by one of the two behaviours its type was NOT given, so the
        # head's place (itself, first, last) does not tell an arc from a non-arc
        last = len(s.words) - 1
        assert all(a in (b, 0, last) and a != control[b] for a, b in neg)
        assert len({b for _, b in neg}) == len(neg)  # at most one per dependent
    positives = [(a, b) for a, b, lab in zip(*items.cols, items.labels) if lab == "arc"]
    assert items.counts["self_attachments"] == sum(a == b for a, b in positives)


def test_paired_difference_of_one_item_set_is_the_per_item_difference():
    """Reference: on one item set the paired difference is the bootstrap of the per-item difference
    (what the type-pair control's selectivity computes)."""
    rng = np.random.default_rng(0)
    a = rng.random((3, 200)) < 0.7
    b = rng.random((3, 200)) < 0.5
    units = np.repeat(np.arange(40), 5)
    got = paired_accuracy_difference(a, units, b, units, 300, 4)
    want = stats.ratio_bootstrap(a.astype(float) - b, None, units, n_boot=300, seed=4)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-12)


def _xor_features(n=3000, seed=0):
    """Layer 0: noise; layer 1: the label is the XOR of two coordinates' signs (no linear probe can
    read it, a one-hidden-layer MLP can)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, n, 8)).astype(np.float32)
    y = ((x[1, :, 0] > 0) ^ (x[1, :, 1] > 0)).astype(np.int64)
    return x, y


def test_mdl_with_an_mlp_probe_compresses_what_a_linear_probe_cannot():
    x, y = _xor_features()
    fr = (0.02, 0.05, 0.1, 0.25, 0.5, 1.0)
    lin = mdl.mdl_online_code(x, y, num_classes=2, fractions=fr, config={"kind": "linear"}, seed=0)
    mlp = mdl.mdl_online_code(x, y, num_classes=2, fractions=fr, config={"kind": "mlp", "hidden": 64}, seed=0)
    assert lin.compression[1] < 1.1 and lin.compression[0] < 1.1
    assert mlp.compression[1] > 2.0 and mlp.compression[0] < 1.1


@pytest.mark.slow
def test_syntax_run_with_mlp_mdl_and_hewitt_liang_arcs(tiny_checkpoint, tmp_path, monkeypatch):
    """End to end on a tiny BERT: MDL fits the probe `mdl_probe` names (rows prefixed "mlp_"), and the
    arc control fits and scores Hewitt & Liang's control items, selectivity their paired difference."""
    from probes.syntax import run_syntax_probes, tasks as syntax_tasks

    kinds = []
    real = mdl.mdl_online_code

    def spy(x, y, **kw):
        kinds.append(kw["config"]["kind"])
        return real(x, y, **kw)

    monkeypatch.setattr(syntax_tasks.mdl, "mdl_online_code", spy)
    store = ResultsStore(tmp_path / "runs")
    run_id, rows = run_syntax_probes(
        [str(tiny_checkpoint)], ["upos", "arc"], max_train_sentences=60, max_eval_sentences=30, baselines=("control",),
        mdl_tasks=("upos",), mdl_probe="mlp", mdl_fractions=(0.1, 0.5, 1.0), arc_control="hewitt_liang",
        scalar_mix_tasks=(), store=store, cache_dir=tmp_path / "cache", n_boot=50, progress=False, threads=1,
    )  # fmt: skip
    assert kinds == ["mlp"]
    real_rows = rows[rows["model"] == "tiny-bert"]
    assert {"mlp_mdl_codelength", "mlp_compression"} <= set(real_rows["metric"])
    assert "mdl_codelength" not in set(real_rows["metric"])
    arc = real_rows[real_rows["task"] == "arc"]
    ctrl = arc[arc["metric"] == "control_accuracy"].sort_values("layer")
    acc = arc[arc["metric"] == "accuracy"].sort_values("layer")
    sel = arc[arc["metric"] == "selectivity"].sort_values("layer")
    assert {json.loads(e)["control_task"] for e in ctrl["extra"]} == {"hewitt_liang_edges"}
    np.testing.assert_allclose(sel["value"].to_numpy(), acc["value"].to_numpy() - ctrl["value"].to_numpy(), atol=1e-9)
    notes = store.manifest(run_id)["notes"]["pairs"]["arc"]
    assert notes["hewitt_liang_control"]["eval"]["positive_pairs"] == notes["eval"]["positive_pairs"]


@pytest.mark.parametrize("option,value", [("--mdl-probe", "quadratic"), ("--arc-control", "random")])
def test_bad_option_values_are_one_line_and_exit_2(tmp_path, capsys, option, value, tiny_checkpoint):
    code = syntax_cli_main(["--checkpoint", str(tiny_checkpoint), option, value, "--runs-root", str(tmp_path / "runs"),
                            "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and value in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").rglob("*.parquet"))
