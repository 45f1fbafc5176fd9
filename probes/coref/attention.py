"""Document context and word-level attention, for coreference across sentences.

Document windows. A document (a GUM text, a GAP snippet) is one long word sequence; the model
reads it in windows of its own length, half a window apart, and every word is read from the
window where it is most central (causal stacks: where it has most left context) — the same plan
`ModelHandle.word_states` follows for hidden states (`workbench.running.word_alignment.plan_windows` and
`choose_windows`), so a word's attention row and its hidden state come from the same window.
`document_windows` also says how much left context each word had there.

Word-level attention (Clark et al. 2019, "What does BERT look at?", sec. 2): attention TO a word
split into several pieces is the SUM over its pieces, attention FROM it the MEAN over its pieces.
Two views of a row:
- Clark et al.'s (`keep_special=True`): [CLS], [SEP] (<s>, </s>) stay tokens of their own, nothing
  is renormalised; a head that attends most to [SEP] (as many do, their sec. 3) picks no word.
- the lenient view (default): special tokens (and padding) are dropped and each row is renormalised
  over the words of its window, so every row is a distribution over words.

Coreference heads (Clark et al. 2019, sec. 4.3): for each layer x head, how often the head word of a
coreferent mention attends most to the head word of one of its antecedents (their criterion, on
their rows: the headline), and how often to any word of an antecedent (lenient: rows without
special tokens); GAP: whether the pronoun gives more attention to the right name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch

from workbench.errors import ConfigError
from workbench.running.word_alignment import choose_windows, plan_windows


# --------------------------------------------------------------------------- document windows


@dataclass
class DocWindows:
    """How one document is read: windows of whole words and each word's home window."""

    ranges: np.ndarray  # int64 [K, 2]: words [w0, w1) held whole by window k
    home: np.ndarray  # int64 [n_words]: the window each word is read from
    left_context: np.ndarray  # int64 [n_words]: words before it inside its home window
    cut: np.ndarray  # bool [n_words]: no window holds all of the word's pieces


