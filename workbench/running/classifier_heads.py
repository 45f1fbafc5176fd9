"""Classification heads that transformers' Auto classes lack, as plain `PreTrainedModel`s.

`workbench.drivers.finetune` uses transformers' own `*ForSequenceClassification` / `*ForTokenClassification`
classes wherever the family has one (BERT/RoBERTa/ALBERT/ELECTRA: the first token; GPT-2: the last
non-pad token; T5/BART: the decoder state at the final `</s>`). This module adds the rest:

- `ElmoForSequenceClassification` / `ElmoForTokenClassification`: a task-specific scalar mix of
  all L+1 biLM layers (Peters et al. 2018, eq. 1) feeding a linear layer; sentences are the mean of
  the mixed vectors over their tokens (special tokens included). Unlike the paper, the biLM is
  fine-tuned along with the mix (the paper froze it); `freeze_body` in the fine-tuning config
  restores the paper's setting.
- `T5EncoderMeanForSequenceClassification`, `BartEncoderMeanForSequenceClassification`: the mean
  of the encoder's last layer over the non-pad tokens, then dropout and a linear layer (the
  encoder-only reading of an encoder-decoder, as sentence encoders such as Sentence-T5 do; Ni et
  al. 2022). `BartEncoderForTokenClassification`: a linear layer on each encoder state
  (transformers has no BART token classifier).

ELMo's heads are registered with `AutoModelForSequenceClassification` / `AutoModelForTokenClassification`
when this module is imported, so after `import workbench.running.classifier_heads` those Auto classes open an ELMo
classifier. The T5/BART encoder heads cannot be registered there (the config type already maps
to transformers' decoder-based classes); `workbench.running.classifier_loading.load_classifier`
opens them through `config.architectures`.

Every head returns a `SequenceClassifierOutput` / `TokenClassifierOutput` with the cross-entropy
loss when `labels` are given (label -100 = ignored, the transformers convention).
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn
from transformers import (
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from transformers.modeling_outputs import (
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.models.bart.modeling_bart import BartModel, BartPreTrainedModel
from transformers.models.t5.modeling_t5 import T5EncoderModel, T5PreTrainedModel

from workbench.families.elmo_modules import (
    ElmoConfig,
    ElmoModel,
    ElmoPreTrainedModel,
    ScalarMix,
)


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `states` [B, T, H] over the positions where `mask` [B, T] is 1."""
    m = mask.to(states.dtype).unsqueeze(-1)
    return (states * m).sum(1) / m.sum(1).clamp(min=1.0)


def _loss(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
    if labels is None:
        return None
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1),
                                       ignore_index=-100)


class ElmoForSequenceClassification(ElmoPreTrainedModel):
    """ELMo -> scalar mix of all layers -> mean over tokens -> dropout -> linear (see module doc)."""

    _keys_to_ignore_on_load_unexpected: ClassVar[list[str]] = [r"^softmax\."]

    def __init__(self, config: ElmoConfig):
        super().__init__(config)
        self.elmo = ElmoModel(config)
        self.mix = ScalarMix(config.num_hidden_layers + 1)
        self.dropout = nn.Dropout(config.dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def _mixed(self, input_ids, attention_mask):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.elmo.elmo_vectors(input_ids, attention_mask, self.mix), attention_mask

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=None, **kwargs):
        mixed, attention_mask = self._mixed(input_ids, attention_mask)
        logits = self.classifier(self.dropout(masked_mean(mixed, attention_mask)))
        return SequenceClassifierOutput(loss=_loss(logits, labels), logits=logits)


class ElmoForTokenClassification(ElmoForSequenceClassification):
    """ELMo -> scalar mix of all layers -> dropout -> linear, at every token."""

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=None, **kwargs):
        mixed, _ = self._mixed(input_ids, attention_mask)
        logits = self.classifier(self.dropout(mixed))
        return TokenClassifierOutput(loss=_loss(logits, labels), logits=logits)


