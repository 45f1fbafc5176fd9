"""DistilBERT (Sanh et al. 2019) as a checkpoint format: a BERT-architecture student saved as
`DistilBertForMaskedLM`, so that it opens in plain transformers as the model DistilBERT is.

The workbench trains such a student as a BERT of fewer layers (the family `bert`'s training module
under the distillation loss, `workbench.distill_pretraining`) and converts the result here:
DistilBERT is BERT's block without token-type embeddings, pooler or NSP head, so the conversion
is a renaming plus one fold: BERT adds the token-type-0 embedding to every position of a
single-segment input, and DistilBERT has no such table, so that vector is added to every row of
the position embeddings. For inputs of one segment (token_type_ids all 0, as DistilBERT reads
them) the converted model computes the same logits as the BERT it came from (tests check it).
Reading a DistilBERT checkpoint (`ModelHandle`, `finetune` pooling "first") goes through the
`distilbert` entries of `workbench.models.FAMILY_OF_MODEL_TYPE` and `workbench.finetune.FAMILY_POOLINGS`.
"""

from __future__ import annotations

import torch

from workbench.errors import ConfigError

# BERT block names -> DistilBERT block names (inside layer i)
_BLOCK = {
    "attention.self.query": "attention.q_lin",
    "attention.self.key": "attention.k_lin",
    "attention.self.value": "attention.v_lin",
    "attention.output.dense": "attention.out_lin",
    "attention.output.LayerNorm": "sa_layer_norm",
    "intermediate.dense": "ffn.lin1",
    "output.dense": "ffn.lin2",
    "output.LayerNorm": "output_layer_norm",
}


def distilbert_config(bert_config):
    """The `DistilBertConfig` of a BERT config (same widths, depth, activation, positions)."""
    from transformers import DistilBertConfig

    if getattr(bert_config, "model_type", "") != "bert":
        raise ConfigError(f"distilbert: converts BERT models only, got model_type {bert_config.model_type!r}")
    if getattr(bert_config, "position_embedding_type", "absolute") not in (None, "absolute"):
        raise ConfigError("distilbert: the BERT must use absolute position embeddings")
    if abs(float(getattr(bert_config, "layer_norm_eps", 1e-12)) - 1e-12) > 1e-15:
        raise ConfigError(f"distilbert: DistilBERT's LayerNorm eps is 1e-12, the BERT's is {bert_config.layer_norm_eps}")
    return DistilBertConfig(
        vocab_size=bert_config.vocab_size, max_position_embeddings=bert_config.max_position_embeddings,
        sinusoidal_pos_embds=False, n_layers=bert_config.num_hidden_layers, n_heads=bert_config.num_attention_heads,
        dim=bert_config.hidden_size, hidden_dim=bert_config.intermediate_size, dropout=bert_config.hidden_dropout_prob,
        attention_dropout=bert_config.attention_probs_dropout_prob, activation=bert_config.hidden_act,
        pad_token_id=bert_config.pad_token_id, tie_word_embeddings=True)


def bert_to_distilbert(bert) -> torch.nn.Module:
    """A `DistilBertForMaskedLM` computing what `bert` (a `BertForMaskedLM` or `BertForPreTraining`)
    computes on one-segment inputs (module docstring). Every DistilBERT tensor is set (strict)."""
    from transformers import DistilBertForMaskedLM

    sd = bert.state_dict()
    with torch.random.fork_rng(devices=[]):  # every drawn weight is overwritten
        out = DistilBertForMaskedLM(distilbert_config(bert.config))
    new = {
        "distilbert.embeddings.word_embeddings.weight": sd["bert.embeddings.word_embeddings.weight"],
        "distilbert.embeddings.position_embeddings.weight": sd["bert.embeddings.position_embeddings.weight"]
        + sd["bert.embeddings.token_type_embeddings.weight"][0],
        "distilbert.embeddings.LayerNorm.weight": sd["bert.embeddings.LayerNorm.weight"],
        "distilbert.embeddings.LayerNorm.bias": sd["bert.embeddings.LayerNorm.bias"],
        "vocab_transform.weight": sd["cls.predictions.transform.dense.weight"],
        "vocab_transform.bias": sd["cls.predictions.transform.dense.bias"],
        "vocab_layer_norm.weight": sd["cls.predictions.transform.LayerNorm.weight"],
        "vocab_layer_norm.bias": sd["cls.predictions.transform.LayerNorm.bias"],
        "vocab_projector.weight": sd["bert.embeddings.word_embeddings.weight"],
        "vocab_projector.bias": sd.get("cls.predictions.bias", sd.get("cls.predictions.decoder.bias")),
    }
    for i in range(bert.config.num_hidden_layers):
        for src, dst in _BLOCK.items():
            for p in ("weight", "bias"):
                new[f"distilbert.transformer.layer.{i}.{dst}.{p}"] = sd[f"bert.encoder.layer.{i}.{src}.{p}"]
    out.load_state_dict({k: v.detach().clone() for k, v in new.items()}, strict=True)
    return out.eval()
