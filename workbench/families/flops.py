"""FLOPs and parameter-count formulas of the model families, the pieces `FamilySpec.flops`,
`FamilySpec.classifier_flops` and `FamilySpec.non_embedding_params` are built from.

A family's spec names its formulas (BERT: `mlm_family_flops`; T5: `t5_flops`,
`seq2seq_classifier_flops(t5_shape)`, `seq2seq_params(t5_shape)`); `workbench.cost` asks the spec
and does the rest (training passes, fine-tuning methods, teachers, energy, lineage). What is
counted: the forward's matmul FLOPs per non-padding input token (`workbench.cost`'s docstring);
N as Kaplan et al. (2020) count it (`workbench.cost.non_embedding_params`).
"""

from __future__ import annotations

from collections.abc import Mapping

def config_value(c: Mapping, *names, default=None):
    for n in names:
        if c.get(n) is not None:
            return c[n]
    if default is not None:
        return default
    raise KeyError(f"model config has none of {names}")


def attention_layer_flops(d: int, f: int, s: int, inner: int | None = None) -> dict:
    """Forward matmul FLOPs per token of one self-attention + feed-forward layer."""
    a = inner or d
    return {"attention_qkv_out": 8 * d * a, "attention_scores_values": 4 * s * a, "ffn": 4 * d * f}


def add_parts(total: dict, part: dict, times: float = 1.0) -> dict:
    for k, v in part.items():
        total[k] = total.get(k, 0) + times * v
    return total


def encoder_body_flops(c: Mapping, s: int) -> tuple[dict, int]:
    """BERT-shaped encoder stack (bert, roberta, spanbert, deberta, albert, electra discriminator,
    and the Hub encoders: MiniLM, MPNet, DistilBERT): (forward FLOPs per token, hidden size)."""
    d = config_value(c, "hidden_size", "dim")
    n = config_value(c, "num_hidden_layers", "n_layers")
    f = config_value(c, "intermediate_size", "hidden_dim", default=4 * d)
    out = add_parts({}, attention_layer_flops(d, f, s), n)
    e = c.get("embedding_size")
    if e and e != d:  # ALBERT / ELECTRA factorised embeddings: E -> H projection
        out["embedding_projection"] = 2 * e * d
    return out, d


def mlm_family_flops(c, vocab, s, objective, *, deberta=False, sbo=False):
    """A masked-LM encoder's pretraining forward (BERT, RoBERTa, ALBERT, DistilBERT; `deberta`: the
    disentangled-attention scores; `sbo`: SpanBERT's span-boundary head)."""
    rate = float((objective or {}).get("mlm_rate", 0.15))
    out, d = encoder_body_flops(c, s)
    if deberta:  # disentangled attention: content-to-position and position-to-content scores
        out["relative_position_scores"] = c["num_hidden_layers"] * 4 * s * d
    e = c.get("embedding_size") or d
    # transform (H -> E) then decoder (E -> V), only at the predicted positions
    out["mlm_head"] = rate * (2 * d * e + 2 * e * vocab)
    if sbo:  # SpanBERT's span-boundary head: MLP 3H -> H -> H, then the decoder, per predicted token
        out["sbo_head"] = rate * (2 * 3 * d * d + 2 * d * d + 2 * d * vocab)
    return out


def electra_flops(c, vocab, s, objective):
    """ELECTRA's generator and discriminator, both on every token."""
    rate = float((objective or {}).get("mlm_rate", 0.15))
    disc, d = encoder_body_flops(c, s)
    e = c.get("embedding_size") or d
    g = {**c, **(c.get("generator") or {})}
    gen, gd = encoder_body_flops({**g, "embedding_size": e}, s)
    out = {f"discriminator_{k}": v for k, v in disc.items()}
    out.update({f"generator_{k}": v for k, v in gen.items()})
    out["generator_mlm_head"] = rate * (2 * gd * e + 2 * e * vocab)
    out["discriminator_head"] = 2 * d * d + 2 * d  # dense H -> H, then H -> 1, every token
    return out


def gpt_flops(c, vocab, s, objective):
    """GPT-2's decoder stack and its LM head on every position."""
    d, n = c["n_embd"], c["n_layer"]
    f = c.get("n_inner") or 4 * d
    out = add_parts({}, attention_layer_flops(d, f, s), n)
    out["lm_head"] = 2 * d * vocab  # every position predicts the next token
    return out


