"""The seven transformer families of `workbench/families/` (BERT, RoBERTa, SpanBERT, ALBERT,
ELECTRA, T5, BART): a tiny run of each on real text lowers the held-out loss and leaves a
checkpoint that plain transformers and `ModelHandle` open; the collators do what the papers say,
checked on batches of real text (inaugural addresses + State of the Union speeches)."""

from __future__ import annotations

import json
import math
import unicodedata

import numpy as np
import pytest
import torch
import transformers

from workbench.errors import ConfigError
from workbench.families import get_family
from workbench.families.bert import word_ids, word_start_table
from workbench.families.roberta import full_sentence_blocks
from workbench.running.models import ModelHandle
from workbench.objectives.mlm import IGNORE_INDEX
from workbench.objectives.seq2seq import t5_reconstruct
from tests.training_helpers import run_tiny_training, tiny_config
from workbench.drivers.train import evaluate_heldout, prepare_data

STEPS = 30
MAX_LEN = 64
FAMILIES = ["bert", "roberta", "spanbert", "albert", "electra", "deberta", "t5", "bart"]
# family -> (main loss term, AutoModel class, the family's pretraining class)
EXPECT = {
    "bert": ("mlm", "BertModel", "BertForPreTraining"),
    "roberta": ("mlm", "RobertaModel", "RobertaForMaskedLM"),
    "spanbert": ("mlm", "BertModel", "BertForMaskedLM"),
    "albert": ("mlm", "AlbertModel", "AlbertForPreTraining"),
    "electra": ("mlm_gen", "ElectraModel", "ElectraForPreTraining"),
    "deberta": ("mlm", "DebertaV2Model", "DebertaV2ForMaskedLM"),
    "t5": ("span_corruption", "T5Model", "T5ForConditionalGeneration"),
    "bart": ("denoise", "BartModel", "BartForConditionalGeneration"),
}
# Real EWT-style sentences for the handle (words, as probes pass them).
SENTENCES = [["The", "President", "spoke", "to", "Congress", "."], ["We", "shall", "not", "fail", "."]]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """One corpus/tokenizer cache and runs root for the module; one thread (the 2 cores are shared)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("BERTOLOGY_CACHE", str(tmp_path_factory.mktemp("cache")))
    mp.setenv("BERTOLOGY_RUNS", str(tmp_path_factory.mktemp("runs")))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    yield tmp_path_factory
    torch.set_num_threads(threads)
    mp.undo()


@pytest.fixture(scope="module")
def runs(env):
    """family -> TinyRun, trained on first use (30 steps, tiny preset, batch 8 x 64 tokens)."""
    done: dict = {}

    def get(name: str):
        if name not in done:
            # checkpoints only at 0 and the end: the test needs before/after, not the log-spaced ones
            done[name] = run_tiny_training(name, STEPS, env.mktemp(name), checkpoints={"log_spaced": False})
        return done[name]

    return get


@pytest.fixture(scope="module")
def data(env):
    """family -> TrainingData (corpus split, the family's tokenizer, tokenised train/held-out)."""
    done: dict = {}

    def get(name: str):
        if name not in done:
            cfg = tiny_config(name, STEPS, env.mktemp(f"cfg-{name}"))
            done[name] = prepare_data(cfg, get_family(name))
        return done[name]

    return get


def collate(name: str, data, examples, seed: int = 0, **objective):
    family = get_family(name)
    collator = family.make_collator({**family.objective, **objective}, data.tokenizer)
    return collator(examples, torch.Generator().manual_seed(seed))


def examples_of(name: str, data, n: int | None = None, seed: int = 0) -> list:
    stream = get_family(name).make_examples(data.train, MAX_LEN, np.random.default_rng(seed))
    out = []
    for ex in stream:
        out.append(ex)
        if n is not None and len(out) == n:
            break
    return out


# ---- every family: tiny run on real text, checkpoint opens ----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_tiny_run_lowers_heldout_loss_and_checkpoint_opens(name, runs):
    run = runs(name)
    term, base_cls, pretraining_cls = EXPECT[name]
    before, after = run.heldout_before, run.heldout_after
    print(f"{name}: held-out loss {before['loss']:.3f} -> {after['loss']:.3f}; "
          f"{term} {before[term]:.3f} -> {after[term]:.3f}")
    assert after["loss"] < before["loss"] - 0.3, (before, after)
    assert after[term] < before[term] - 0.3, (before, after)
    ckpt = run.checkpoint
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["family"] == name and manifest["step"] == STEPS
    vocab = manifest["tokenizer"]["vocab_size"]
    if name != "t5":  # T5 rescales its tied output layer, so its untrained loss is not ln(V)
        assert before[term] == pytest.approx(math.log(vocab), abs=0.25)

    # plain transformers: the bare model and the family's pretraining class, nothing missing
    bare = transformers.AutoModel.from_pretrained(ckpt)
    assert type(bare).__name__ == base_cls
    cls = getattr(transformers, pretraining_cls)
    full, info = cls.from_pretrained(ckpt, output_loading_info=True)
    assert not info["missing_keys"], info["missing_keys"]
    assert type(full).__name__ == pretraining_cls

    # the saved folder holds everything the training module had: reloading it gives the same
    # held-out loss as the loop measured at the last step
    family = get_family(name)
    module = __import__(f"workbench.families.{name}", fromlist=["load_pretrainer"]).load_pretrainer(ckpt)
    # rebuild the data the loop used (cached: only loads)
    td = prepare_data(run.config, family)
    again = evaluate_heldout(module, family, td.heldout, td.tokenizer, run.config, run.config.eval.batches, torch.device("cpu"))
    assert again["loss"] == pytest.approx(after["loss"], rel=1e-4, abs=1e-4)

    # the model handle: L + 1 hidden states per stack, one vector per word
    handle = ModelHandle.load(ckpt)
    assert handle.family == name
    # windows as long as the training sequences (positions past max_len are untrained), unless asked
    assert handle.max_length == MAX_LEN == manifest["config"]["max_len"]
    if name != "elmo":  # (ELMo has no position limit: any window fits)
        assert ModelHandle.load(ckpt, max_length=MAX_LEN // 2).max_length == MAX_LEN // 2
    layers = 2
    expected_stacks = ("encoder", "decoder") if name in ("t5", "bart") else ("encoder",)
    assert handle.stacks == expected_stacks
    assert handle.num_layers == {s: layers for s in expected_stacks}
    for stack in expected_stacks:
        states = list(handle.word_states(SENTENCES, stack=stack))
        assert [s.shape for s in states] == [(layers + 1, len(w), handle.hidden_size) for w in SENTENCES]
        assert all(np.isfinite(s).all() for s in states)


# ---- DeBERTa: BERT's batches, relative positions only ---------------------------------------------


def test_deberta_trains_on_berts_masked_batches_without_nsp(data):
    """The controlled swap: the same examples and masks as BERT's masked LM, no NSP label."""
    d = data("bert")
    examples = examples_of("bert", d, 64)
    bert_batch = get_family("bert").make_collator({"nsp": False}, d.tokenizer)(examples, torch.Generator().manual_seed(3))
    deberta_batch = get_family("deberta").make_collator({}, d.tokenizer)(examples, torch.Generator().manual_seed(3))
    assert sorted(deberta_batch) == ["attention_mask", "input_ids", "labels", "token_type_ids"]
    for key in deberta_batch:
        assert torch.equal(deberta_batch[key], bert_batch[key]), key


@pytest.mark.parametrize("name, shift_invariant", [("deberta", True), ("bert", False)])
def test_deberta_states_depend_on_relative_positions_only(name, shift_invariant, data):
    """Left padding moves every token's absolute position and none of the offsets between tokens:
    DeBERTa's states of the real tokens do not change, BERT's (learned absolute positions) do."""
    d = data("bert")
    torch.manual_seed(0)
    family = get_family(name)
    model = family.build_model(family.model_config("tiny"), d.tokenizer).model.base_model.eval()
    ids = torch.tensor([d.tokenizer.encode("The committee met on Tuesday to discuss the budget .")])
    pad = torch.full((1, 5), d.tokenizer.pad_token_id)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
        shifted = model(input_ids=torch.cat([pad, ids], 1),
                        attention_mask=torch.cat([torch.zeros_like(pad), torch.ones_like(ids)], 1)).last_hidden_state[:, 5:]
    difference = (plain - shifted).abs().max().item()
    assert (difference < 1e-4) == shift_invariant, difference


# ---- BERT: NSP balance, MLM 15% with 80/10/10, static vs dynamic, whole-word ----------------------


def test_bert_nsp_labels_balanced_and_segments_fit(data):
    d = data("bert")
    examples = examples_of("bert", d)
    labels = np.array([ex["label"] for ex in examples])
    n = len(labels)
    assert n > 300
    # random next with probability 1/2 (single-sentence documents are skipped): within 4 sigma
    assert abs(labels.mean() - 0.5) < 4 * math.sqrt(0.25 / n), (labels.mean(), n)
    assert all(ex["a"] and ex["b"] and len(ex["a"]) + len(ex["b"]) <= MAX_LEN - 3 for ex in examples)
    batch = collate("bert", d, examples[:64])
    assert batch["next_sentence_label"].tolist() == labels[:64].tolist()
    assert batch["input_ids"].shape[1] <= MAX_LEN
    # segment ids: 0 for [CLS] a [SEP], 1 for b [SEP]
    first = examples[0]
    assert batch["token_type_ids"][0, : len(first["a"]) + 2].eq(0).all()
    assert batch["token_type_ids"][0, len(first["a"]) + 2 : len(first["a"]) + len(first["b"]) + 3].eq(1).all()


def test_bert_mlm_masks_15_percent_with_80_10_10(data):
    d = data("bert")
    tok = d.tokenizer
    examples = examples_of("bert", d, 256)
    batch = collate("bert", d, examples)
    original = collate("bert", d, examples, mask_prob=0.0, random_prob=0.0)["input_ids"]  # same draw, nothing replaced
    labels, ids = batch["labels"], batch["input_ids"]
    chosen = labels != IGNORE_INDEX
    assert torch.equal(labels[chosen], original[chosen])
    # exactly BERT's budget per sequence: max(1, round(0.15 n)), n = non-special tokens
    n_real = torch.tensor([len(ex["a"]) + len(ex["b"]) for ex in examples])
    assert torch.equal(chosen.sum(1), torch.clamp(torch.floor(0.15 * n_real + 0.5).long(), min=1))
    assert 0.14 < chosen.sum() / n_real.sum() < 0.16
    special = torch.isin(original, torch.tensor(tok.all_special_ids))
    assert not (chosen & special).any()
    masked = (ids == tok.mask_token_id) & chosen
    kept = (ids == original) & chosen
    total = int(chosen.sum())
    assert abs(masked.sum() / total - 0.8) < 0.03
    # unchanged: 10% kept + random draws that hit the original id (1/995 of the other 10%)
    assert abs(kept.sum() / total - 0.1) < 0.025
    assert abs((chosen & ~masked & ~kept).sum() / total - 0.1) < 0.025


@pytest.mark.slow
def test_bert_static_masks_repeat_across_epochs_dynamic_do_not(data):
    d = data("bert")
    epoch0, epoch1 = examples_of("bert", d, seed=0), examples_of("bert", d, seed=1)
    key = lambda ex: (tuple(ex["a"]), tuple(ex["b"]), ex["label"])  # noqa: E731
    # the pairs are fixed (like BERT's pre-generated instances); only their order changes
    assert sorted(map(key, epoch0)) == sorted(map(key, epoch1)) and list(map(key, epoch0)) != list(map(key, epoch1))
    where = {key(ex): i for i, ex in enumerate(epoch1)}
    same = [epoch1[where[key(ex)]] for ex in epoch0[:48]]  # the same 48 pairs as seen in epoch 1
    for masking, expect_equal in (("static", True), ("dynamic", False)):
        b0 = collate("bert", d, epoch0[:48], seed=10, masking=masking)  # epoch 0, step k
        b1 = collate("bert", d, same, seed=99, masking=masking)  # epoch 1, another step
        assert torch.equal(b0["input_ids"], b1["input_ids"]) == expect_equal, masking
        assert torch.equal(b0["labels"], b1["labels"]) == expect_equal, masking
    # static with dupe_factor 3: each sequence cycles through at most 3 masks
    seen = {collate("bert", d, epoch0[:4], seed=s, masking="static", dupe_factor=3)["labels"][0].numpy().tobytes()
            for s in range(30)}
    assert 2 <= len(seen) <= 3


def test_bert_whole_word_masking_masks_every_piece_of_a_word(data):
    d = data("bert")
    tok = d.tokenizer
    examples = examples_of("bert", d, 128)
    batch = collate("bert", d, examples, whole_word=True)
    plain = collate("bert", d, examples, whole_word=False)
    original = collate("bert", d, examples, whole_word=True, mask_prob=0.0, random_prob=0.0)["input_ids"]
    special = torch.isin(original, torch.tensor(tok.all_special_ids)) | (batch["attention_mask"] == 0)
    words = word_ids(original, special, tok)
    continuation = ~word_start_table(tok)[original] & ~special
    assert continuation.float().mean() > 0.05  # the vocabulary is small: many words have ## pieces

    def split_words(labels):
        chosen = labels != IGNORE_INDEX
        split = 0
        for b in range(len(labels)):
            for w in words[b][chosen[b]].unique().tolist():
                in_word = words[b] == w
                split += int(not chosen[b][in_word].all())
        return split

    assert split_words(batch["labels"]) == 0
    assert split_words(plain["labels"]) > 10  # token-level masking does cut words


# ---- RoBERTa: full-sentences packing ---------------------------------------------------------------


def test_roberta_full_sentences_blocks_cross_documents(data):
    d = data("roberta")
    tok, corpus = d.tokenizer, d.train
    budget = MAX_LEN - 2
    blocks = full_sentence_blocks(corpus, budget)
    stream = corpus.stream_with_separators()
    sep = tok.sep_token_id
    # sentence starts/ends in stream positions (document d is shifted by its d separators)
    doc_of = np.repeat(np.arange(corpus.num_documents), np.diff(corpus.document_offsets))
    starts = np.asarray(corpus.sentence_offsets[:-1]) + doc_of
    ends = np.asarray(corpus.sentence_offsets[1:]) + doc_of
    lengths = ends - starts
    # where a block may begin/end: sentence edges, after a separator, or a cut of an overlong sentence
    ok_start = set(starts.tolist())
    ok_end = set(ends.tolist()) | set((ends + 1).tolist())
    for a, n in zip(starts[lengths > budget], lengths[lengths > budget]):
        ok_start.update(range(int(a), int(a + n), budget))
        ok_end.update(range(int(a) + budget, int(a + n), budget))
    assert all(0 < b - a <= budget for a, b in blocks)
    assert all(a in ok_start and b in ok_end for a, b in blocks)
    assert all(stream[a] != sep for a, _ in blocks)  # never begins with a separator
    # contiguous cover of the stream: only separators that did not fit a block are skipped
    covered = sum(b - a for a, b in blocks)
    assert covered <= len(stream) and len(stream) - covered <= corpus.num_documents
    assert sum(sep in stream[a:b - 1] for a, b in blocks) >= 5  # blocks run across documents
    assert covered / len(blocks) > 0.75 * budget  # nearly full
    examples = examples_of("roberta", d)
    assert sorted(map(len, examples)) == sorted(b - a for a, b in blocks)
    batch = collate("roberta", d, examples[:64])
    ids, mask = batch["input_ids"], batch["attention_mask"]
    assert (ids[:, 0] == tok.bos_token_id).all()
    assert (ids[torch.arange(64), mask.sum(1) - 1] == tok.eos_token_id).all()
    n_real = sum(len(ex) - ex.count(sep) for ex in examples[:64])
    assert 0.14 < (batch["labels"] != IGNORE_INDEX).sum() / n_real < 0.16
    # dynamic: a new mask for the same blocks at another step
    assert not torch.equal(batch["labels"], collate("roberta", d, examples[:64], seed=1)["labels"])


# ---- SpanBERT: spans of whole words, SBO boundaries ----------------------------------------------


def test_spanbert_boundaries_point_just_outside_each_span(data):
    d = data("spanbert")
    tok = d.tokenizer
    examples = examples_of("spanbert", d, 64)
    batch = collate("spanbert", d, examples)
    labels, left, right, pos = batch["labels"], batch["left_boundary"], batch["right_boundary"], batch["span_position"]
    chosen = labels != IGNORE_INDEX
    assert torch.equal(chosen, pos >= 0) and torch.equal(chosen, left >= 0) and torch.equal(chosen, right >= 0)
    original = collate("spanbert", d, examples, mask_prob=0.0, random_prob=0.0)["input_ids"]
    starts = word_start_table(tok)
    special_ids = set(tok.all_special_ids)
    n_spans, lengths = 0, []
    for b in range(len(labels)):
        spans = {(int(left[b, i]), int(right[b, i])) for i in chosen[b].nonzero().flatten()}
        for lo, hi in spans:
            inside = torch.arange(lo + 1, hi)
            # every token strictly between the boundaries is masked, belongs to this span, and
            # its relative position counts from the span start
            assert chosen[b, inside].all()
            assert (left[b, inside] == lo).all() and (right[b, inside] == hi).all()
            assert pos[b, inside].tolist() == list(range(len(inside)))
            # the boundary tokens themselves are outside the span
            for edge in (lo, hi):
                assert not chosen[b, edge] or (int(left[b, edge]), int(right[b, edge])) != (lo, hi)
            # whole words: the span starts at a word start and the token after it starts a word
            # (a block cut from the stream may begin inside a word: those pieces count as a word)
            assert starts[original[b, lo + 1]] or int(original[b, lo]) in special_ids
            assert starts[original[b, hi]]
            n_spans += 1
            lengths.append(len(inside))
    assert n_spans > 100
    assert 0.13 < chosen.sum() / (MAX_LEN - 2) / len(examples) < 0.18
    assert np.mean(lengths) > 2.0  # spans, not single tokens (geometric mean 3.8 words)


# ---- ALBERT: shared layers, factorised embeddings, SOP ----------------------------------------------


def test_albert_shares_layers_and_factorises_embeddings(data):
    d = data("albert")
    family = get_family("albert")
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    sizes = {L: count(family.build_model(family.model_config("tiny", {"num_hidden_layers": L}), d.tokenizer))
             for L in (2, 6, 12)}
    assert sizes[2] == sizes[6] == sizes[12]
    # the same model with two layer groups really has more parameters (the check can fail)
    two_groups = family.build_model(family.model_config("tiny", {"num_hidden_layers": 6, "num_hidden_groups": 2}), d.tokenizer)
    assert count(two_groups) > sizes[6]
    model = family.build_model(family.model_config("tiny"), d.tokenizer).model
    assert tuple(model.albert.embeddings.word_embeddings.weight.shape) == (len(d.tokenizer), 32)
    assert model.config.hidden_size == 64 and len(model.albert.encoder.albert_layer_groups) == 1


def test_albert_sop_pairs_balanced_and_ngram_masked(data):
    d = data("albert")
    examples = examples_of("albert", d)
    labels = np.array([ex["label"] for ex in examples])
    assert abs(labels.mean() - 0.5) < 4 * math.sqrt(0.25 / len(labels))
    batch = collate("albert", d, examples[:64])
    assert batch["sentence_order_label"].tolist() == labels[:64].tolist()
    chosen = batch["labels"] != IGNORE_INDEX
    n_real = sum(len(ex["a"]) + len(ex["b"]) for ex in examples[:64])
    assert 0.13 < chosen.sum() / n_real < 0.18
    # n-grams: masked runs longer than one token exist
    runs = (chosen[:, 1:] & chosen[:, :-1]).sum()
    assert runs > 0.2 * chosen.sum()


# ---- ELECTRA: shared embeddings, generator samples, saved discriminator -----------------------------


def test_electra_generator_and_discriminator_share_embeddings(data, runs):
    d = data("electra")
    family = get_family("electra")
    model = family.build_model(family.model_config("tiny"), d.tokenizer)
    disc, gen = model.model.electra.embeddings, model.generator.electra.embeddings
    for name in ("word_embeddings", "position_embeddings", "token_type_embeddings", "LayerNorm"):
        for p_d, p_g in zip(getattr(disc, name).parameters(), getattr(gen, name).parameters()):
            assert p_d is p_g and p_d.data_ptr() == p_g.data_ptr()
    assert model.generator.generator_lm_head.weight.data_ptr() == disc.word_embeddings.weight.data_ptr()
    assert model.generator.config.hidden_size == 16 and model.model.config.hidden_size == 64
    assert model.generator.config.embedding_size == model.model.config.embedding_size == 32
    # one step moves the shared tensor for both
    batch = collate("electra", d, examples_of("electra", d, 8))
    before = disc.word_embeddings.weight.detach().clone()
    model(**batch).loss.backward()
    torch.optim.SGD(model.parameters(), lr=1.0).step()
    assert not torch.equal(before, gen.word_embeddings.weight)
    assert torch.equal(disc.word_embeddings.weight, gen.word_embeddings.weight)

    # the checkpoint: discriminator = main folder, generator beside it with the same embeddings
    ckpt = runs("electra").checkpoint
    disc_saved, info = transformers.ElectraForPreTraining.from_pretrained(ckpt, output_loading_info=True)
    assert not info["missing_keys"]
    gen_saved = transformers.AutoModelForMaskedLM.from_pretrained(ckpt / "generator")
    assert type(gen_saved).__name__ == "ElectraForMaskedLM" and gen_saved.config.hidden_size == 16
    assert torch.equal(gen_saved.electra.embeddings.word_embeddings.weight, disc_saved.electra.embeddings.word_embeddings.weight)
    assert torch.equal(gen_saved.electra.embeddings.position_embeddings.weight,
                       disc_saved.electra.embeddings.position_embeddings.weight)


def test_electra_masks_without_random_replacements_and_labels_replacements(data):
    d = data("electra")
    tok = d.tokenizer
    batch = collate("electra", d, examples_of("electra", d, 32))
    chosen = batch["labels"] != IGNORE_INDEX
    ids, orig = batch["input_ids"], batch["original_ids"]
    # ELECTRA's masking: 85% [MASK], 15% unchanged, never a random token
    assert ((ids[chosen] == tok.mask_token_id) | (ids[chosen] == orig[chosen])).all()
    assert abs((ids[chosen] == tok.mask_token_id).float().mean() - 0.85) < 0.06
    assert torch.equal(ids[~chosen], orig[~chosen])
    family = get_family("electra")
    torch.manual_seed(0)
    model = family.build_model(family.model_config("tiny"), tok)
    out = model(**batch)
    # an untrained generator samples nearly uniformly: almost every masked token gets replaced
    assert 0.9 * chosen.float().mean() < out.loss_terms["replaced_frac"] <= chosen.float().mean() + 1e-6
    assert float(out.loss.detach()) == pytest.approx(float(out.loss_terms["mlm_gen"] + 50 * out.loss_terms["rtd"]), rel=1e-5)


# ---- T5 and BART: batches decode back to the original text ---------------------------------------


def _raw_text(d) -> str:
    return " ".join(doc.text.replace("\n", " ") for doc in d.corpus.documents("train"))


def test_t5_span_corruption_round_trips_to_the_original_text(data):
    d = data("t5")
    tok = d.tokenizer
    examples = examples_of("t5", d, 32)
    batch = collate("t5", d, examples)
    assert batch["input_ids"].shape[1] <= MAX_LEN  # blocks are sized so the corrupted input fits
    assert (batch["attention_mask"].sum(1) >= MAX_LEN - 2).all()  # ... and nearly fills it
    raw = unicodedata.normalize("NFKC", _raw_text(d))
    sentinels = tok.convert_tokens_to_ids([f"<extra_id_{i}>" for i in range(100)])
    checked = 0
    for b, ex in enumerate(examples):
        inp = batch["input_ids"][b][batch["attention_mask"][b].bool()]
        tgt = batch["labels"][b][batch["labels"][b] != IGNORE_INDEX]
        assert inp[-1] == tok.eos_token_id and tgt[-1] == tok.eos_token_id
        back = t5_reconstruct(inp[:-1], tgt[:-1], sentinels)
        assert back.tolist() == ex
        n_noise = len(tgt) - 1 - int(torch.isin(tgt, torch.tensor(sentinels)).sum())
        assert n_noise == int(math.floor(0.15 * len(ex) + 0.5))
        if tok.unk_token_id in ex:
            continue
        # the decoded block is real corpus text (the stream's document separators aside)
        for piece in tok.decode(back.tolist()).split(tok.eos_token):
            piece = piece.strip()
            if piece:
                assert piece in raw, piece
                checked += 1
    assert checked >= 20


def test_bart_noise_keeps_sentences_and_decodes_to_the_original(data):
    d = data("bart")
    tok = d.tokenizer
    examples = examples_of("bart", d, 32)
    raw = _raw_text(d)
    lines = {line for doc in d.corpus.documents("train") for line in doc.text.split("\n")}
    whole = 0
    for ex in examples:
        assert sum(map(len, ex)) <= MAX_LEN - 2
        for sent in ex:
            text = tok.decode(sent).strip()
            assert text in raw
            whole += text in lines
    assert whole >= 10  # most units are whole corpus lines (paragraphs longer than a block are cut)
    batch = collate("bart", d, examples)
    for b, ex in enumerate(examples):
        target = batch["labels"][b][batch["labels"][b] != IGNORE_INDEX].tolist()
        assert target == [tok.bos_token_id, *[t for s in ex for t in s], tok.eos_token_id]
        assert tok.decode(target, skip_special_tokens=True) == tok.decode([t for s in ex for t in s])
        inp = batch["input_ids"][b][batch["attention_mask"][b].bool()][1:-1]
        n_masks = int((inp == tok.mask_token_id).sum())
        n = sum(map(len, ex))
        # one <mask> per span; the spans cover round(0.3 n) tokens
        assert n - (len(inp) - n_masks) == int(math.floor(0.3 * n + 0.5))
    # sentence permutation: chunks of several sentences come back in another order
    multi = [ex for ex in examples_of("bart", d) if len(ex) >= 2][:40]
    assert len(multi) == 40
    no_infill = collate("bart", d, multi, mask_ratio=0.0)
    permuted = 0
    for b in range(len(multi)):
        inp = no_infill["input_ids"][b][no_infill["attention_mask"][b].bool()]
        target = no_infill["labels"][b][no_infill["labels"][b] != IGNORE_INDEX]
        assert sorted(inp.tolist()) == sorted(target.tolist())  # the same tokens ...
        permuted += not torch.equal(inp, target)  # ... in another sentence order
    assert permuted >= 12  # at least half of the orders differ (1/2 for two sentences, 5/6 for three)


@pytest.mark.parametrize("name", FAMILIES)
def test_unknown_objective_setting_is_a_config_error(name):
    family = get_family(name)
    with pytest.raises(ConfigError, match=f"'mask_rate'.*family {name}"):
        family.make_collator({**family.objective, "mask_rate": 0.2, "max_len": MAX_LEN}, None)


@pytest.mark.parametrize("legacy", [True, False])
def test_deberta_pretrainer_loss_is_the_models_own_with_either_head(legacy):
    """The pretrainer's masked-LM loss equals DebertaV2ForMaskedLM's own, with the legacy head and
    with `legacy: false` in the model config (the head that takes the word embeddings)."""

    class Tok:  # what build_model reads of a tokenizer
        pad_token_id = 0

        def __len__(self):
            return 60

    family = get_family("deberta")
    torch.manual_seed(0)
    wrapper = family.build_model(family.model_config("tiny", {"legacy": legacy}), Tok()).eval()
    ids = torch.randint(1, 60, (2, 9))
    labels = torch.full_like(ids, -100)
    labels[:, [2, 5]] = ids[:, [2, 5]]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    with torch.no_grad():
        out = wrapper(**inputs, labels=labels)
        torch.testing.assert_close(out.loss, wrapper.model(**inputs, labels=labels).loss)
