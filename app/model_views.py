"""The numbers behind the model explorer, without Streamlit: attention maps of one sentence, how
each word's vector moves across layers, and the logit lens (top-k predictions at every layer, for
every family through the one implementation, `workbench.running.logit_lens.blank_topk`).

Attention needs eager attention (`ModelHandle.load(..., attentions=True)`; sdpa returns none).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from workbench.errors import CheckpointError, ConfigError
from workbench.running.lm_scores import is_electra, lm_scorer
from workbench.running.lm_inputs import BLANK
from workbench.running.models import ModelHandle


def load(path) -> ModelHandle:
    return ModelHandle.load(path, attentions=True)


# How a token's text shows in the explorer and the lens tables: whitespace made visible.
SPACE, NEWLINE, TAB = "\u2423", "\u21b5", "\u21e5"  # ␣ ↵ ⇥
TOKEN_NOTE = (f"Tokens as the text they add: {SPACE} is a space before the token (it starts a new word), a piece "
              f"without {SPACE} continues the word before it (WordPiece's ##ing shows as ing); {NEWLINE} a newline; "
              f"special tokens as they are.")


def _visible(text: str) -> str:
    return text.replace(" ", SPACE).replace("\n", NEWLINE).replace("\t", TAB) or "\u2205"  # ∅: adds no text


def readable_tokens(tokenizer, ids) -> list[str]:
    """The text a person reads for each token id, by the tokenizer's own decoding: what the token
    adds after a plain word, so a leading space is kept (byte-level BPE's 'Ġcompany' -> ' company',
    SentencePiece's '▁company' and WordPiece's 'company' -> ' company', WordPiece's '##ing' -> 'ing'),
    whitespace made visible (`SPACE`, `NEWLINE`, `TAB`). Special tokens keep their own string; a
    token whose bytes are part of a character (byte-level BPE splits UTF-8) or that the tokenizer
    cannot decode alone keeps its vocabulary string."""
    ids = [int(i) for i in ids]
    raw = tokenizer.convert_ids_to_tokens(ids)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    try:
        prefix = tokenizer("a", add_special_tokens=False)["input_ids"]
        start = tokenizer.decode(prefix, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except Exception:  # noqa: BLE001 - a tokenizer without decoding (a word list): vocabulary strings
        return [str(t) for t in raw]
    out = []
    for i, token in zip(ids, raw):
        if i in special:
            out.append(str(token))
            continue
        try:
            text = tokenizer.decode(prefix + [i], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except Exception:  # noqa: BLE001
            text = None
        if text is None or not text.startswith(start) or "\ufffd" in text:
            out.append(str(token))
            continue
        out.append(_visible(text[len(start):]))
    return out


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
    tokens = readable_tokens(handle.tokenizer, ids[:keep].tolist())
    maps = torch.stack([a[0, :, :keep, :keep] for a in att]).float().cpu().numpy()
    return Attention(tokens, maps)


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


def lens_scorer(handle: ModelHandle):
    """(the scorer whose head the logit lens applies, None) or (None, why there is none): the same
    head the cloze probe reads (`workbench.running.lm_scores.lm_scorer`: ELECTRA through its generator,
    ELMo through its biLM softmax), refused with the scorer's own reason (a bare model body, an
    ELECTRA without generator/, an ELMo without its softmax)."""
    try:
        return lm_scorer(handle), None
    except (CheckpointError, ConfigError) as e:
        return None, str(e)


def lens_notes(scorer) -> list[str]:
    """What the lens reads for this family, where that is not the stack the other views show."""
    notes = []
    if scorer.kind == "seq2seq":
        notes.append("The lens reads the decoder's layers (0 = its embeddings). The encoder has no logit lens: its "
                     "states never meet the output head; the decoder reads them through cross-attention "
                     "(workbench.running.lm_scores.layer_head).")
    if is_electra(scorer.handle) and scorer.model is not scorer.handle.model:
        notes.append(f"ELECTRA: the lens reads its generator ({type(scorer.model).__name__}, "
                     f"{scorer.model.config.num_hidden_layers} layers, hidden {scorer.model.config.hidden_size}), the "
                     f"masked LM the cloze probe scores with; the discriminator shown in the other tabs has no LM "
                     f"head (its replaced-token head scores whole texts, not a blank).")
    if scorer.kind == "bilm":
        notes.append("ELMo: each layer's forward half read from the left and backward half from the right, both "
                     "through the shared softmax (layer 0: the token encoder's output).")
    return notes


def logit_lens(handle: ModelHandle, words: list[str], position: int, k: int = 5) -> pd.DataFrame:
    """Top-k predictions for word `position` at every layer, through the model's own output head
    (nostalgebraist 2020's logit lens): the word is replaced by a blank and read exactly as the
    cloze probe's live box reads it (`workbench.running.logit_lens.blank_topk`, one implementation for every
    family): masked LMs at the mask; causal LMs the next token after the words before it (the
    words after are unseen); T5 the first piece after the sentinel, BART the token at the mask
    (decoder layers); ELMo forward from the left x backward from the right. Columns: layer, rank,
    token (`readable_tokens`: the text it adds, not the vocabulary string), prob, id, piece (the
    vocabulary string); `attrs["reads"]` says what was read."""
    from workbench.running.logit_lens import blank_topk

    scorer, why = lens_scorer(handle)
    if why:
        raise ConfigError(why)
    if not 0 <= position < len(words):
        raise ConfigError(f"word position {position} outside the sentence of {len(words)} words")
    return readable_lens(scorer, blank_topk(scorer, " ".join(BLANK if i == position else w
                                                             for i, w in enumerate(words)), k))


def readable_lens(scorer, table: pd.DataFrame) -> pd.DataFrame:
    """A `blank_topk` table whose `token` is the text a person reads (`readable_tokens` of `id`
    with the scorer's tokenizer); the vocabulary string moves to `piece`."""
    out = table.assign(piece=table["token"], token=readable_tokens(scorer.handle.tokenizer, table["id"].tolist()))
    out.attrs.update(table.attrs)
    return out


def cannot_generate(handle: ModelHandle) -> str | None:
    """Why this model cannot generate (`workbench.running.generate.generator_head`'s one line), or None."""
    from workbench.running.generate import generator_head

    try:
        generator_head(handle)
        return None
    except ConfigError as e:
        return str(e)


def generations(handle: ModelHandle, prompt: str, strategy: str = "greedy", temperature: float = 1.0,
                top_k: int | None = None, top_p: float | None = None, seed: int = 0, n: int = 1,
                max_new_tokens: int = 30) -> pd.DataFrame:
    """`n` continuations of one prompt (`workbench.running.generate.generate`, one seeded generator for the
    batch): columns sample, prompt, continuation, tokens."""
    from workbench.running.generate import Sampling, generate

    g = generate(handle, [prompt] * n, Sampling(strategy, temperature, top_k, top_p, max_new_tokens, seed))
    return pd.DataFrame({"sample": range(n), "prompt": [prompt] * n, "continuation": g.texts,
                         "tokens": [len(x) for x in g.new_ids]})
