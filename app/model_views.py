"""The numbers behind the model explorer, without Streamlit: attention maps of one sentence, how
each word's vector moves across layers, and the logit lens (top-k predictions at every layer).

Attention needs eager attention (`ModelHandle.load(..., attentions=True)`; sdpa returns none).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from workbench.errors import ConfigError
from workbench.lm_scores import layer_head, lm_kind, mlm_head
from workbench.models import ModelHandle


def load(path) -> ModelHandle:
    return ModelHandle.load(path, attentions=True)


def words_of(sentence: str) -> list[str]:
    words = sentence.split()
    if not words:
        raise ConfigError("type a sentence (words separated by spaces)")
    return words


@dataclass
class Attention:
    tokens: list[str]
    maps: np.ndarray  # [layers, heads, T, T], rows = from-token, columns = to-token


@torch.no_grad()
def attention(handle: ModelHandle, words: list[str], stack: str | None = None) -> Attention:
    """Token-level self-attention of every layer and head for one sentence (special tokens kept)."""
    stack = stack or handle.stacks[0]
    out = handle.forward([words], stack=stack, attentions=True, truncate=True)
    att = out.attentions[stack] if out.attentions else None
    if not att or att[0] is None:
        raise ConfigError(f"{handle.path}: the {stack} of this model returns no attention weights "
                          f"(no self-attention, e.g. ELMo's LSTMs)")
    ids = out.decoder_input_ids[0] if stack == "decoder" and "encoder" in handle.stacks else out.batch.input_ids[0]
    keep = int(out.batch.attention_mask[0].sum()) if ids is out.batch.input_ids[0] else len(ids)
    tokens = handle.tokenizer.convert_ids_to_tokens(ids[:keep].tolist())
    maps = torch.stack([a[0, :, :keep, :keep] for a in att]).float().cpu().numpy()
    return Attention([str(t) for t in tokens], maps)


def _cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    na = np.linalg.norm(a, axis=-1)
    nb = np.linalg.norm(b, axis=-1)
    return (a * b).sum(-1) / np.maximum(na * nb, 1e-12)


@dataclass
class LayerView:
    words: list[str]
    to_previous: pd.DataFrame  # words x layers 1..L: cos(h_l(w), h_{l-1}(w))
    across_layers: np.ndarray  # [L+1, L+1] mean over words of cos(h_i(w), h_j(w))
    nearest_word: pd.DataFrame  # words x layers 0..L: the most similar other word of the sentence


def layer_view(handle: ModelHandle, words: list[str], pooling: str = "first") -> LayerView:
    """How each word's vector (first subword by default) changes with depth: similarity to the
    previous layer, the mean layer x layer similarity, and each word's nearest other word per layer
    (contextual mixing: Ethayarajh 2019 measures the same drift with self-similarity)."""
    vecs = next(iter(handle.word_states([words], pooling=pooling)))  # [L+1, n, H]
    L1, n, _ = vecs.shape
    to_prev = _cos(vecs[1:], vecs[:-1]).T  # [n, L]
    across = np.array([[float(_cos(vecs[i], vecs[j]).mean()) for j in range(L1)] for i in range(L1)])
    nearest = {}
    for layer in range(L1):
        v = vecs[layer] / np.maximum(np.linalg.norm(vecs[layer], axis=-1, keepdims=True), 1e-12)
        sim = v @ v.T
        np.fill_diagonal(sim, -np.inf)
        nearest[layer] = [words[j] if n > 1 else "" for j in sim.argmax(1)]
    return LayerView(words,
                     pd.DataFrame(to_prev, index=words, columns=[str(layer) for layer in range(1, L1)]),
                     across, pd.DataFrame(nearest, index=words))


def has_lens(handle: ModelHandle) -> str | None:
    """Why the logit lens cannot run on this model, or None when it can."""
    kind = lm_kind(handle.model)
    if kind not in ("mlm", "causal"):
        return f"{handle.path}: {type(handle.model).__name__} has no masked-LM or causal-LM head; the logit lens needs one"
    if not handle.head_trained:
        return (f"{handle.path}: the checkpoint has no LM-head weights (a bare model body, as sentence-embedding "
                f"models ship); the logit lens needs a trained head")
    if kind == "mlm" and mlm_head(handle.model) is None:
        return f"{handle.path}: the logit lens knows no head of {type(handle.model).__name__}"
    return None


@torch.no_grad()
def logit_lens(handle: ModelHandle, words: list[str], position: int, k: int = 5) -> pd.DataFrame:
    """Top-k predictions for word `position` at every layer, through the model's own output head
    (nostalgebraist 2020's logit lens): masked LMs predict the masked word from each layer's state
    at the mask (head = the MLM transform + decoder); causal LMs predict the word at `position` from
    the words before it (final layer norm, then the unembedding; the last layer's state is already
    normalised). Columns: layer, rank, token, prob."""
    why = has_lens(handle)
    if why:
        raise ConfigError(why)
    if not 0 <= position < len(words):
        raise ConfigError(f"word position {position} outside the sentence of {len(words)} words")
    model, tok = handle.model, handle.tokenizer
    kind = lm_kind(model)
    if kind == "mlm":
        text = " ".join(tok.mask_token if i == position else w for i, w in enumerate(words))
        enc = tok(text, return_tensors="pt").to(handle.device)
        at = (enc["input_ids"][0] == tok.mask_token_id).nonzero()[0, 0]
        hs = model.base_model(**enc, output_hidden_states=True, return_dict=True).hidden_states
        head = layer_head(model, "mlm")
        logits = [head(h[0, at], i == len(hs) - 1) for i, h in enumerate(hs)]
    else:
        if position == 0:
            raise ConfigError("a causal LM predicts a word from the words before it: choose a later word")
        enc = tok(" ".join(words[:position]), return_tensors="pt").to(handle.device)
        hs = model.base_model(**enc, output_hidden_states=True, return_dict=True).hidden_states
        head = layer_head(model, "causal")
        logits = [head(h[0, -1], i == len(hs) - 1) for i, h in enumerate(hs)]
    rows = []
    for layer, lg in enumerate(logits):
        p = torch.softmax(lg.float(), -1)
        top = torch.topk(p, k)
        for rank, (pi, ti) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
            rows.append({"layer": layer, "rank": rank, "token": tok.convert_ids_to_tokens(ti), "prob": pi})
    return pd.DataFrame(rows)