def encoder_decoder_flops(d, f, a, n_enc, n_dec, s, vocab, target_ratio) -> dict:
    """Per ENCODER input token: the encoder, plus the decoder on `target_ratio` target tokens per
    input token (self-attention over the target, cross-attention over the input), the LM head on
    every target token. Cross-attention keys/values are computed once per input token."""
    t = target_ratio * s  # target length
    out = {f"encoder_{k}": v for k, v in add_parts({}, attention_layer_flops(d, f, s, a), n_enc).items()}
    dec = add_parts({}, attention_layer_flops(d, f, t, a), n_dec)
    out.update({f"decoder_{k}": target_ratio * v for k, v in dec.items()})
    out["decoder_cross_attention_q_out"] = target_ratio * n_dec * 4 * d * a
    out["decoder_cross_attention_kv"] = n_dec * 4 * d * a
    out["decoder_cross_attention_scores_values"] = target_ratio * n_dec * 4 * s * a
    out["lm_head"] = target_ratio * 2 * d * vocab
    return out


def t5_flops(c, vocab, s, objective):
    """T5's encoder-decoder under span corruption (Raffel et al. 2020)."""
    o = objective or {}
    density, span = float(o.get("noise_density", 0.15)), float(o.get("mean_span_length", 3.0))
    # span corruption: the target is the corrupted tokens plus one sentinel per span
    ratio = density * (1 + 1 / span)
    d, a = c["d_model"], c["num_heads"] * c["d_kv"]
    return encoder_decoder_flops(d, c["d_ff"], a, c["num_layers"], c.get("num_decoder_layers") or c["num_layers"], s,
                            vocab, ratio)


def bart_flops(c, vocab, s, objective):
    """BART's encoder-decoder under text infilling (Lewis et al. 2020)."""
    # text infilling: the decoder reconstructs the whole original sequence (target ~ input length)
    return encoder_decoder_flops(c["d_model"], c["encoder_ffn_dim"], c["d_model"], c["encoder_layers"],
                            c["decoder_layers"], s, vocab, 1.0)


def elmo_flops(c, vocab, s, objective):
    """Char-CNN (one Conv1d per width over `max_chars` positions), highway (F -> 2F per layer),
    projection F -> P, then per direction and layer an LSTM (4 gates over [input, recurrent]) with
    its projection L -> P (LSTMP when L > P), and the softmax over P for each direction."""
    ce, chars = c["char_embed_dim"], c["max_chars"]
    F = sum(n for _, n in c["char_filters"])
    P, L, n = c["projection_dim"], c["lstm_dim"], c["num_hidden_layers"]
    proj = P if L > P else 0
    r = proj or L
    out = {
        "char_cnn": sum(2 * w * ce * nf * (chars - w + 1) for w, nf in c["char_filters"]),
        "highway": c["num_highway"] * 2 * F * 2 * F,
        "token_projection": 2 * F * P,
        # two directions x n layers; every layer reads P (the token width), recurs over r
        "lstm": 2 * n * (2 * 4 * L * (P + r) + 2 * L * proj),
        "softmax": 2 * 2 * P * vocab,  # one shared softmax, applied to each direction's states
    }
    return out


class UnknownClassifier(KeyError):
    """A classifier kind a family's FLOPs count does not know (T5/BART: not one of
    `SEQ2SEQ_CLASSIFIERS`)."""


def block_params(d: int, f: int, a: int | None = None, cross: bool = False) -> int:
    """Weights of one transformer block (Kaplan et al. 2020, Table 1: 4 d d_attn for Q/K/V/O, 2 d d_ff
    for the feed-forward; biases and LayerNorm left out as there); `cross` adds a cross-attention."""
    a = a or d
    return 4 * d * a * (2 if cross else 1) + 2 * d * f


def encoder_params(c: Mapping) -> int:
    """Kaplan's N of a BERT-shaped encoder stack (the default `FamilySpec.non_embedding_params`)."""
    d = config_value(c, "hidden_size", "dim")
    return config_value(c, "num_hidden_layers", "n_layers") * block_params(d, config_value(c, "intermediate_size", "hidden_dim",
                                                                            default=4 * d))


def electra_params(c: Mapping, classifier: str | None = None) -> int:
    """ELECTRA's N: the discriminator and, when the config has one, the generator."""
    return encoder_params(c) + (encoder_params({**c, **c["generator"]}) if c.get("generator") else 0)


def gpt_params(c: Mapping, classifier: str | None = None) -> int:
    """GPT-2's N: its decoder blocks."""
    return c["n_layer"] * block_params(c["n_embd"], c.get("n_inner") or 4 * c["n_embd"])


