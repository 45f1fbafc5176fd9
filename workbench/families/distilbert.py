"""DistilBERT (Sanh et al. 2019): a trainable family (`FAMILY`: `DistilBertForMaskedLM`, masked LM
only, no token types, no pooler; presets tiny/small/base of BERT's shapes) and the conversion of a
BERT into it.

`bertology train --family distilbert` trains one from scratch like any family. Pretraining
distillation (`workbench.drivers.distill_pretraining`) trains a BERT teacher's student AS this family: the
student is built here and initialised with `bert_to_distilbert` of the teacher's chosen layers, so
what it saves is a plain `DistilBertForMaskedLM` checkpoint with its manifest, no conversion after.

The conversion: DistilBERT is BERT's block without token-type embeddings, pooler or NSP head, so the conversion
is a renaming plus one fold: BERT adds the token-type-0 embedding to every position of a
single-segment input, and DistilBERT has no such table, so that vector is added to every row of
the position embeddings. For inputs of one segment (token_type_ids all 0, as DistilBERT reads
them) the converted model computes the same logits as the BERT it came from (tests check it).
Reading a DistilBERT checkpoint (`ModelHandle`, `finetune` pooling "first") goes through this
family's `FAMILY` (`hf_model_types`, `poolings`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.families import flops
from workbench.errors import ConfigError
from workbench.families import bert
from workbench.families.base import (FamilySpec, PretrainingOutput, PretrainingWrapper, add_special_tokens,
                                     pad_sequences, truncate_block)
from workbench.objectives.mlm import IGNORE_INDEX
from workbench.running.model_loading import load_weights

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


# ---- the trainable family: a DistilBERT masked LM trained from a config ---------------------------
# (`bertology train --family distilbert`; `workbench.drivers.distill_pretraining` trains BERT teachers'
# students as this family, initialised from the teacher's layers through `bert_to_distilbert`)

SPECIAL_TOKENS = bert.SPECIAL_TOKENS  # the same WordPiece tokenizer as BERT (same cache key, same hash)
OBJECTIVE = {"objective": "mlm", **bert.MLM_DEFAULTS}  # DistilBERT drops NSP: masked LM only

# The presets are BERT's shapes, written with BERT's names, so a BERT's model config (a teacher's)
# carries over; `build_model` renames them to DistilBertConfig's.
PRESETS = {name: dict(shape) for name, shape in bert.BERT_SHAPES.items()}
BERT_NAMES = {"num_hidden_layers": "n_layers", "hidden_size": "dim", "num_attention_heads": "n_heads",
              "intermediate_size": "hidden_dim", "hidden_dropout_prob": "dropout",
              "attention_probs_dropout_prob": "attention_dropout", "hidden_act": "activation"}
NATIVE_KEYS = {"n_layers", "dim", "n_heads", "hidden_dim", "dropout", "attention_dropout", "activation",
               "max_position_embeddings", "initializer_range", "sinusoidal_pos_embds", "qa_dropout",
               "seq_classif_dropout"}


def distilbert_model_config(model_config: dict) -> dict:
    """`DistilBertConfig` keyword arguments of a model config written with BERT's or DistilBERT's
    names. BERT settings DistilBERT has no place for are refused unless they hold the value
    DistilBERT fixes (`type_vocab_size` and `layer_norm_eps` 1e-12, absolute positions), so a typo
    or a BERT that DistilBERT cannot express never trains silently as something else."""
    out, bad = {}, []
    for key, value in model_config.items():
        if key in BERT_NAMES:
            out[BERT_NAMES[key]] = value
        elif key in NATIVE_KEYS:
            out[key] = value
        elif key == "layer_norm_eps" and abs(float(value) - 1e-12) < 1e-15:
            continue
        elif key == "position_embedding_type" and value in (None, "absolute"):
            continue
        elif key == "type_vocab_size":  # no segment embeddings: folded away (bert_to_distilbert)
            continue
        else:
            bad.append(key)
    if bad:
        raise ConfigError(f"model: setting(s) {sorted(bad)} do not exist in DistilBERT (known: "
                          f"{sorted(set(BERT_NAMES) | NATIVE_KEYS)}; layer_norm_eps must be 1e-12)")
    return out


def make_collator(objective: dict, tokenizer):
    """`[CLS] block [SEP]`, padded, masked 80/10/10 (BERT's MLM settings); no token types."""
    opts = bert.mlm_options(bert.objective_options("distilbert", OBJECTIVE, objective))

    def collate(examples: list[list[int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        ids, mask = pad_sequences([add_special_tokens(tokenizer, ex) for ex in examples], tokenizer.pad_token_id)
        masked, labels = bert.apply_mlm(ids, mask, tokenizer, opts, generator)
        return {"input_ids": masked, "attention_mask": mask, "labels": labels}

    return collate


class DistilBertPretrainer(PretrainingWrapper):
    """`DistilBertForMaskedLM`, the loss at the masked positions only (term mlm). Like
    `BertPretrainer` it returns the masked logits and the last hidden states in `extra`, what
    DistilBERT's triple loss reads (`workbench.drivers.distill_pretraining.TripleLoss`)."""

    def __init__(self, model):
        super().__init__(model, term="mlm")

    def mlm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """`DistilBertForMaskedLM`'s head (transform, activation, LayerNorm, projector)."""
        m = self.model
        return m.vocab_projector(m.vocab_layer_norm(m.activation(m.vocab_transform(hidden))))

    def forward(self, input_ids, attention_mask, labels, **_):
        hidden = self.model.distilbert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = bert.masked_lm_logits(self.mlm_head, hidden, labels)
        mlm = F.cross_entropy(logits.float(), labels[labels != IGNORE_INDEX])
        return PretrainingOutput(loss=mlm, loss_terms={"mlm": mlm.detach()},
                                 extra={"logits": logits, "hidden": hidden, "mlm_head": self.mlm_head})


def build_model(model_config: dict, tokenizer) -> DistilBertPretrainer:
    from transformers import DistilBertConfig, DistilBertForMaskedLM

    config = DistilBertConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
                              **distilbert_model_config(model_config))
    return DistilBertPretrainer(DistilBertForMaskedLM(config))


def load_pretrainer(path) -> DistilBertPretrainer:
    """The training module back from a checkpoint folder (to evaluate it or train on)."""
    from transformers import DistilBertForMaskedLM

    return DistilBertPretrainer(load_weights(DistilBertForMaskedLM, path))


FAMILY = FamilySpec(
    name="distilbert",
    tokenizer_kind="wordpiece",
    special_tokens=SPECIAL_TOKENS,
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    truncate_example=truncate_block,
    objective=OBJECTIVE,
    auto_class="AutoModelForMaskedLM",
    hf_model_types=("distilbert",),
    poolings=("first",),
    # no dropout module after DistilBERT's attention projection: the adapter follows it
    adapter_sites=(r"attention\.out_lin$", r"ffn\.dropout$"),
    lora_targets=("q_lin", "v_lin"),
    # BERT's block and MLM head (transform + decoder at the masked positions); no pooler, no NSP
    flops=flops.mlm_family_flops,
    distill_student="distilbert",
    teacher_converters={"bert": bert_to_distilbert},
    description="DistilBERT: BERT's block without token types or pooler, masked LM only over contiguous "
                "WordPiece blocks (Sanh et al. 2019); the student of pretraining distillation",
)
