"""Syntax probes: pair construction on real EWT, a planted signal through the whole pipeline, an
end-to-end CLI run of a tiny random BERT into a temporary results store, windowing, CLI errors."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from probes import syntax
from probes.syntax import FeatureView, build_items, run_syntax_probes, syntax_cli_main
from workbench.store.checkpoints import expand_checkpoints
from workbench.data.conllu import load_treebank, treebank_path
from workbench.errors import CheckpointError
from workbench.io import sha256_file
from workbench.store.results import ResultsStore


@pytest.fixture(scope="module")
def ewt_dev():
    return load_treebank("en_ewt", "dev")


def _offsets(sentences):
    return np.concatenate([[0], np.cumsum([len(s.words) for s in sentences])]).astype(np.int64)


# --------------------------------------------------------------------------- pairs
def test_deprel_items_are_the_gold_non_root_arcs(ewt_dev):
    off = _offsets(ewt_dev)
    items = build_items("deprel", ewt_dev, off)
    n_words = int(off[-1])
    assert len(items) == n_words - len(ewt_dev)  # one root per sentence, every other word has a head
    assert items.counts == {"arcs": n_words - len(ewt_dev), "root_arcs_left_out": len(ewt_dev)}
    sent_of_word = np.repeat(np.arange(len(ewt_dev)), np.diff(off))
    head, dep = items.cols
    assert (sent_of_word[head] == sent_of_word[dep]).all() and (sent_of_word[dep] == items.sentence).all()
    for k in range(0, len(items), 97):  # spot-check against the treebank
        s = ewt_dev[items.sentence[k]]
        d, h = dep[k] - off[items.sentence[k]], head[k] - off[items.sentence[k]]
        assert s.heads[d] == h + 1 and items.labels[k] == s.deprels[d] and items.types[k] == s.words[d]
    assert Counter(items.labels) == Counter(r for s in ewt_dev for r, h in zip(s.deprels, s.heads) if h > 0)
    base = build_items("deprel", ewt_dev, off, deprel_subtypes=False)
    assert ":" not in "".join(base.labels) and len(set(base.labels)) < len(set(items.labels))


def test_arc_items_balanced_seeded_and_disjoint_from_gold(ewt_dev):
    off = _offsets(ewt_dev)
    items = build_items("arc", ewt_dev, off, seed=3)
    n_arcs = int(off[-1]) - len(ewt_dev)
    c = items.counts
    assert c["positive_pairs"] == n_arcs and c["root_arcs_left_out"] == len(ewt_dev)
    assert c["negative_pairs"] + c["negative_shortfall"] == n_arcs and c["negative_shortfall"] < 0.01 * n_arcs
    assert Counter(items.labels) == {"arc": n_arcs, "none": c["negative_pairs"]}
    gold = {(off[i] + h - 1, off[i] + d) for i, s in enumerate(ewt_dev) for d, h in enumerate(s.heads) if h > 0}
    pairs = list(zip(items.cols[0].tolist(), items.cols[1].tolist()))
    neg = [p for p, lab in zip(pairs, items.labels) if lab == "none"]
    pos = {p for p, lab in zip(pairs, items.labels) if lab == "arc"}
    assert pos == gold
    assert not any(p in gold or p[::-1] in gold or p[0] == p[1] for p in neg)  # unlinked in both directions
    assert len(set(neg)) == len(neg)
    sent_of_word = np.repeat(np.arange(len(ewt_dev)), np.diff(off))
    assert all(sent_of_word[a] == sent_of_word[b] for a, b in neg)
    # seeded: same seed same pairs (whatever the other sentences), another seed other pairs
    again = build_items("arc", ewt_dev, off, sentence_ids=range(len(ewt_dev)), seed=3)
    assert list(zip(again.cols[0].tolist(), again.cols[1].tolist())) == pairs
    other = build_items("arc", ewt_dev, off, seed=4)
    assert list(zip(other.cols[0].tolist(), other.cols[1].tolist())) != pairs
    one = build_items("arc", ewt_dev, off, sentence_ids=[7], seed=3)
    assert set(zip(one.cols[0].tolist(), one.cols[1].tolist())) <= set(pairs)
    s0, (a0, b0) = ewt_dev[items.sentence[0]], pairs[0]
    assert items.types[0] == f"{s0.words[a0 - off[items.sentence[0]]]}\x00{s0.words[b0 - off[items.sentence[0]]]}"


def test_feature_view_gathers_like_numpy():
    base = np.random.default_rng(0).standard_normal((3, 20, 4)).astype(np.float32)
    a, b = np.array([0, 5, 7]), np.array([1, 1, 19])
    view = FeatureView(base, [a, b], product=True)
    full = np.concatenate([base[:, a], base[:, b], base[:, a] * base[:, b]], axis=-1)
    assert view.shape == (3, 3, 12)
    np.testing.assert_allclose(view[[0, 1, 2]], full)
    np.testing.assert_allclose(view[2], full[2])
    np.testing.assert_allclose(view[:, 1:3], full[:, 1:3])
    np.testing.assert_allclose(np.asarray(view), full)
    rows, offsets = syntax.sentence_rows(np.array([0, 4, 9, 20]), [2, 0])
    assert rows.tolist() == list(range(9, 20)) + [0, 1, 2, 3] and offsets.tolist() == [0, 11, 15]


def test_checkpoint_metadata_from_manifest(tmp_path):
    run = tmp_path / "bert-run"
    for step in (0, 8):
        d = run / f"step-{step:07d}"
        d.mkdir(parents=True)
        (d / "config.json").write_text("{}")
        (d / "manifest.json").write_text(json.dumps({"family": "bert", "step": step, "seed": 5}))
    seeded = tmp_path / "roberta-run" / "seed-1" / "step-0000016"
    seeded.mkdir(parents=True)
    (seeded / "config.json").write_text("{}")
    (seeded / "manifest.json").write_text(json.dumps({"family": "roberta", "step": 16, "seed": 1}))
    plain = tmp_path / "hf-model"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    cks = expand_checkpoints([run, str(plain), tmp_path / "roberta-run"])
    assert [(c.name, c.family, c.step, c.seed) for c in cks] == [
        ("bert-run/step-0000000", "bert", 0, 5), ("bert-run/step-0000008", "bert", 8, 5), ("hf-model", None, None, None),
        ("roberta-run/seed-1/step-0000016", "roberta", 16, 1)]
    with pytest.raises(CheckpointError, match="does not exist"):
        expand_checkpoints([tmp_path / "nope"])


def test_split_resolution_for_treebanks_without_train():
    gsd = syntax.plan_splits("es_gsd", "train", "dev", max_train_sentences=None, max_eval_sentences=None,
                             early_stopping_fraction=0.1, holdout_fraction=0.2, seed=0)
    assert (gsd.train_split, gsd.eval_split) == ("dev", "test")
    assert len(gsd.train) == len(load_treebank("es_gsd", "dev")) and len(gsd.eval) == len(load_treebank("es_gsd", "test"))
    assert sorted(np.concatenate([gsd.fit, gsd.stop]).tolist()) == list(range(len(gsd.train)))
    assert len(gsd.stop) == round(0.1 * len(gsd.train)) and len(gsd.files) == 2
    pud = syntax.plan_splits("es_pud", "train", "dev", max_train_sentences=None, max_eval_sentences=None,
                             early_stopping_fraction=0.1, holdout_fraction=0.2, seed=0)
    assert (pud.train_split, pud.eval_split) == ("test", "test") and pud.description["held_out_from_one_split"]
    assert len(pud.eval) == 200 and len(pud.train) == 800
    assert not {s.sent_id for s in pud.train} & {s.sent_id for s in pud.eval}
    with pytest.raises(syntax.ConfigError, match="has splits"):
        syntax.plan_splits("es_gsd", "train", "test", max_train_sentences=None, max_eval_sentences=None,
                           early_stopping_fraction=0.1, holdout_fraction=0.2, seed=0)


# --------------------------------------------------------------------------- planted signal
class PlantedHandle:
    """A fake model whose layer `k` is a linear code of each word's gold UPOS plus noise; every other
    layer is noise only (fresh per token, so no layer carries word identity either)."""

    def __init__(self, sentences, k, n_layers=3, hidden=16):
        self.tags = {}
        for s in sentences:
            self.tags.setdefault(tuple(s.words), s.upos)
        self.classes = sorted({t for s in sentences for t in s.upos})
        self.k, self.stacks, self.num_layers, self.hidden_size = k, ("encoder",), {"encoder": n_layers}, hidden
        self.checkpoint_hash, self.family, self.path, self.stats = f"planted-k{k}-{n_layers}-{hidden}", "planted", None, Counter()
        self.code = np.random.default_rng(0).standard_normal((len(self.classes), hidden)) * 3

    def word_states(self, sentences, pooling="first", stack=None, batch_size=32, chunk_size=None):
        for words in sentences:
            self.stats["sentences"] += 1
            seed = int.from_bytes(hashlib.sha256("\x1f".join(words).encode()).digest()[:8], "little")
            x = np.random.default_rng(seed).standard_normal((self.num_layers["encoder"] + 1, len(words), self.hidden_size))
            x[self.k] += self.code[[self.classes.index(t) for t in self.tags[tuple(words)]]]
            yield x.astype(np.float32)


@pytest.mark.slow
def test_planted_upos_layer_peaks_with_high_selectivity(tmp_path, ewt_dev):
    k = 2
    handle = PlantedHandle(load_treebank("en_ewt", "train") + ewt_dev, k)
    store = ResultsStore(tmp_path / "runs")
    run_id, rows = run_syntax_probes(
        [handle], ["upos"], max_train_sentences=300, max_eval_sentences=100, baselines=("majority", "control"),
        store=store, cache_dir=tmp_path / "cache", n_boot=200, mdl_fractions=(0.05, 0.25, 1.0), progress=False,
    )  # fmt: skip
    dev = rows[rows["split"] == "dev"]

    def per_layer(metric):
        return dev[dev["metric"] == metric].sort_values("layer")["value"].to_numpy()

    acc, ctrl, sel, maj = (per_layer(m) for m in ("accuracy", "control_accuracy", "selectivity", "majority"))
    assert len(acc) == 4 and int(np.argmax(acc)) == k and acc[k] > 0.95
    others = np.delete(np.arange(4), k)
    assert (np.abs(acc[others] - maj[0]) < 0.06).all()  # noise layers sit at the majority class
    assert sel[k] > 0.5 and (np.abs(sel[others]) < 0.1).all()
    np.testing.assert_allclose(sel, acc - ctrl, atol=1e-9)
    r = dev[dev["metric"] == "accuracy"]
    assert ((r["ci_low"] <= r["value"]) & (r["value"] <= r["ci_high"])).all()
    # the majority baseline is the most frequent UPOS of the fitting sentences, scored on the eval words
    plan = syntax.plan_splits("en_ewt", "train", "dev", max_train_sentences=300, max_eval_sentences=100,
                              early_stopping_fraction=0.1, holdout_fraction=0.2, seed=0)
    top = Counter(t for i in plan.fit for t in plan.train[i].upos).most_common(1)[0][0]
    eval_tags = [t for s in plan.eval for t in s.upos]
    assert maj == pytest.approx(np.full(4, eval_tags.count(top) / len(eval_tags)))
    assert store.manifest(run_id)["notes"]["items"]["upos"]["eval"]["words"] == len(eval_tags) == int(dev["n"].iloc[0])
    # scalar mix puts its weight on layer k; MDL compresses best at k
    cog = rows[rows["metric"] == "centre_of_gravity"]["value"].item()
    assert abs(cog - k) < 0.5
    comp = rows[rows["metric"] == "compression"].sort_values("layer")["value"].to_numpy()
    assert int(np.argmax(comp)) == k and comp[k] > 2 * comp[others].max()


# --------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_cli_end_to_end_all_tasks_tiny_bert(tmp_path, tiny_checkpoint, capsys, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    code = syntax_cli_main([
        "--checkpoint", str(tiny_checkpoint), "--tasks", ",".join(syntax.TASKS), "--treebank", "en_ewt",
        "--max-train-sentences", "200", "--max-eval-sentences", "60", "--structural-epochs", "3",
        "--n-boot", "100", "--mdl-tasks", "", "--seed", "1", "--runs-root", str(tmp_path / "runs"), "--quiet",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    store = ResultsStore(tmp_path / "runs")
    (run_id,) = store.runs()["run_id"].tolist()
    rows = store.read(run_id)
    models = {"tiny-bert", "tiny-bert (random init)"}
    assert set(rows["model"]) == models
    per_layer = rows[rows["layer"].notna() & (rows["split"] == "dev")]
    for task in syntax.TASKS:
        for model in models:
            got = per_layer[(per_layer["task"] == task) & (per_layer["model"] == model)]
            assert set(got["layer"].astype(int)) == {0, 1, 2}, (task, model)
    real = rows[rows["model"] == "tiny-bert"]
    assert set(real["step"]) == {7} and set(real["seed"]) == {3} and set(real["family"]) == {"bert"}
    twin = rows[rows["model"] == "tiny-bert (random init)"]
    assert all(json.loads(e)["baseline"] == "random_init" for e in twin["extra"])
    for metric in ("accuracy", "control_accuracy", "selectivity", "majority"):
        assert (real["metric"] == metric).any()
    for metric in ("uuas", "dspr", "right_branching_uuas", "root_acc", "nspr"):
        vals = real[real["metric"] == metric]["value"]
        assert len(vals) == 3 and vals.between(-1, 1).all()
    acc = real[(real["task"] == "upos") & (real["metric"] == "accuracy")]["value"]
    maj = real[(real["task"] == "upos") & (real["metric"] == "majority")]["value"]
    assert (acc > maj.iloc[0]).all()  # even random-weight BERT embeddings beat the majority class
    # manifest: treebank files with checksums, checkpoint hash, bad-input counts, pair counts
    m = store.manifest(run_id)
    files = {f["path"]: f["sha256"] for f in m["data_files"]}
    for split in ("train", "dev"):
        p = treebank_path("en_ewt", split).resolve()
        assert files[str(p)] == sha256_file(p)
    assert m["checkpoints"][0]["sha256"] and m["checkpoints"][0]["path"] == str(tiny_checkpoint.resolve())
    ex = m["notes"]["extraction"]["tiny-bert|encoder"]
    for split, n in (("train", 200), ("dev", 60)):
        assert ex[split]["sentences"] == n
        for key in ("windowed_sentences", "empty_sentences", "no_subword_words", "words_cut_by_window"):
            assert key in ex[split]
    assert m["notes"]["pairs"]["deprel"]["eval"]["root_arcs_left_out"] == 60
    assert m["notes"]["random_init_twins"][0]["of"] == "tiny-bert"
    # the printed summary: one line per layer
    assert f"run {run_id}" in out and "UPOS acc" in out and "rand-init UPOS" in out
    table = syntax.format_layer_table(rows)
    assert len([l for l in table.splitlines() if l.strip()[:1].isdigit()]) == 3


@pytest.mark.slow
def test_long_sentences_are_windowed_and_counted(tmp_path, tokenizers):
    from tests.conftest import tiny_bert
    from workbench.running.models import ModelHandle

    tok = tokenizers["bert"]
    handle = ModelHandle(tiny_bert(tok, max_positions=24), tok, max_length=24)
    run_id, rows = run_syntax_probes(
        [handle], ["upos"], max_train_sentences=40, max_eval_sentences=30, baselines=("majority",), mdl_tasks=(),
        probe=("linear", "mlp"),
        scalar_mix_tasks=(), store=ResultsStore(tmp_path / "runs"), cache_dir=tmp_path / "cache", progress=False,
        n_boot=50,
    )  # fmt: skip
    m = ResultsStore(tmp_path / "runs").manifest(run_id)
    plan = syntax.plan_splits("en_ewt", "train", "dev", max_train_sentences=40, max_eval_sentences=30,
                              early_stopping_fraction=0.1, holdout_fraction=0.2, seed=0)
    (key,) = m["notes"]["extraction"]
    for split, sents in (("train", plan.train), ("dev", plan.eval)):
        n_tokens = [len(tok(" ".join(s.words), add_special_tokens=False)["input_ids"]) for s in sents]
        expected = sum(n > handle.capacity for n in n_tokens)
        assert expected > 0
        assert m["notes"]["extraction"][key][split]["windowed_sentences"] == expected
        assert m["notes"]["extraction"][key][split]["words"] == sum(len(s.words) for s in sents)  # none dropped
    assert rows[rows["metric"] == "accuracy"]["n"].iloc[0] == sum(len(s.words) for s in plan.eval)
    # both classifiers, told apart by the metric name
    mlp = rows[rows["metric"] == "mlp_accuracy"]
    assert len(mlp) == 3 and mlp["value"].between(0, 1).all()
    assert {json.loads(e)["classifier"] for e in mlp["extra"]} == {"mlp"}



@pytest.mark.slow
def test_interrupted_run_resumes_with_the_finished_units(tmp_path, tiny_checkpoint, monkeypatch):
    """A run killed in its second task publishes nothing; the rerun reuses the finished units and
    its rows equal those of a run that was never interrupted."""
    kw = dict(max_train_sentences=60, max_eval_sentences=30, baselines=("majority",), mdl_tasks=(),
              scalar_mix_tasks=(), cache_dir=tmp_path / "cache", progress=False, n_boot=50,
              structural={"epochs": 2})  # fmt: skip
    tasks = ["upos", "structural-depth"]
    _, clean = run_syntax_probes([tiny_checkpoint], tasks, store=ResultsStore(tmp_path / "clean"), **kw)

    store = ResultsStore(tmp_path / "runs")
    real_structural = syntax.fit_structural_task

    def interrupted(ctx, task):
        raise KeyboardInterrupt

    monkeypatch.setattr(syntax, "fit_structural_task", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_syntax_probes([tiny_checkpoint], tasks, store=store, **kw)
    assert store.runs().empty
    saved = list((tmp_path / "runs" / "partials").glob("syntax-*/*.parquet"))
    assert len(saved) == 1 and saved[0].name.startswith("tiny-bert_encoder_upos")

    calls = []
    monkeypatch.setattr(syntax, "fit_structural_task", lambda ctx, task: calls.append(task) or real_structural(ctx, task))
    monkeypatch.setattr(syntax, "fit_classification_task", lambda ctx, task: pytest.fail(f"{task} was recomputed"))
    run_id, resumed = run_syntax_probes([tiny_checkpoint], tasks, store=store, **kw)
    assert calls == ["structural-depth"]
    m = store.manifest(run_id)
    assert m["notes"]["reused_units"] == [f"tiny-bert|encoder|upos|{m['checkpoints'][0]['sha256'][:16]}"]
    assert not list((tmp_path / "runs" / "partials").glob("syntax-*"))  # removed once the run is published
    cols = ["model", "task", "layer", "metric", "value", "ci_low", "ci_high", "n"]
    key = ["model", "task", "layer", "metric"]
    a = clean[cols].sort_values(key).reset_index(drop=True)
    b = resumed[cols].sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)

def test_cli_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    missing = tmp_path / "no-such-checkpoint"
    code = syntax_cli_main(["--checkpoint", str(missing), "--runs-root", str(tmp_path / "runs"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and str(missing) in err and "does not exist" in err
    assert syntax_cli_main(["--checkpoint", str(missing), "--tasks", "pos", "--runs-root", str(tmp_path / "runs")]) == 2
    assert "unknown task" in capsys.readouterr().err


def test_layer_table_one_block_per_model_and_stack():
    from probes.core.rows import layer_rows

    def rows(model, stack, task, metric, values, extra=None):
        return layer_rows({metric: values}, probe="syntax", task=task, split="dev", stack=stack, model=model, extra=extra)

    import pandas as pd

    df = pd.concat([
        rows("m", "encoder", "upos", "accuracy", [0.5, 0.9]), rows("m", "decoder", "upos", "accuracy", [0.4, 0.3]),
        rows("m (random init)", "encoder", "upos", "accuracy", [0.45, 0.47], {"baseline": "random_init"}),
        rows("m", "encoder", "structural-distance", "uuas", [0.2, 0.6]),
        rows("m", "encoder", "upos", "scalar_mix_weight", [0.1, 0.9]).assign(split="train:stop"),
    ])  # fmt: skip
    table = syntax.format_layer_table(df)
    heads = [l for l in table.splitlines() if l.startswith("==")]
    assert heads == ["== m [encoder]", "== m [decoder]"]
    enc = table.split("== m [decoder]")[0].splitlines()
    assert enc[3].split()[:2] == ["1", "0.900"] and enc[3].split()[-3:-1] == ["0.470", "-"]
    assert "0.600" in enc[3] and "0.300" in table.split("== m [decoder]")[1]


def test_many_checkpoints_get_a_matrix_per_metric():
    from probes.core.rows import layer_rows

    steps = [0, 1, 2, 4, 8]
    df = pd.concat([
        layer_rows({metric: [v + 0.01 * step, v + 0.1 + 0.01 * step]}, probe="syntax", task=task, split="dev",
                   stack="encoder", model=f"run/step-{step}", step=step)
        for step in steps for task, metric, v in (("upos", "accuracy", 0.5), ("structural-distance", "uuas", 0.2))
    ]).assign(run_id="RUN1")  # fmt: skip
    table = syntax.format_layer_table(df)
    heads = [l for l in table.splitlines() if l.startswith("==")]
    assert heads == ["== run/step-8", "== UPOS acc by checkpoint and layer", "== UUAS by checkpoint and layer"]
    assert "bertology runs show RUN1" in table
    upos = table.split("== UPOS acc by checkpoint and layer")[1].split("==")[0].strip().splitlines()
    assert upos[0].split()[-2:] == ["0", "1"] and [l.split()[0] for l in upos[1:]] == [f"run/step-{s}" for s in steps]
    assert upos[3].split()[1:] == ["0.520", "0.620"]  # step 2
    uuas = table.split("== UUAS by checkpoint and layer")[1].strip().splitlines()
    assert uuas[5].split()[1:] == ["0.280", "0.380"]  # step 8

