"""Word-level attention (Clark et al. 2019) and coreference heads: rows are distributions over words,
the conversion matches a hand computation, document windows give every word a home, and a planted
head that attends from each anaphor to its antecedent is found as the best head."""

import numpy as np
import pytest
import torch

from probes.coref.attention import (attention_rows, document_windows, gap_head_scores, gum_head_scores,
                              left_context_counts, word_attention, word_attention_rows)
from probes.coref.items import Document, gum_documents
from workbench.data.conllu import load_treebank, read_gum_coref
from workbench.data.gap import read_gap
from workbench.running.models import ModelHandle
from workbench.paths import data_path

PLANT = (1, 1)  # (layer index into attentions, head): attends to the antecedent's head word
PLANT_NON_HEAD = (1, 0)  # attends to a word of the antecedent that is not its head word
PLANT_CLS = (0, 1)  # 0.6 to [CLS], 0.4 to the antecedent's head word


@pytest.fixture(scope="module")
def bert_tok():
    from tests.conftest import read_ewt_minimal
    from workbench.tokenization import build_tokenizer

    texts = [s.text for s in read_ewt_minimal(data_path("ud", "en_ewt", "en_ewt-ud-train.conllu"))[:4000]]
    return build_tokenizer("wordpiece", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], texts, vocab_size=600)


def _bert(tok, seed=0):
    from tests.conftest import tiny_bert

    model = tiny_bert(tok, seed=seed)
    model.set_attn_implementation("eager")
    return model


@pytest.fixture(scope="module")
def gum_docs():
    """Three GUM dev documents cut to their first 200 words (mentions inside kept)."""
    sents = load_treebank("en_gum", "dev")
    mentions, _ = read_gum_coref(sents)
    out = []
    for d in gum_documents(sents, mentions)[:3]:
        ms = [m for m in d.mentions if m.end < 200]
        out.append(Document(d.doc_id, d.words[:200], [s for s in d.sentence_starts if s <= 200], ms))
    return out


@pytest.mark.slow
def test_word_rows_sum_to_one_and_match_hand_computation(bert_tok):
    handle = ModelHandle(_bert(bert_tok), bert_tok)
    sents = [["Unbelievably", ",", "the", "photosynthesis", "worked", "."], ["Hello", "there"]]
    out = handle.forward(sents, attentions=True)
    wids = out.word_ids["encoder"]
    assert (wids[0] >= 0).sum() > len(sents[0])  # some word is split into pieces
    for att in out.attentions["encoder"]:
        wa = word_attention(att, wids, 6)
        for b, s in enumerate(sents):
            n = len(s)
            assert torch.allclose(wa[b, :, :n, :n].sum(-1), torch.ones(att.shape[1], n), atol=1e-5)
            assert torch.all(wa[b, :, n:, :] == 0) and torch.all(wa[b, :, :, n:] == 0)
        # by hand for sentence 0, head 0: to-word sums over pieces, rows renormalised without
        # [CLS]/[SEP], from-word mean over pieces
        a = att[0, 0].numpy().astype(np.float64)
        w = wids[0].numpy()
        keep = np.flatnonzero(w >= 0)
        to = np.stack([a[:, w == j].sum(1) for j in range(6)], 1)[keep]
        to /= to.sum(1, keepdims=True)
        ref = np.stack([to[w[keep] == i].mean(0) for i in range(6)])
        assert np.allclose(wa[0, 0, :6, :6].numpy(), ref, atol=1e-6)
        # the query-only conversion gives the same rows
        q = torch.tensor([3, 0, 3])
        rows = word_attention_rows(att[0], wids[0], 6, q)
        assert torch.allclose(rows, wa[0][:, q, :6], atol=1e-6)
        # Clark et al.'s rows: special tokens kept as words of their own, nothing renormalised; the
        # last column is the largest attention one special token gets
        clark = word_attention_rows(att[0], wids[0], 6, q, keep_special=True)
        raw = np.stack([a[:, w == j].sum(1) for j in range(6)], 1)  # [T, 6]
        special = np.flatnonzero(w < 0)
        for k, word in enumerate(q.tolist()):
            pieces = w == word
            np.testing.assert_allclose(clark[0, k, :6].numpy(), raw[pieces].mean(0), atol=1e-6)
            assert clark[0, k, 6].item() == pytest.approx(a[np.ix_(pieces, special)].mean(0).max(), abs=1e-6)
            assert clark[0, k].sum().item() <= 1 + 1e-5  # other special tokens and padding take the rest


def test_document_windows_give_every_word_a_home(bert_tok, gum_docs):
    handle = ModelHandle(_bert(bert_tok), bert_tok, max_length=40)
    words = gum_docs[0].words
    plan = document_windows(handle, words)
    assert len(plan.ranges) > 3
    w = np.arange(len(words))
    lo, hi = plan.ranges[plan.home, 0], plan.ranges[plan.home, 1]
    assert np.all((lo <= w) & (w < hi)) and not plan.cut.any()
    assert np.array_equal(plan.left_context, w - lo)
    # windows overlap, and a word far into the document keeps some left context
    assert np.all(plan.ranges[1:, 0] < plan.ranges[:-1, 1])
    assert plan.left_context[60:].min() > 0
    counts = left_context_counts([plan], thresholds=(5,))
    assert counts["words"] == len(words) and counts["left_context_lt_5"] == int((plan.left_context < 5).sum())
    assert counts["left_context_lt_5_by_window"] == int(((plan.left_context < 5) & (w >= 5)).sum()) > 0
    # one window per word-list when the document fits
    big = ModelHandle(_bert(bert_tok), bert_tok)
    short = document_windows(big, words[:30])
    assert short.ranges.tolist() == [[0, 30]] and short.left_context.tolist() == list(range(30))


