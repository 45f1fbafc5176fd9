"""Fine-tuning runner (workbench.drivers.finetune): splits, learning, exact resume, saved checkpoints, heads.

Tiny random models (2 layers, hidden 32) on small slices of the real sentence sets and EWT.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from scipy import stats

from tests.conftest import tiny_bart, tiny_bert, tiny_gpt2, tiny_t5
from tests.training_helpers import tiny_finetune_config
from workbench.errors import CheckpointError, ConfigError
from workbench.drivers.finetune import (
    TaskData,
    _save_checkpoint,
    build_classifier,
    choose_pooling,
    collate,
    encode,
    load_classifier,
    load_finetune_config,
    load_task,
    members,
    run_finetune,
    split_indices,
    t_interval,
    used_splits,
)
from workbench.running.models import ModelHandle
from workbench.store.results import ResultsStore


def _save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def checkpoints(tokenizers, tmp_path_factory):
    """Saved tiny pretrained models: bert (hidden 64), gpt, t5, bart, elmo."""
    root = tmp_path_factory.mktemp("pretrained")
    out = {
        "bert": _save(tiny_bert(tokenizers["bert"], hidden=64), tokenizers["bert"], root / "bert"),
        "gpt": _save(tiny_gpt2(tokenizers["gpt"]), tokenizers["gpt"], root / "gpt"),
        "t5": _save(tiny_t5(tokenizers["t5"]), tokenizers["t5"], root / "t5"),
        "bart": _save(tiny_bart(tokenizers["bart"]), tokenizers["bart"], root / "bart"),
    }
    from workbench.data.raw import load_labelled
    from workbench.families.elmo import FAMILY, build_model
    from workbench.tokenization import build_tokenizer

    texts = [ex.text for ex in load_labelled("sentence_polarity")[:3000]]
    tok = build_tokenizer("word", FAMILY.special_tokens, texts, 1500, special_roles=FAMILY.special_roles,
                          template=FAMILY.template)
    torch.manual_seed(0)
    out["elmo"] = _save(build_model(FAMILY.model_config("tiny"), tok), tok, root / "elmo")
    return out


def _cfg(checkpoint, out, **kw):
    return tiny_finetune_config(checkpoint, out, **kw)


# ------------------------------------------------------------------------------------ splits

def test_sentence_splits_are_seeded_disjoint_and_cover_the_set():
    cfg = load_finetune_config({"checkpoint": "x", "task": "sentence_polarity"})
    a, b = load_task(cfg), load_task(cfg)
    assert a.splits == b.splits and len(a.ids) == 10662
    idx = {s: set(v) for s, v in a.splits.items()}
    assert not (idx["train"] & idx["dev"]) and not (idx["train"] & idx["test"]) and not (idx["dev"] & idx["test"])
    assert set().union(*idx.values()) == set(range(10662))
    assert len(idx["dev"]) == len(idx["test"]) == 1066
    other = load_task(load_finetune_config({"checkpoint": "x", "task": "sentence_polarity", "split_seed": 1}))
    assert other.splits["test"] != a.splits["test"]
    # both classes in every split, close to the set's balance (5,331 each)
    for v in a.splits.values():
        assert 0.45 < np.mean([a.labels[i] for i in v]) < 0.55
    sub = load_task(load_finetune_config({"checkpoint": "x", "task": "subjectivity"}))
    assert len(sub.ids) == 10000 and sub.label_names == ["subj", "obj"]


def test_upos_uses_the_treebank_splits(upos):
    data = upos
    assert [len(data.splits[s]) for s in ("train", "dev", "test")] == [12544, 2001, 2077]
    assert all(data.ids[i].startswith("en_ewt/dev/") for i in data.splits["dev"])
    assert len(data.label_names) == 17 and "NOUN" in data.label_names


def test_split_indices_cut_a_permutation():
    s = split_indices(100, 3, 0.1, 0.2)
    perm = np.random.default_rng(3).permutation(100).tolist()
    assert s["test"] == perm[:20] and s["dev"] == perm[20:30] and s["train"] == perm[30:]


# ------------------------------------------------------------------------------- learning

def _planted(word="and", n_train=800, n_eval=200):
    """Real sentence_polarity sentences, label = whether `word` occurs (about 46% for "and")."""
    from workbench.data.raw import load_labelled_with_ids

    pairs = load_labelled_with_ids("sentence_polarity")
    words = [ex.text.split() for _, ex in pairs]
    labels = [int(word in w) for w in words]
    sp = split_indices(len(pairs), 0, 0.1, 0.1)
    sp = {"train": sp["train"][:n_train], "dev": sp["dev"][:n_eval], "test": sp["test"][:n_eval]}
    return TaskData("planted_and", "sentence", [i for i, _ in pairs], words, labels, ["without", "with"], sp, [], 0)


@pytest.mark.slow
def test_tiny_bert_learns_a_planted_task_from_real_sentences(checkpoints, tmp_path):
    data = _planted()
    cfg = _cfg(checkpoints["bert"], tmp_path / "run", epochs=4, lr=3e-3, batch_size=32, warmup=0.05, patience=4,
               max_train_examples=None, max_eval_examples=None, baselines=True)
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "store"), data=data)
    rows = res.rows
    acc = rows[(rows.model == "bert") & rows.seed.notna() & (rows.metric == "accuracy")].set_index("split")["value"]
    majority = rows[(rows.model == "majority")].set_index("split")["value"]
    test_y = np.array([data.labels[i] for i in data.splits["test"]])
    train_y = np.array([data.labels[i] for i in data.splits["train"]])
    assert majority["test"] == pytest.approx(np.mean(test_y == np.bincount(train_y).argmax()))
    assert acc["test"] > 0.9 and acc["dev"] > 0.9, acc
    curve = rows[rows.metric == "accuracy_epoch"]
    assert len(curve) == 4 and curve["value"].max() == pytest.approx(acc["dev"]), res.seeds[0].curve
    stored = ResultsStore(tmp_path / "store").read(res.run_id)
    assert set(stored.probe) == {"finetune"} and len(stored) == len(rows)


def test_epoch_train_loss_is_the_python_float_mean_of_the_step_losses(checkpoints, tmp_path, monkeypatch):
    """The runner sums the step losses on the device (no read per step); the curve's train_loss must be
    what summing them as Python floats, step by step, gives: equal, not approximately."""
    import workbench.drivers.finetune as F

    seen = []

    def recording_loss_terms(*args, **kwargs):
        terms = real_loss_terms(*args, **kwargs)
        seen.append(float(terms["loss"].detach()))
        return terms

    real_loss_terms = F.loss_terms
    monkeypatch.setattr(F, "loss_terms", recording_loss_terms)
    cfg = _cfg(checkpoints["bert"], tmp_path / "run", epochs=2, max_train_examples=80, save_every=3)
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "store"))
    curve = res.seeds[0].curve
    per_epoch = len(seen) // 2
    assert len(seen) == 2 * per_epoch and per_epoch > 3  # save_every=3 folds the sums mid-epoch
    for epoch, point in enumerate(curve):
        total = 0.0
        for loss in seen[epoch * per_epoch: (epoch + 1) * per_epoch]:
            total += loss
        assert point["train_loss"] == total / per_epoch


# -------------------------------------------------------------------------------- resume

@pytest.mark.slow
def test_resume_after_interruption_gives_identical_weights(checkpoints, tmp_path):
    kw = {"epochs": 2, "save_every": 3, "keep_epoch_checkpoints": True, "max_train_examples": 80}
    store = ResultsStore(tmp_path / "store")
    full = run_finetune(_cfg(checkpoints["bert"], tmp_path / "full", **kw), store=store)

    def interrupt(step):
        if step == 7:  # mid-epoch 2 (5 steps per epoch); the last saved state is step 6
            raise KeyboardInterrupt

    cfg = _cfg(checkpoints["bert"], tmp_path / "cut", **kw)
    with pytest.raises(KeyboardInterrupt):
        run_finetune(cfg, store=store, on_step=interrupt)
    assert (tmp_path / "cut" / "seed-0" / "resume").is_dir()
    resumed = run_finetune(cfg, store=store)
    for step in ("step-0000005", "step-0000010"):
        a = load_file(tmp_path / "full" / "seed-0" / step / "model.safetensors")
        b = load_file(tmp_path / "cut" / "seed-0" / step / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.seeds[0].curve == full.seeds[0].curve
    assert not (tmp_path / "cut" / "seed-0" / "resume").exists()


def test_a_finished_seed_is_reused_and_another_config_is_refused(checkpoints, tmp_path):
    store = ResultsStore(tmp_path / "store")
    first = run_finetune(_cfg(checkpoints["bert"], tmp_path / "run"), store=store)
    again = run_finetune(_cfg(checkpoints["bert"], tmp_path / "run"), store=store)
    assert again.seeds[0] == first.seeds[0]
    with pytest.raises(ConfigError, match="another config"):
        run_finetune(_cfg(checkpoints["bert"], tmp_path / "run", lr=2e-3), store=store)


def test_members_come_from_the_recorded_split(checkpoints, tmp_path):
    res = run_finetune(_cfg(checkpoints["bert"], tmp_path / "run", max_train_examples=40), store=ResultsStore(tmp_path / "s"))
    mem, non = members(res.seeds[0].checkpoint)
    splits = json.loads((tmp_path / "run" / "splits.json").read_text())["ids"]
    assert mem == splits["train"][:40] and len(mem) == 40
    assert not set(mem) & set(non) and len(mem) + len(non) == 10662
    manifest = ResultsStore(tmp_path / "s").manifest(res.run_id)
    assert manifest["notes"]["splits"]["ids"]["train"] == mem
    assert manifest["notes"]["splits"]["ids"]["test"] == splits["test"][:32]


# ------------------------------------------------------------------------- checkpoints and heads

def _sentences():
    from workbench.data.raw import load_labelled

    return [ex.text.split() for ex in load_labelled("subjectivity")[:6]]


HEADS = [("bert", "auto"), ("bert", "encoder_mean"), ("gpt", "auto"), ("t5", "decoder_last"), ("t5", "encoder_mean"),
         ("bart", "decoder_last"), ("bart", "encoder_mean"), ("elmo", "auto")]


@pytest.mark.parametrize("family,pooling", HEADS)
def test_saved_classifier_opens_and_gives_the_same_logits(checkpoints, tmp_path, family, pooling):
    from transformers import AutoModelForSequenceClassification

    path = checkpoints[family]
    handle = ModelHandle.load(path)
    pooling = choose_pooling(handle.family, "sentence", pooling)
    torch.manual_seed(0)
    model = build_classifier(path, handle.family, "sentence", pooling, ["subj", "obj"], handle.pad_id).eval()
    data = TaskData("t", "sentence", [str(i) for i in range(6)], _sentences(), [0, 1, 0, 1, 0, 1], ["subj", "obj"],
                    {"train": list(range(6))}, [], None)
    enc = encode(handle, data, list(range(6)), 64)
    batch = collate(enc, list(range(6)), handle.pad_id)
    with torch.no_grad():
        logits = model(**batch).logits
        # padding does not change a sentence's logits: the head reads the right token(s)
        alone = model(**collate(enc, [0], handle.pad_id)).logits
    torch.testing.assert_close(alone[0], logits[0], atol=1e-5, rtol=1e-4)
    _save_checkpoint(tmp_path / "ck", model, handle.tokenizer, {"family": handle.family})
    with torch.no_grad():
        reloaded = load_classifier(tmp_path / "ck")(**batch).logits
    torch.testing.assert_close(reloaded, logits, atol=1e-6, rtol=0)
    if pooling != "encoder_mean":  # transformers' own Auto class opens it (ELMo once workbench.running.classifier_heads is imported)
        auto = AutoModelForSequenceClassification.from_pretrained(tmp_path / "ck").eval()
        with torch.no_grad():
            torch.testing.assert_close(auto(**batch).logits, logits, atol=1e-6, rtol=0)
    # a few steps on these six sentences lower the loss: the head is trainable end to end
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = model(**batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]


def test_encoder_mean_is_the_mean_of_encoder_states(checkpoints):
    handle = ModelHandle.load(checkpoints["t5"])
    torch.manual_seed(0)
    model = build_classifier(checkpoints["t5"], "t5", "sentence", "encoder_mean", ["a", "b"], handle.pad_id).eval()
    data = TaskData("t", "sentence", ["0", "1"], _sentences()[:2], [0, 1], ["a", "b"], {}, [], None)
    batch = collate(encode(handle, data, [0, 1], 64), [0, 1], handle.pad_id)
    with torch.no_grad():
        states = model.transformer(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        n = int(batch["attention_mask"][1].sum())
        expect = model.classifier(states[1, :n].mean(0))
        torch.testing.assert_close(model(**batch).logits[1], expect, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def upos():
    return load_task(load_finetune_config({"checkpoint": "x", "task": "upos"}))


@pytest.mark.parametrize("family", ["bert", "gpt", "t5", "bart", "elmo"])
def test_upos_labels_sit_on_first_subwords_and_heads_run(checkpoints, tmp_path, family, upos):
    cfg = _cfg(checkpoints[family], tmp_path / "run", task="upos", max_train_examples=24, max_eval_examples=8)
    data = upos
    handle = ModelHandle.load(checkpoints[family])
    idx = used_splits(data, cfg)["dev"]
    enc = encode(handle, data, idx, 128)
    batch = handle.tokenize_words([data.words[i] for i in idx])
    for b, i in enumerate(idx):
        wid = batch.word_ids[b, : len(enc.ids[b])].numpy()
        first = [int(np.nonzero(wid == w)[0][0]) for w in range(len(data.words[i])) if (wid == w).any()]
        assert np.nonzero(enc.labels[b] != -100)[0].tolist() == first
        assert enc.labels[b][first].tolist() == [data.labels[i][w] for w in range(len(data.words[i])) if (wid == w).any()]
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "store"), data=data)
    n_words = sum(len(data.words[i]) for i in idx) - enc.unlabelled_words
    assert res.seeds[0].dev["n"] == n_words
    assert 0 <= res.seeds[0].test["accuracy"] <= 1


# ---------------------------------------------------------------------------- statistics

def test_t_interval_matches_scipy():
    x = [0.71, 0.74, 0.69]
    mean, lo, hi = t_interval(x)
    ref = stats.t.interval(0.95, len(x) - 1, loc=np.mean(x), scale=stats.sem(x))
    assert mean == pytest.approx(np.mean(x)) and (lo, hi) == pytest.approx(ref)


def test_bow_baseline_matches_a_direct_sklearn_fit():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    from workbench.drivers.finetune import baselines

    cfg = load_finetune_config({"checkpoint": "x", "task": "sentence_polarity", "max_train_examples": 2000})
    data = load_task(cfg)
    sp = used_splits(data, cfg)
    rows = {(r["model"], r["split"]): r for r in baselines(data, sp)}
    C = rows[("bow_logreg", "test")]["extra"]["C"]
    text = lambda s: [" ".join(data.words[i]) for i in sp[s]]
    y = lambda s: [data.labels[i] for i in sp[s]]
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=r"\S+")
    clf = LogisticRegression(C=C, max_iter=2000).fit(vec.fit_transform(text("train")), y("train"))
    assert rows[("bow_logreg", "test")]["value"] == pytest.approx(clf.score(vec.transform(text("test")), y("test")))
    assert rows[("bow_logreg", "test")]["value"] > rows[("majority", "test")]["value"] + 0.1


# ---------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("override,match", [
    ({"task": "sentiment"}, "unknown task"),
    ({"seeds": [0, -1]}, "seeds must be >= 0"),
    ({"lr": 0}, "lr: must be > 0"),
    ({"lr": -1e-3}, "lr: must be > 0"),
    ({"epochs": 0}, "epochs: must be >= 1"),
    ({"pooling": "max"}, "unknown pooling"),
    ({"dev_fraction": 0.7}, "dev_fraction"),
    ({"learning_rate": 1e-3}, "unknown key"),
    ({"seeds": [1, 1]}, "seeds repeat"),
    ({"device": "tpu"}, "device: must be"),
])
def test_bad_config_is_a_config_error(override, match):
    with pytest.raises(ConfigError, match=match):
        load_finetune_config({"checkpoint": "x", **override})


def test_pooling_must_suit_the_family():
    assert choose_pooling("gpt", "sentence", "auto") == "last"
    assert choose_pooling("bart", "sentence", "auto") == "decoder_last"
    assert choose_pooling("bert", "sentence", "encoder_mean") == "encoder_mean"
    with pytest.raises(ConfigError, match="not available for family gpt"):
        choose_pooling("gpt", "sentence", "encoder_mean")


@pytest.mark.parametrize("argv,match", [
    (["--checkpoint", "/no/such/model", "--task", "sentence_polarity"], "does not exist"),
    (["--checkpoint", "x", "--task", "sentiment"], "unknown task"),
    (["--checkpoint", "x", "--seeds", "0,-1"], "seeds must be >= 0"),
    (["--checkpoint", "x", "--seeds", "0,a"], "--seeds: expected an integer"),
    (["--checkpoint", "x", "--lr", "0"], "must be > 0"),
    (["--checkpoint", "x", "--epochs", "two"], "--epochs: expected an integer"),
    ([], "give --checkpoint"),
])
def test_cli_bad_input_is_one_line_and_exit_2(argv, match, capsys):
    from app.cli import main

    assert main(["finetune", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err


def test_missing_checkpoint_is_a_checkpoint_error(tmp_path):
    from workbench.store.checkpoints import single_checkpoint

    with pytest.raises(CheckpointError):
        single_checkpoint(str(tmp_path / "nothing"))


# ------------------------------------------------------------------------- pinned weights

@pytest.mark.parametrize("family,kw", [("bert", {}), ("gpt", {"freeze_body": True, "epochs": 2}),
                                       ("bert", {"task": "upos", "max_train_examples": 24, "max_eval_examples": 8})],
                         ids=["bert", "gpt-frozen-body", "bert-upos"])
@pytest.mark.pins
def test_finetune_keeps_its_pinned_weights(checkpoints, tmp_path, family, kw, upos):
    """A tiny `bertology finetune` run (warm-up, clipping, dropout on; a frozen body; a token task)
    ends with the weights and dev curve recorded before the loops were shared (tests/weight_pins.py)."""
    from tests.weight_pins import check_pin
    from workbench.store.identity import weights_hash

    cfg = _cfg(checkpoints[family], tmp_path / "run", **kw)
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "store"), data=upos if cfg.task == "upos" else None)
    case = f"finetune/{family}/{cfg.task}" + ("/frozen_body" if cfg.freeze_body else "")
    check_pin(f"{case}/checkpoint", weights_hash(res.seeds[0].checkpoint))
    check_pin(f"{case}/curve", json.dumps(res.seeds[0].curve, sort_keys=True))


@pytest.mark.parametrize("family,pooling", [("bert", "auto"), ("bert", "encoder_mean"), ("t5", "encoder_mean")])
def test_a_saved_classifier_folder_rebuilds_with_its_own_head(checkpoints, tmp_path, family, pooling):
    """The compression sweep retrains from a classifier folder holding rewound weights times a mask
    (`workbench.drivers.prune_sweep.Sweep.retrain`): building from that folder must keep every saved
    tensor, the head included, whatever the pooling (encoder_mean once re-initialised its head)."""
    handle = ModelHandle.load(checkpoints[family])
    pooling = choose_pooling(handle.family, "sentence", pooling)
    torch.manual_seed(0)
    model = build_classifier(checkpoints[family], handle.family, "sentence", pooling, ["a", "b"], handle.pad_id)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)  # neither the pretrained body nor any seed's fresh head
    _save_checkpoint(tmp_path / "ck", model, handle.tokenizer, {"family": handle.family})
    torch.manual_seed(0)
    rebuilt = build_classifier(tmp_path / "ck", handle.family, "sentence", pooling, ["a", "b"], handle.pad_id)
    saved, got = model.state_dict(), rebuilt.state_dict()
    assert saved.keys() == got.keys()
    changed = [k for k in saved if not torch.equal(saved[k], got[k])]
    assert changed == []
