"""The logit lens (nostalgebraist 2020): a model's own output head read at every layer.

One implementation for every family, used by the cloze probe (`probes/cloze`: lens accuracy per
layer) and by the app's model explorer (the live top-k box). `candidate_scores` scores a
multiple-choice blank at every layer with the same inputs and the same rule as
`LMScorer.score_candidates`, so its last layer reproduces the model's zero-shot scores;
`blank_topk` lists the head's top tokens at one blank, layer by layer. Which head and which norm a
layer goes through is `workbench.running.lm_scores.layer_head`'s business (per family); the encoder of an
encoder-decoder has no lens (its states never meet the head).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch

from workbench.errors import ConfigError
from workbench.running.lm_scores import LMScorer, filled_items, layer_head
from workbench.running.lm_inputs import BLANK


@torch.no_grad()
def candidate_scores(scorer: LMScorer, contexts: Sequence[str], candidates: Sequence[Sequence[str]],
                     batch_size: int = 32, answer_only: bool = False) -> np.ndarray:
    """Candidate scores [L+1, N, K] with the output head applied to every layer (the logit lens;
    `layer_head`: which norm goes in front, per family). `contexts[i]` holds one `<blank>`;
    `candidates[i]` its K choices (the same K for every item).

    Same inputs and the same rule as `LMScorer.score_candidates`, so the last layer reproduces the
    zero-shot scores: masked LMs one mask at a single-piece candidate, PLL for the whole context
    when a candidate has several pieces; causal LMs the filled sentence; T5/BART the decoder's
    layers on the sentinel / infilling target (L = decoder layers); ELMo the forward + backward
    log-likelihood of the filled sentence from layer k's two halves. Layer 0 is the embedding
    output (ELMo: the token encoder's), read by the head as it is. `answer_only`: only the
    candidate's tokens summed, as `LMScorer.score_candidates(..., answer_only=True)`."""
    ctx, cands = list(contexts), [list(c) for c in candidates]
    K = {len(c) for c in cands}
    if len(K) != 1:
        raise ConfigError("logit lens: every item needs the same number of choices")
    K = K.pop()
    run = {"mlm": _lens_mlm, "causal": _lens_causal, "seq2seq": _lens_seq2seq, "bilm": _lens_bilm}
    if scorer.kind not in run:
        raise ConfigError(f"logit lens: no output head for a model of kind {scorer.kind!r}")
    return run[scorer.kind](scorer, ctx, cands, K, batch_size, answer_only)


def _layers(scorer: LMScorer, ids: torch.Tensor, att: torch.Tensor, head: bool = False,
            **kwargs) -> tuple[torch.Tensor, ...]:
    """The L+1 layer states the lens reads (`ActivationCache.layers`: embedding output, each block,
    the last one after the final norm) of the scorer's last stack, through its `ModelRunner`: the
    bodies (`head=False`, masked and causal LMs) or the whole model (seq2seq, ELMo's biLM)."""
    stack = scorer.runner.stacks[-1].name
    run = scorer.runner.run(ids, att, names=scorer.runner.layer_names(stack), head=head, **kwargs)
    return run.cache.layers(stack)


def _lens_mlm(scorer, ctx, cands, K, batch_size, answer_only=False):
    model = scorer.model
    head = layer_head(model, "mlm")
    items = filled_items(ctx, cands)
    filled, scored, _, _ = scorer.mlm_candidate_rows(items, answer_only)
    rows: dict[bytes, int] = {}
    row_ids: list[np.ndarray] = []
    queries = []  # (row, position, target, item, candidate)
    seen: dict[int, int] = {}  # item -> how many of its candidates came before (filled_items' order)
    for (i, *_), ids, positions in zip(items, filled, scored):
        k = seen.get(i, 0)  # the candidate's index within its item
        seen[i] = k + 1
        for p in positions:
            masked = ids.copy()
            masked[p] = scorer.mask_id
            key = masked.tobytes()
            if key not in rows:
                rows[key] = len(row_ids)
                row_ids.append(masked)
            queries.append((rows[key], int(p), int(ids[p]), i, k))
    q = np.array(queries, dtype=np.int64).reshape(-1, 5)
    L = model.config.num_hidden_layers
    out = np.zeros((L + 1, len(ctx), K))
    order = np.argsort(q[:, 0], kind="stable")
    q = q[order]
    starts = np.searchsorted(q[:, 0], np.arange(0, len(row_ids) + batch_size, batch_size))
    for b, r0 in enumerate(range(0, len(row_ids), batch_size)):
        sel = q[starts[b]: starts[b + 1]]
        if not len(sel):
            continue
        ids, att = scorer.pad(row_ids[r0: r0 + batch_size])
        hs = _layers(scorer, ids, att)
        r = torch.as_tensor(sel[:, 0] - r0, device=ids.device)
        p = torch.as_tensor(sel[:, 1], device=ids.device)
        t = torch.as_tensor(sel[:, 2], device=ids.device)
        for layer, h in enumerate(hs):
            lp = torch.log_softmax(head(h[r, p], layer == L).float(), -1).gather(1, t[:, None])[:, 0]
            np.add.at(out[layer], (sel[:, 3], sel[:, 4]), lp.double().cpu().numpy())
    return out


def _answer_keep(att: torch.Tensor, answer, shift: int) -> torch.Tensor:
    """[B, T - shift] float: 1 at each row's answer positions (moved back by `shift`, where the
    log-probs are read one place before the token they score), 0 elsewhere."""
    keep = torch.zeros(att.shape[0], att.shape[1] - shift, device=att.device)
    for b, pos in enumerate(answer):
        keep[b, torch.as_tensor(np.asarray(pos) - shift, device=att.device)] = 1.0
    return keep


def _lens_causal(scorer, ctx, cands, K, batch_size, answer_only=False):
    model = scorer.model
    head = layer_head(model, "causal")
    flat, _, answer = scorer.causal_candidate_rows(filled_items(ctx, cands))
    L = model.config.num_hidden_layers
    out = np.zeros((L + 1, len(flat)))
    for b0 in range(0, len(flat), batch_size):
        ids, att = scorer.pad(flat[b0: b0 + batch_size])
        hs = _layers(scorer, ids, att)
        tgt = ids[:, 1:, None]
        keep = _answer_keep(att, answer[b0: b0 + batch_size], 1) if answer_only else att[:, 1:].float()
        for layer, h in enumerate(hs):
            lp = torch.log_softmax(head(h[:, :-1], layer == L).float(), -1).gather(-1, tgt)[..., 0] * keep
            out[layer, b0: b0 + len(ids)] = lp.sum(1).double().cpu().numpy()
    return out.reshape(L + 1, len(ctx), K)


def _lens_seq2seq(scorer, ctx, cands, K, batch_size, answer_only=False):
    """The decoder's layers: T5 scores the sentinel target's candidate pieces and closing sentinel,
    BART the whole infilled sentence (`LMScorer.seq2seq_candidate_rows`)."""
    model = scorer.model
    head = layer_head(model, "seq2seq")
    src, tgt, first, _, _, answer = scorer.seq2seq_candidate_rows(filled_items(ctx, cands))
    start = scorer.decoder_start_id
    out = None
    for b0 in range(0, len(tgt), batch_size):
        sl = slice(b0, b0 + batch_size)
        s_ids, s_att = scorer.pad(src[sl])
        t_ids, t_att = scorer.pad(tgt[sl])
        d_ids, d_att = scorer.pad([np.concatenate([[start], t[:-1]]).astype(np.int64) for t in tgt[sl]])
        hs = _layers(scorer, s_ids, s_att, head=True, decoder_input_ids=d_ids, decoder_attention_mask=d_att)
        L = len(hs) - 1
        if out is None:
            out = np.zeros((L + 1, len(tgt)))
        pos = torch.arange(t_ids.shape[1], device=t_ids.device)[None]
        keep = (t_att.bool() & (pos >= torch.as_tensor(first[sl], device=t_ids.device)[:, None])).float()
        if answer_only:
            keep = _answer_keep(t_att, answer[sl], 0)
        for layer, h in enumerate(hs):
            lp = torch.log_softmax(head(h, layer == L).float(), -1).gather(-1, t_ids[..., None])[..., 0] * keep
            out[layer, b0: b0 + len(t_ids)] = lp.sum(1).double().cpu().numpy()
    return out.reshape(out.shape[0], len(ctx), K)


def _lens_bilm(scorer, ctx, cands, K, batch_size, answer_only=False):
    """ELMo: per layer, forward log p(w_t | w_<t) + backward log p(w_t | w_>t) of the filled
    sentence (`answer_only`: of the candidate's tokens), the shared softmax on the layer's forward
    and backward halves."""
    model = scorer.model
    head = layer_head(model, "bilm")
    filled = [scorer.encode_filled(*it) for it in filled_items(ctx, cands)]
    rows = [ids for ids, _, _ in filled]
    L = model.config.num_hidden_layers
    out = np.zeros((L + 1, len(rows)))
    for b0 in range(0, len(rows), batch_size):
        ids, att = scorer.pad(rows[b0: b0 + batch_size])
        hs = _layers(scorer, ids, att, head=True)
        keep = att[:, 1:].float()
        if answer_only:  # fwd[:, j] scores token j + 1, bwd[:, j] token j
            answer = [pos for _, _, pos in filled[b0: b0 + batch_size]]
            keep_f, keep_b = _answer_keep(att, answer, 1), _answer_keep(att, answer, 0)[:, :-1]
        for layer, h in enumerate(hs):
            lg = head(h, layer == L).float()  # [B, T, 2, V]
            fwd = torch.log_softmax(lg[:, :-1, 0], -1).gather(-1, ids[:, 1:, None])[..., 0]  # predicts t+1
            bwd = torch.log_softmax(lg[:, 1:, 1], -1).gather(-1, ids[:, :-1, None])[..., 0]  # predicts t-1
            both = fwd * keep_f + bwd * keep_b if answer_only else (fwd + bwd) * keep
            out[layer, b0: b0 + len(ids)] = both.sum(1).double().cpu().numpy()
    return out.reshape(L + 1, len(ctx), K)


PLACEHOLDER = "x"  # stands in the blank where the head reads around it (never seen by the read position)


@torch.no_grad()
def blank_topk(scorer: LMScorer, context: str, k: int = 5) -> pd.DataFrame:
    """Top-k tokens at the one `<blank>` of `context`, at every layer, through the logit lens (the
    app's live cloze box). Per family, the distribution the zero-shot rule reads:
    masked LM: at the mask; causal LM: the next token after the words before the blank (the words
    after it are unseen); T5: the first piece after the sentinel; BART: the token at the mask, the
    decoder having reproduced the sentence up to it; ELMo: the forward LM from the left plus the
    backward LM from the right (log-probs added, renormalised: the product of the two
    distributions). Columns: layer, rank, token, prob; `attrs["reads"]` says what was read."""
    if context.count(BLANK) != 1:
        raise ConfigError(f"the sentence must hold exactly one {BLANK}: {context!r}")
    left, right = context.split(BLANK)
    model, tok, kind = scorer.model, scorer.handle.tokenizer, scorer.kind
    head = layer_head(model, kind)
    if kind in ("mlm", "bilm"):
        ids, _, pos = scorer.encode_filled(0, left, PLACEHOLDER, right)
        p = int(pos[0])
        # the blank is ONE token even where the placeholder splits (byte-level BPE: "Ġ" + "x")
        ids = np.concatenate([ids[: p + 1], ids[int(pos[-1]) + 1:]])
    if kind == "mlm":
        ids[p] = scorer.mask_id
        t_ids, att = scorer.pad([ids])
        hs = _layers(scorer, t_ids, att)
        read_at, reads = p, "the masked-LM distribution at the mask"
    elif kind == "causal":
        enc = tok(left.rstrip(), return_special_tokens_mask=True)
        row = scorer.causal_row(np.asarray(enc["input_ids"], dtype=np.int64),
                                np.asarray(enc["special_tokens_mask"], dtype=bool), "the words before the blank")
        t_ids, att = scorer.pad([row])
        hs = _layers(scorer, t_ids, att)
        read_at, reads = -1, "the next token after the words before the blank"
    elif kind == "seq2seq":
        src, tgt, first, _, method, _ = scorer.seq2seq_candidate_rows([(0, left, PLACEHOLDER, right)])
        at = first[0] if method == "seq2seq-sentinel" else int(scorer.encode_filled(0, left, PLACEHOLDER, right)[2][0])
        dec = np.concatenate([[scorer.decoder_start_id], tgt[0][:at]]).astype(np.int64)
        s_ids, s_att = scorer.pad(src)
        hs = _layers(scorer, s_ids, s_att, head=True, decoder_input_ids=scorer.pad([dec])[0])
        read_at = -1
        reads = ("the decoder's first piece after the sentinel" if method == "seq2seq-sentinel"
                 else "the decoder's token at the mask, the sentence before it given")
    else:  # bilm
        if p == 0 or p == len(ids) - 1:
            raise ConfigError("ELMo's blank needs a token on each side (<S> and </S> count)")
        t_ids, att = scorer.pad([ids])
        hs = _layers(scorer, t_ids, att, head=True)
        logp = []
        for i, h in enumerate(hs):
            lg = head(h[0], i == len(hs) - 1).float()  # [T, 2, V]
            both = torch.log_softmax(lg[p - 1, 0], -1) + torch.log_softmax(lg[p + 1, 1], -1)
            logp.append(torch.log_softmax(both, -1))
        reads = "forward LM from the left x backward LM from the right, renormalised"
    if kind != "bilm":  # one position per layer through the head
        logp = [torch.log_softmax(head(h[0, read_at], i == len(hs) - 1).float(), -1) for i, h in enumerate(hs)]
    out = []
    for layer, lp in enumerate(logp):
        top = torch.topk(lp.exp(), k)
        for rank, (pi, ti) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
            out.append({"layer": layer, "rank": rank, "token": tok.convert_ids_to_tokens(ti), "prob": pi, "id": ti})
    df = pd.DataFrame(out)
    df.attrs["reads"] = reads
    return df