def elmo_params(c: Mapping, classifier: str | None = None) -> int:
    """ELMo's N: its LSTM layers, both directions, with their projections."""
    P, L, n = c["projection_dim"], c["lstm_dim"], c["num_hidden_layers"]
    proj = P if L > P else 0
    return 2 * n * (4 * L * (P + (proj or L)) + L * proj)


def seq2seq_params(shape):
    """T5's or BART's N (`shape`: `t5_shape` or `bart_shape`): both stacks, cross-attention
    included, for pretraining and the decoder_last classifier; the encoder alone for the
    encoder-only classifier kinds (`ENCODER_ONLY_CLASSIFIERS`)."""

    def params(c: Mapping, classifier: str | None = None) -> int:
        check_seq2seq_classifier(classifier)
        d, f, a, n_enc, n_dec = shape(c)
        enc = n_enc * block_params(d, f, a)
        return enc if classifier in ENCODER_ONLY_CLASSIFIERS else enc + n_dec * block_params(d, f, a, cross=True)

    return params


# Classifier kinds of an encoder-decoder (its `FamilySpec.poolings`, and token) that run the
# encoder only: the encoder-mean sentence heads and every token head (T5's and BART's token
# classifiers read the encoder states). "decoder_last" (the "auto" choice) runs both stacks.
ENCODER_ONLY_CLASSIFIERS = ("encoder_mean", "token")


SEQ2SEQ_CLASSIFIERS = ("decoder_last",) + ENCODER_ONLY_CLASSIFIERS


def t5_shape(c: Mapping) -> tuple[int, int, int, int, int]:
    """(d_model, FFN width, attention width, encoder layers, decoder layers) of a T5 config."""
    return (c["d_model"], c["d_ff"], c["num_heads"] * c["d_kv"], c["num_layers"],
            c.get("num_decoder_layers") or c["num_layers"])


def bart_shape(c: Mapping) -> tuple[int, int, int, int, int]:
    """(d_model, FFN width, attention width, encoder layers, decoder layers) of a BART config."""
    return c["d_model"], c["encoder_ffn_dim"], c["d_model"], c["encoder_layers"], c["decoder_layers"]


def check_seq2seq_classifier(classifier: str | None) -> None:
    """`UnknownClassifier` unless `classifier` is None or one of `SEQ2SEQ_CLASSIFIERS`."""
    if classifier not in (None, *SEQ2SEQ_CLASSIFIERS):
        raise UnknownClassifier(classifier)


def seq2seq_classifier_flops(shape):
    """A T5/BART `FamilySpec.classifier_flops` (`shape`: `t5_shape` or `bart_shape`): forward FLOPs
    per token of the part of the body that a classifier of kind `classifier` runs (None: the
    family's "auto" kind, decoder_last), and d_model. Not the pretraining count: a classifier has
    no LM head and its decoder does not see a span-corruption target. transformers'
    `T5ForSequenceClassification` / `BartForSequenceClassification` (decoder_last) feed the whole
    input, shifted right, to the decoder: the decoder runs on every input token (target ratio 1,
    self-attention over s, cross-attention over the s inputs). The encoder-mean and token heads
    (`workbench.running.classifier_heads`, transformers' `T5ForTokenClassification`) run the encoder
    alone."""

    def body_flops(c: Mapping, s: int, classifier: str | None) -> tuple[dict, int]:
        check_seq2seq_classifier(classifier)
        d, f, a, n_enc, n_dec = shape(c)
        body = encoder_decoder_flops(d, f, a, n_enc, n_dec, s, 0, 1.0)
        body.pop("lm_head")
        if classifier in ENCODER_ONLY_CLASSIFIERS:
            body = {k: v for k, v in body.items() if k.startswith("encoder_")}
        return body, d

    return body_flops


def gpt_classifier_flops(c: Mapping, s: int, classifier: str | None = None) -> tuple[dict, int]:
    """GPT-2's classifier body (`FamilySpec.classifier_flops`): its blocks, d = n_embd."""
    return gpt_flops(c, 0, s, None), c["n_embd"]


def elmo_classifier_flops(c: Mapping, s: int, classifier: str | None = None) -> tuple[dict, int]:
    """ELMo's classifier body (`FamilySpec.classifier_flops`): its biLM, d = projection_dim."""
    return elmo_flops(c, 0, s, None), c["projection_dim"]