class PlantedHandle(ModelHandle):
    """A tiny random BERT with planted heads. From every piece of each anaphor's head word: head
    PLANT attends to the first piece of the head word of its nearest antecedent in the same window;
    head PLANT_NON_HEAD to a non-head word of its nearest multi-word antecedent in the window (to
    the anaphor itself when there is none); head PLANT_CLS 0.6 to [CLS] and 0.4 to what PLANT
    attends to. `planted_non_head` counts the anaphors that got a non-head target."""

    docs: list = []

    def forward(self, sentences, stack=None, attentions=False, truncate=False):
        out = super().forward(sentences, stack=stack, attentions=attentions, truncate=truncate)
        if not attentions:
            return out
        layers = [a.clone() for a in out.attentions["encoder"]]
        out.attentions["encoder"] = tuple(layers)
        wids = out.word_ids["encoder"]
        for b, words in enumerate(sentences):
            for d in self.docs:
                offs = [o for o in range(len(d.words) - len(words) + 1) if d.words[o: o + len(words)] == list(words)]
                if not offs:
                    continue
                o, n = offs[0], len(words)
                for i, ante in enumerate(d.antecedents):
                    inside = [j for j in ante if o <= d.mentions[j].head < o + n]
                    if not inside or not o <= d.mentions[i].head < o + n:
                        continue
                    first_piece = lambda word: (wids[b] == word - o).nonzero().flatten()[0]  # noqa: E731
                    src = (wids[b] == d.mentions[i].head - o).nonzero().flatten()
                    dst = first_piece(d.mentions[inside[-1]].head)
                    multi = [d.mentions[j] for j in ante if o <= d.mentions[j].start and d.mentions[j].end < o + n
                             and d.mentions[j].end > d.mentions[j].start]
                    non_head = (first_piece(next(w for w in range(multi[-1].start, multi[-1].end + 1)
                                                 if w != multi[-1].head)) if multi else src[0])
                    for (layer, head), targets in ((PLANT, {dst: 1.0}), (PLANT_NON_HEAD, {non_head: 1.0}),
                                                   (PLANT_CLS, {0: 0.6, dst: 0.4})):
                        layers[layer][b, head, src] = 0.0
                        for t, v in targets.items():
                            layers[layer][b, head, src, t] = v
                break
        return out


def test_planted_coreference_head_is_found(bert_tok, gum_docs):
    PlantedHandle.docs = gum_docs
    handle = PlantedHandle(_bert(bert_tok), bert_tok, max_length=64)
    stats = {}
    s = gum_head_scores(handle, gum_docs, batch_size=3, stats=stats)
    assert s.counts["evaluated"] >= 30 and s.counts["out_of_window"] > 0  # windows are short
    acc = s.strict.mean(0)  # [L, heads]: Clark et al.'s criterion
    lenient = s.correct.mean(0)
    assert np.unravel_index(acc.argmax(), acc.shape) == PLANT
    assert acc[PLANT] > 0.95
    assert lenient[PLANT] >= acc[PLANT]  # an antecedent's head word is a word of it
    # a head on non-head words of the antecedent: credited only by the lenient criterion
    assert acc[PLANT_NON_HEAD] < 0.05
    assert lenient[PLANT_NON_HEAD] > 0.3 and lenient[PLANT_NON_HEAD] > acc[PLANT_NON_HEAD] + 0.25
    # a head whose largest share goes to [CLS]: wrong when special tokens stay in the row, right
    # when they are dropped and the row renormalised
    assert acc[PLANT_CLS] < 0.05 and lenient[PLANT_CLS] > 0.95
    # the head-word criterion without special tokens separates the two: it credits the [CLS] head
    # (its word-only row peaks on the antecedent's head word) and not the non-head head
    head_word = s.head_word.mean(0)
    assert head_word[PLANT] > 0.95 and head_word[PLANT_CLS] > 0.95 and head_word[PLANT_NON_HEAD] < 0.05
    assert acc[0, 0] < 0.5  # the untouched random head
    assert set(s.group) <= {"pronoun", "proper", "nominal"} and len(s.unit) == s.counts["evaluated"]
    assert len(s.baselines["nearest_mention"]) == s.counts["evaluated"]
    assert stats["windows"] > len(gum_docs)


def test_gap_attention_rows_on_a_real_snippet(bert_tok):
    handle = ModelHandle(_bert(bert_tok), bert_tok)  # 128 tokens: GAP snippets are windowed
    frame = read_gap("validation").iloc[:6]
    s = gap_head_scores(handle, frame)
    n = int((frame["label"] != "NEITHER").sum())
    assert s.correct.shape == (n, 2, 2) and s.counts["evaluated"] == n
    assert set(s.baselines) == {"nearest_name", "subject_name"}
    (rows, ranges), = list(attention_rows(handle, [frame.iloc[0]["words"]], [[frame.iloc[0]["pronoun_start"]]]))
    assert rows.shape == (1, 2, 2, len(frame.iloc[0]["words"])) and np.allclose(rows.sum(-1), 1, atol=1e-5)