def document_windows(handle, words: Sequence[str], stack: str | None = None, stride: int | None = None) -> DocWindows:
    """The window plan of `handle.word_states` for one document (one 'sentence' of many words)."""
    stack = stack or handle.stacks[0]
    enc = handle._encode([list(words)], count=False)[0]  # the handle's own word -> token spans
    n = len(words)
    if n == 0:
        z = np.zeros(0, dtype=np.int64)
        return DocWindows(np.zeros((0, 2), dtype=np.int64), z, z, z.astype(bool))
    cap = handle.capacity
    starts = plan_windows(len(enc.ids), cap, stride or max(1, cap // 2))
    home, cut = choose_windows(enc.first, enc.last, starts, cap, stack == "decoder")
    ranges = np.array([[np.searchsorted(enc.first, s, side="left"),
                        np.searchsorted(enc.last, s + cap - 1, side="right")] for s in starts], dtype=np.int64)
    left = np.arange(n) - ranges[home, 0]
    return DocWindows(ranges, home.astype(np.int64), np.maximum(left, 0), cut)


def left_context_counts(plans: Sequence[DocWindows], thresholds: Sequence[int] = (16, 64, 128)) -> dict[str, int]:
    """How many words saw fewer than N words of left context, for each N; and how many of those
    had more words before them in the document than they saw (context lost to windowing)."""
    out: dict[str, int] = {"words": int(sum(len(p.home) for p in plans)),
                           "windowed_documents": int(sum(len(p.ranges) > 1 for p in plans)),
                           "words_cut_by_window": int(sum(p.cut.sum() for p in plans))}
    for t in thresholds:
        out[f"left_context_lt_{t}"] = int(sum((p.left_context < t).sum() for p in plans))
        out[f"left_context_lt_{t}_by_window"] = int(sum(((p.left_context < t) & (np.arange(len(p.home)) >= t)).sum()
                                                        for p in plans))
    return out


# --------------------------------------------------------------------------- word-level attention


def word_attention(att: torch.Tensor, word_ids: torch.Tensor, n_words: int) -> torch.Tensor:
    """Token attention [B, heads, T, T] -> word attention [B, heads, n_words, n_words].

    `word_ids[b, t]` is the word of token t (-1: special or padding). TO a word: sum over its pieces;
    special tokens dropped and rows renormalised; FROM a word: mean over its pieces. A word with no
    piece of its own has an all-zero row and column.
    """
    B, _, T, _ = att.shape
    onehot = torch.zeros(B, T, n_words, dtype=att.dtype, device=att.device)
    valid = word_ids >= 0
    b_idx, t_idx = valid.nonzero(as_tuple=True)
    onehot[b_idx, t_idx, word_ids[b_idx, t_idx]] = 1.0
    to_words = torch.einsum("bhts,bsn->bhtn", att, onehot)
    to_words = to_words / to_words.sum(-1, keepdim=True).clamp_min(1e-12)
    pieces = onehot.sum(1)  # [B, n]
    from_words = torch.einsum("btm,bhtn->bhmn", onehot, to_words)
    return from_words / pieces.clamp_min(1)[:, None, :, None]


def word_attention_rows(att: torch.Tensor, word_ids: torch.Tensor, n_words: int, queries: torch.Tensor,
                        keep_special: bool = False) -> torch.Tensor:
    """The rows of `word_attention(att[None], word_ids[None], n_words)[0]` for the query words only:
    att [heads, T, T] of one sequence -> [heads, n_queries, n_words]. Only the query words' pieces
    are converted, so a long window costs O(pieces x T), not O(T x T x n_words).

    `keep_special=True` gives Clark et al.'s rows instead, [heads, n_queries, n_words + 1]: the
    attention to each word (summed over its pieces, averaged over the query's pieces) NOT
    renormalised, and in the last column the largest attention any one special token gets (each
    special token is a word of its own in their matrix; for an argmax only the largest matters)."""
    valid = word_ids >= 0
    onehot = torch.zeros(att.shape[-1], n_words, dtype=att.dtype, device=att.device)
    t_idx = valid.nonzero(as_tuple=True)[0]
    onehot[t_idx, word_ids[t_idx]] = 1.0
    special = (~valid).nonzero(as_tuple=True)[0]  # padding gets ~0 attention: harmless in a max
    out = torch.zeros(att.shape[0], len(queries), n_words + int(keep_special), dtype=att.dtype, device=att.device)
    for k, q in enumerate(queries.tolist()):
        rows = (word_ids == q).nonzero(as_tuple=True)[0]
        if len(rows) == 0:
            continue
        piece_rows = att[:, rows, :]  # [heads, pieces, T]
        to_words = piece_rows @ onehot  # [heads, pieces, n]
        if keep_special:
            out[:, k, :n_words] = to_words.mean(1)
            if len(special):
                out[:, k, n_words] = piece_rows[:, :, special].mean(1).amax(-1)
        else:
            to_words = to_words / to_words.sum(-1, keepdim=True).clamp_min(1e-12)
            out[:, k] = to_words.mean(1)
    return out


@dataclass
class _Segment:
    doc: int
    w0: int
    w1: int
    queries: np.ndarray  # positions (into the doc's query list)


def attention_rows(handle, docs: Sequence[Sequence[str]], queries: Sequence[Sequence[int]], stack: str | None = None,
                   batch_size: int = 4, stride: int | None = None, progress: bool = False,
                   stats: dict | None = None, clark_rows: bool = False) -> Iterator[tuple[np.ndarray, ...]]:
    """For each document, the word-level attention rows of its query words, every layer and head.

    Yields (rows [n_queries, L, heads, n_doc_words] float32, ranges [n_queries, 2]) per document in
    order: row q is read from the home window of word queries[q] (zeros outside that window, whose
    words are ranges[q]). Only windows that hold a query's home are run. With `clark_rows` a third
    item, Clark et al.'s rows of the same forward pass [n_queries, L, heads, n_doc_words + 1]
    (special tokens kept, their largest share in the last column; `word_attention_rows`).
    `stats` (a dict) gets windows run, words in them and seconds spent in the forward passes and
    conversion.
    """
    stack = stack or handle.stacks[0]
    if stack not in handle.stacks:
        raise ConfigError(f"stack {stack!r} not in this model's stacks {handle.stacks}")
    bar = None
    if progress:
        from workbench.progress import progress as progress_bar

        bar = progress_bar(total=len(docs), desc="attention", unit="doc")
    chunk = max(1, batch_size * 4)
    for c0 in range(0, len(docs), chunk):
        ids = range(c0, min(len(docs), c0 + chunk))
        plans = {i: document_windows(handle, docs[i], stack, stride) for i in ids}
        segments: list[_Segment] = []
        results: dict[int, tuple] = {}
        for i in ids:
            q = np.asarray(queries[i], dtype=np.int64)
            if len(q) and (q.min() < 0 or q.max() >= len(docs[i])):
                raise ConfigError(f"document {i}: query word outside 0..{len(docs[i]) - 1}")
            home = plans[i].home[q] if len(q) else q
            results[i] = (None, plans[i].ranges[home] if len(q) else np.zeros((0, 2), dtype=np.int64), None)
            for k in np.unique(home):
                w0, w1 = plans[i].ranges[k]
                segments.append(_Segment(i, int(w0), int(w1), np.flatnonzero(home == k)))
        segments.sort(key=lambda s: -(s.w1 - s.w0))
        for b0 in range(0, len(segments), batch_size):
            batch = segments[b0: b0 + batch_size]
            t0 = time.perf_counter()
            out = handle.forward([list(docs[s.doc][s.w0: s.w1]) for s in batch], stack=stack, attentions=True)
            layers = out.attentions[stack]
            wids = out.word_ids[stack]
            for b, s in enumerate(batch):
                rows, ranges, clark = results[s.doc]
                if rows is None:
                    shape = (len(queries[s.doc]), len(layers), layers[0].shape[1], len(docs[s.doc]))
                    rows = np.zeros(shape, dtype=np.float32)
                    clark = np.zeros(shape[:-1] + (shape[-1] + 1,), dtype=np.float32) if clark_rows else None
                    results[s.doc] = (rows, ranges, clark)
                local = np.asarray(queries[s.doc], dtype=np.int64)[s.queries] - s.w0
                n = s.w1 - s.w0
                local_t = torch.as_tensor(local, device=layers[0].device)
                block = torch.stack([word_attention_rows(a[b].float(), wids[b], n, local_t) for a in layers])
                rows[s.queries, :, :, s.w0: s.w1] = block.permute(2, 0, 1, 3).cpu().numpy()  # [q, L, heads, n]
                if clark_rows:
                    block = torch.stack([word_attention_rows(a[b].float(), wids[b], n, local_t, keep_special=True)
                                         for a in layers]).permute(2, 0, 1, 3).cpu().numpy()
                    clark[s.queries, :, :, s.w0: s.w1] = block[..., :n]
                    clark[s.queries, :, :, -1] = block[..., n]
            if stats is not None:
                stats["windows"] = stats.get("windows", 0) + len(batch)
                stats["window_words"] = stats.get("window_words", 0) + sum(s.w1 - s.w0 for s in batch)
                stats["seconds"] = stats.get("seconds", 0.0) + time.perf_counter() - t0
        for i in ids:
            rows, ranges, clark = results[i]
            if rows is None:  # no queries in this document
                L = handle.num_layers[stack]
                rows = np.zeros((0, L, _num_heads(handle), len(docs[i])), dtype=np.float32)
                clark = np.zeros((0, L, _num_heads(handle), len(docs[i]) + 1), dtype=np.float32)
            yield (rows, ranges, clark) if clark_rows else (rows, ranges)
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()


def _num_heads(handle) -> int:
    cfg = handle.config
    for key in ("num_attention_heads", "n_head", "num_heads", "encoder_attention_heads"):
        if getattr(cfg, key, None):
            return int(getattr(cfg, key))
    return 1


# --------------------------------------------------------------------------- coreference heads


@dataclass
class HeadScores:
    """Per evaluated item: which (layer, head) got it right, plus the rule baselines on the same items."""

    correct: np.ndarray  # bool [N, L, heads]: GUM lenient (any antecedent word, rows without special tokens); GAP
    strict: np.ndarray | None  # bool [N, L, heads], GUM: Clark et al.'s (antecedent HEAD word, special tokens kept)
    group: np.ndarray  # item group (mention type for GUM, gender for GAP) [N]
    unit: np.ndarray  # resampling unit (document / example) [N]
    baselines: dict[str, np.ndarray]  # name -> bool [N]
    counts: dict[str, int]
    head_word: np.ndarray | None = None  # bool [N, L, heads], GUM: antecedent head word, special tokens dropped


def gum_head_scores(handle, docs, stack: str | None = None, batch_size: int = 4, progress: bool = False,
                    stats: dict | None = None) -> HeadScores:
    """Clark et al. (2019) antecedent selection for every layer x head on GUM documents
    (`probes.coref.items.Document`). An item is a mention with an earlier mention of its chain
    whose words lie in the window the mention's head word is read from (the others are counted as
    `out_of_window` and left out). Three criteria on the same forward pass:
    - `strict` (Clark et al. 2019, sec. 4.3: antecedent selection accuracy, "what percent of the
      time does the head word of a coreferent mention most attend to the head of one of that
      mention's antecedents"): the argmax of the head word's row with [CLS]/[SEP] kept
      (`word_attention_rows(keep_special=True)`) is the head word of one of its antecedents; a head
      that attends most to a special token (or to the word itself) is wrong. (Their coreference
      code was not released; their dependency evaluation, sec. 4.2, ignores [CLS]/[SEP] when taking
      the argmax, which is `head_word` here.)
    - `head_word`: the same on the row without special tokens, renormalised;
    - `correct` (lenient): the argmax of the row without special tokens is any word of an antecedent."""
    from probes.coref.items import anaphoric_mentions, rule_antecedents

    words = [d.words for d in docs]
    ana = [anaphoric_mentions(d) for d in docs]
    queries = [[d.mentions[i].head for i in a] for d, a in zip(docs, ana)]
    correct, strict, head_word, group, unit = [], [], [], [], []
    base: dict[str, list] = {"nearest_mention": [], "head_match": []}
    counts = {"anaphoric_mentions": 0, "out_of_window": 0}
    for di, (rows, ranges, clark) in enumerate(attention_rows(handle, words, queries, stack, batch_size,
                                                              progress=progress, stats=stats, clark_rows=True)):
        d = docs[di]
        rules = rule_antecedents(d)
        antecedents = d.antecedents
        if len(rows) == 0:
            continue
        best = rows.argmax(-1)  # [q, L, heads]
        best_clark = clark.argmax(-1)  # the last column (a special token) is no word of the document
        for q, i in enumerate(ana[di]):
            counts["anaphoric_mentions"] += 1
            w0, w1 = ranges[q]
            spans = [d.mentions[j] for j in antecedents[i]]
            if not any(m.start >= w0 and m.end < w1 for m in spans):
                counts["out_of_window"] += 1
                continue
            ante_words = np.zeros(len(d.words), dtype=bool)
            ante_heads = np.zeros(len(d.words) + 1, dtype=bool)  # + the special-token column
            for m in spans:
                ante_words[m.start: m.end + 1] = True
                ante_heads[m.head] = True
            correct.append(ante_words[best[q]])
            strict.append(ante_heads[best_clark[q]])
            head_word.append(ante_heads[best[q]])
            group.append(d.mentions[i].mtype)
            unit.append(di)
            for name in base:
                base[name].append(rules[name][q])
    L, H = handle.num_layers[stack or handle.stacks[0]], _num_heads(handle)
    stack_ = lambda v: np.stack(v) if v else np.zeros((0, L, H), dtype=bool)  # noqa: E731
    counts["evaluated"] = len(correct)
    return HeadScores(stack_(correct), stack_(strict), np.asarray(group, dtype=object), np.asarray(unit, dtype=np.int64),
                      {k: np.asarray(v, dtype=bool) for k, v in base.items()}, counts, stack_(head_word))


def gap_head_scores(handle, frame, stack: str | None = None, batch_size: int = 8, progress: bool = False,
                    stats: dict | None = None) -> HeadScores:
    """GAP (Webster et al. 2018) by attention: for examples whose pronoun refers to A or B, does the
    pronoun give more attention (summed over the name's words) to the right one? Ties count as wrong.
    Baselines on the same examples: nearest name and the subject-name rule (`probes.coref.items`)."""
    from probes.coref.items import gap_nearest_name, gap_subject_name
    from probes.coref.gap_scorer import pronoun_gender

    ex = [r for r in frame.itertuples() if r.label in ("A", "B")]
    words = [r.words for r in ex]
    queries = [[r.pronoun_start] for r in ex]
    correct, group = [], []
    for r, (rows, _) in zip(ex, attention_rows(handle, words, queries, stack, batch_size, progress=progress,
                                               stats=stats)):
        to_a = rows[0, :, :, r.a_start: r.a_end + 1].sum(-1)
        to_b = rows[0, :, :, r.b_start: r.b_end + 1].sum(-1)
        correct.append((to_a > to_b) if r.label == "A" else (to_b > to_a))
        group.append(pronoun_gender(r.pronoun))
    L, H = handle.num_layers[stack or handle.stacks[0]], _num_heads(handle)
    return HeadScores(
        np.stack(correct) if correct else np.zeros((0, L, H), dtype=bool), None, np.asarray(group, dtype=object),
        np.arange(len(ex), dtype=np.int64),
        {"nearest_name": np.array([gap_nearest_name(r) == r.label for r in ex], dtype=bool),
         "subject_name": np.array([gap_subject_name(r) == r.label for r in ex], dtype=bool)},
        {"examples": len(frame), "evaluated": len(ex), "neither_left_out": len(frame) - len(ex)},
    )  # fmt: skip