class T5EncoderMeanForSequenceClassification(T5PreTrainedModel):
    """T5 encoder -> mean over non-pad tokens -> dropout -> linear."""

    base_model_prefix = "transformer"
    _keys_to_ignore_on_load_unexpected: ClassVar[list[str]] = [r"^decoder\.", r"^lm_head\."]

    def __init__(self, config):
        super().__init__(config)
        self.transformer = T5EncoderModel(config)
        self.dropout = nn.Dropout(config.dropout_rate)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        states = self.transformer(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.classifier(self.dropout(masked_mean(states, attention_mask)))
        return SequenceClassifierOutput(loss=_loss(logits, labels), logits=logits)


class BartEncoderMeanForSequenceClassification(BartPreTrainedModel):
    """BART encoder -> mean over non-pad tokens -> dropout -> linear (the decoder is kept, unused,
    so that the checkpoint holds the whole pretrained model)."""

    def __init__(self, config):
        super().__init__(config)
        self.model = BartModel(config)
        self.dropout = nn.Dropout(config.classifier_dropout)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    def _encode(self, input_ids, attention_mask):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        return self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state, attention_mask

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=None, **kwargs):
        states, attention_mask = self._encode(input_ids, attention_mask)
        logits = self.classifier(self.dropout(masked_mean(states, attention_mask)))
        return SequenceClassifierOutput(loss=_loss(logits, labels), logits=logits)


class BartEncoderForTokenClassification(BartEncoderMeanForSequenceClassification):
    """BART encoder -> dropout -> linear, at every token."""

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=None, **kwargs):
        states, _ = self._encode(input_ids, attention_mask)
        logits = self.classifier(self.dropout(states))
        return TokenClassifierOutput(loss=_loss(logits, labels), logits=logits)


_MADE: dict[str, type] = {}  # encoder-mean heads made so far, by class name (one class per name)


def encoder_mean_head(name: str, pretrained_cls, prefix: str, body_cls):
    """`<Family>EncoderMeanForSequenceClassification` for a BERT-like encoder: the mean of the last
    layer over non-pad tokens instead of the [CLS] token. An alternative where [CLS] carries
    little (a model pretrained without a sentence-level objective, or stuck at the unigram
    plateau, gives nearly the same [CLS] vector for every sentence) and the pooling
    sentence-transformers models such as all-MiniLM-L6-v2 were trained with (Reimers & Gurevych 2019).

    A family names it in its `FamilySpec.classifier_heads` under "encoder_mean"; made once per name."""
    if name in _MADE:
        return _MADE[name]

    def __init__(self, config):
        pretrained_cls.__init__(self, config)
        setattr(self, prefix, body_cls(config))
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids, attention_mask=None, labels=None, return_dict=None, **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        states = getattr(self, prefix)(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.classifier(self.dropout(masked_mean(states, attention_mask)))
        return SequenceClassifierOutput(loss=_loss(logits, labels), logits=logits)

    cls = type(name, (pretrained_cls,), {"__init__": __init__, "forward": forward, "base_model_prefix": prefix,
                                         "__doc__": encoder_mean_head.__doc__, "__module__": __name__})
    _MADE[name] = cls
    return cls


def head_class(entry) -> type:
    """The class a `FamilySpec.classifier_heads` entry names: a `HeadClass` imported, an
    `EncoderMeanHead` made (`encoder_mean_head`)."""
    import importlib

    from workbench.families.base import EncoderMeanHead

    module = importlib.import_module(entry.module)
    if isinstance(entry, EncoderMeanHead):
        return encoder_mean_head(entry.name, getattr(module, entry.pretrained), entry.prefix,
                                 getattr(module, entry.body))
    return getattr(module, entry.name)


def head_classes() -> dict[str, type]:
    """Class name (as saved in config.architectures) -> class, of every head a family names in its
    `FamilySpec.classifier_heads`, for `workbench.running.classifier_loading.load_classifier`."""
    from workbench.families import available_families, get_family

    heads = {cls.__name__: cls for cls in (ElmoForSequenceClassification, ElmoForTokenClassification,
                                           BartEncoderForTokenClassification)}
    for name in available_families():
        for entry in get_family(name).classifier_heads.values():
            cls = head_class(entry)
            heads[cls.__name__] = cls
    return heads


AutoModelForSequenceClassification.register(ElmoConfig, ElmoForSequenceClassification, exist_ok=True)
AutoModelForTokenClassification.register(ElmoConfig, ElmoForTokenClassification, exist_ok=True)
