"""conlleval span scoring (workbench/conlleval.py), the CoNLL-2002 reader and the NER fine-tuning task.

Every expected number below is scored by hand, including conlleval's edge cases: an I- tag
without its B- opens a chunk, a change of type ends one, B- after I- of the same type starts a new one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.conlleval import chunks, span_f1
from workbench.errors import ConfigError


@pytest.mark.parametrize("tags, expected", [
    (["B-PER", "I-PER", "O", "B-LOC"], [(0, 2, "PER"), (3, 4, "LOC")]),
    (["O", "I-PER", "I-PER", "O"], [(1, 3, "PER")]),                 # I- without B- starts a chunk
    (["I-LOC"], [(0, 1, "LOC")]),                                    # ... also at the sentence start
    (["B-PER", "I-LOC", "I-LOC"], [(0, 1, "PER"), (1, 3, "LOC")]),   # a type change ends the chunk
    (["B-PER", "I-PER", "B-PER"], [(0, 2, "PER"), (2, 3, "PER")]),   # B- always starts a new chunk
    (["B-ORG", "B-ORG", "I-ORG"], [(0, 1, "ORG"), (1, 3, "ORG")]),
    (["I-MISC", "B-MISC"], [(0, 1, "MISC"), (1, 2, "MISC")]),
    (["O", "O"], []),
    (["B-PER", "I-PER"], [(0, 2, "PER")]),                           # the sentence end closes it
])
def test_chunks_follow_conlleval(tags, expected):
    assert chunks(tags) == expected


def test_span_f1_hand_scored():
    gold = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "I-ORG", "O"], ["O", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC", "O"], ["B-ORG", "O", "O"], ["I-MISC", "O"]]
    # gold chunks: PER, LOC, ORG (3); predicted: PER, LOC, ORG(0,1) (wrong end), MISC (4); correct 2
    s = span_f1(gold, pred)
    assert (s.correct, s.predicted, s.gold) == (2, 4, 3)
    assert s.precision == pytest.approx(0.5)
    assert s.recall == pytest.approx(2 / 3)
    assert s.f1 == pytest.approx(4 / 7)          # 2 x 1/2 x 2/3 / (1/2 + 2/3)
    assert s.token_accuracy == pytest.approx(8 / 10)
    assert s.per_type["PER"]["f1"] == 1.0 and s.per_type["LOC"]["f1"] == 1.0
    assert s.per_type["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "correct": 0, "predicted": 1, "gold": 1}
    assert s.per_type["MISC"]["predicted"] == 1 and s.per_type["MISC"]["gold"] == 0 and s.per_type["MISC"]["f1"] == 0.0


def test_span_f1_counts_an_i_start_equal_to_a_b_start():
    # gold opens MISC with I- (as conlleval allows); the prediction with B- is the same chunk
    s = span_f1([["I-MISC", "I-MISC", "O"]], [["B-MISC", "I-MISC", "O"]])
    assert (s.correct, s.precision, s.recall, s.f1) == (1, 1.0, 1.0, 1.0)
    assert s.token_accuracy == pytest.approx(2 / 3)


def test_span_f1_type_change_inside_a_prediction_costs_both():
    # gold: one ORG over 3 tokens; pred: ORG then LOC (a type change ends the chunk): nothing correct
    s = span_f1([["B-ORG", "I-ORG", "I-ORG"]], [["B-ORG", "I-LOC", "I-LOC"]])
    assert (s.correct, s.predicted, s.gold, s.f1) == (0, 2, 1, 0.0)


def test_span_f1_nothing_predicted_is_zero_not_nan():
    s = span_f1([["B-PER"]], [["O"]])
    assert (s.precision, s.recall, s.f1) == (0.0, 0.0, 0.0)


def test_span_f1_refuses_misaligned_input():
    with pytest.raises(ValueError, match="gold sentences"):
        span_f1([["O"]], [])
    with pytest.raises(ValueError, match="tags"):
        span_f1([["O", "O"]], [["O"]])


# ---- the CoNLL-2002 reader ----------------------------------------------------------------------------

def test_conll2002_reader_matches_the_shared_task_sizes():
    """Tjong Kim Sang (2002), Table 1: Spanish train 8,323 sentences / 264,715 tokens, dev 1,915 /
    52,923, test 1,517 / 51,533; Dutch train 15,806 sentences minus its 287 -DOCSTART- lines."""
    from workbench.data.conll2002 import load_conll2002

    sizes = {s: load_conll2002("es", s) for s in ("train", "dev", "test")}
    assert {s: (len(v), sum(len(x.words) for x in v)) for s, v in sizes.items()} == {
        "train": (8323, 264715), "dev": (1915, 52923), "test": (1517, 51533)}
    first = sizes["train"][0]
    assert first.words[:3] == ("Melbourne", "(", "Australia") and first.tags[:3] == ("B-LOC", "O", "B-LOC")
    nl = load_conll2002("nl", "train")
    assert len(nl) == 15806 - 287 and all(s.words[0] != "-DOCSTART-" for s in nl)
    tags = {t for s in sizes["train"] for t in s.tags}
    assert tags == {"O"} | {f"{p}-{t}" for p in "BI" for t in ("PER", "ORG", "LOC", "MISC")}


def test_conll2002_unknown_split_or_language_is_one_clear_error():
    from workbench.data.conll2002 import load_conll2002

    with pytest.raises(ConfigError, match="unknown split 'validation'.*train, dev, test"):
        load_conll2002("es", "validation")
    with pytest.raises(ConfigError, match="unknown language 'de'"):
        load_conll2002("de", "train")


def test_finetune_unknown_task_is_exit_2(capsys, tiny_checkpoint):
    from app.cli import main

    assert main(["finetune", "--checkpoint", str(tiny_checkpoint), "--task", "conll2003_en"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown task 'conll2003_en'" in err[0] and "conll2002_es" in err[0]


# ---- the NER fine-tuning task ---------------------------------------------------------------------------

def test_span_task_loads_bio_labels_and_fixed_splits():
    from workbench.drivers.finetune import load_finetune_config, load_task

    cfg = load_finetune_config({"checkpoint": "x", "task": "conll2002_es"})
    data = load_task(cfg)
    assert data.kind == "token" and data.metric == "span_f1"
    assert {s: len(v) for s, v in data.splits.items()} == {"train": 8323, "dev": 1915, "test": 1517}
    assert sorted(data.splits["train"]) == list(range(8323))  # shuffled train order, same examples
    assert data.ids[data.splits["dev"][0]] == "conll2002_es/dev/0"
    i = data.ids.index("conll2002_es/train/0")
    assert [data.label_names[t] for t in data.labels[i][:3]] == ["B-LOC", "O", "B-LOC"]


@pytest.mark.slow
def test_ner_finetune_reports_conlleval_span_f1_of_its_predictions(tmp_path, tokenizers):
    """A tiny BERT fine-tuned on 48 CoNLL-2002 sentences: the rows' test span F1 equals conlleval
    run by hand over the best checkpoint's first-piece predictions; baselines are span-scored."""
    from tests.conftest import tiny_bert
    from tests.training_helpers import tiny_finetune_config
    from workbench.drivers.finetune import collate, encode, run_finetune
    from workbench.running.classifier_loading import load_classifier
    from workbench.running.models import ModelHandle
    from workbench.store.results import ResultsStore

    ck = tmp_path / "bert"
    tiny_bert(tokenizers["bert"], hidden=64).save_pretrained(ck)
    tokenizers["bert"].save_pretrained(ck)
    cfg = tiny_finetune_config(ck, tmp_path / "run", task="conll2002_es", max_train_examples=48,
                               max_eval_examples=24, lr=3e-3, baselines=True)
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "store"))
    rows = res.rows
    assert set(rows.metric) == {"span_f1", "span_f1_epoch", "train_loss_epoch"}
    reported = rows[(rows.model == "bert") & rows.seed.notna() & (rows.metric == "span_f1") & (rows.split == "test")]
    assert len(reported) == 1

    # conlleval by hand over the saved best model's predictions at each word's first piece
    from workbench.drivers.finetune import load_task, used_splits

    data = load_task(cfg)
    test_idx = used_splits(data, cfg)["test"]
    handle = ModelHandle.load(ck)
    enc = encode(handle, data, test_idx, cfg.max_len)
    model = load_classifier(res.seeds[0].checkpoint).eval()
    gold, pred = [], []
    with torch.no_grad():
        for r in range(len(test_idx)):
            b = collate(enc, [r], handle.pad_id)
            p = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits.argmax(-1)[0].numpy()
            keep = enc.labels[r] != -100
            gold.append([data.label_names[t] for t in enc.labels[r][keep]])
            pred.append([data.label_names[t] for t in p[keep]])
    assert float(reported["value"].iloc[0]) == pytest.approx(span_f1(gold, pred).f1, abs=1e-12)

    base = rows[(rows.family == "baseline") & (rows.split == "test")].set_index("model")["value"]
    assert base["majority"] == 0.0  # all O: no chunk predicted
    words = [data.words[i] for i in test_idx]
    gold_words = [[data.label_names[t] for t in data.labels[i]] for i in test_idx]
    train_idx = used_splits(data, cfg)["train"]
    from collections import Counter, defaultdict

    per = defaultdict(Counter)
    for i in train_idx:
        for w, t in zip(data.words[i], data.labels[i]):
            per[w][t] += 1
    o = data.label_names.index("O")
    guess = [[data.label_names[per[w].most_common(1)[0][0]] if w in per else "O" for w in ws] for ws in words]
    assert base["word_majority"] == pytest.approx(span_f1(gold_words, guess).f1)
    assert o == Counter(t for i in train_idx for t in data.labels[i]).most_common(1)[0][0]
    assert np.isfinite(base["word_majority"])
