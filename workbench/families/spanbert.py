"""SpanBERT: span masking + the span boundary objective over BERT's encoder (Joshi et al. 2020).

- Masking (`workbench.objectives.span_mask`): spans of whole words with lengths ~ Geometric(0.2)
  clipped at 10 words, until 15% of the tokens are masked; 80/10/10 decided once per span.
- Span boundary objective (SBO): every masked token x_i of a span (s..e) is also predicted from
  the encoder states of the two tokens just outside the span and a relative-position embedding,
  y_i = f([x_{s-1}; x_{e+1}; p_{i-s+1}]), f a 2-layer feed-forward net with GeLU and LayerNorm;
  y_i goes through the (tied) input-embedding matrix like the MLM head. loss = MLM + SBO.
- No NSP; single contiguous segments of `max_len - 2` tokens (`contiguous_blocks`).

The encoder is a plain `BertForMaskedLM` (so `AutoModel`/`AutoModelForMaskedLM` open the
checkpoint as BERT); the SBO head is saved beside it in `sbo_head/` (`model.safetensors` +
`config.json`) and comes back with `load_pretrainer`. The SBO weight
(1.0, the paper's plain sum) is a model setting (`model: {sbo_weight: ...}`). Deliberate difference:
a relative position beyond the head's `max_span_positions` (a span of very long words) shares the
last position embedding.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch import nn
from transformers import BertForMaskedLM

from workbench.families import flops
from workbench.errors import CheckpointError
from workbench.families.base import (FamilySpec, PretrainingOutput, PretrainingWrapper, add_special_tokens,
                                     EncoderMeanHead, pad_sequences, special_tokens_mask, truncate_block)
from workbench.families.bert import (
    BERT_SHAPES,
    SPECIAL_TOKENS,
    bert_config,
    candidate_ids,
    checkpoint_model_config,
    masked_lm_loss,
    objective_options,
    word_ids,
)
from workbench.objectives.spans import span_mask
from workbench.running.model_loading import load_tensors, load_weights

SBO_DIR = "sbo_head"
MAX_SPAN_POSITIONS = 64

OBJECTIVE = {"objective": "span_mlm+sbo", "mlm_rate": 0.15, "geometric_p": 0.2, "max_span": 10,
             "mask_prob": 0.8, "random_prob": 0.1}


def make_collator(objective: dict, tokenizer):
    opts = objective_options("spanbert", OBJECTIVE, objective)

    def collate(examples: list[list[int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        ids, mask = pad_sequences([add_special_tokens(tokenizer, ex) for ex in examples], tokenizer.pad_token_id)
        special = special_tokens_mask(ids, tokenizer) | (mask == 0)
        out = span_mask(
            ids, special, word_ids=word_ids(ids, special, tokenizer), mask_token_id=tokenizer.mask_token_id,
            vocab_size=len(tokenizer), generator=generator, rate=float(opts["mlm_rate"]),
            geometric_p=float(opts["geometric_p"]), max_span=int(opts["max_span"]),
            mask_prob=float(opts["mask_prob"]), random_prob=float(opts["random_prob"]),
            candidate_ids=candidate_ids(tokenizer),
        )
        return {
            "input_ids": out.input_ids, "attention_mask": mask, "labels": out.labels,
            "left_boundary": out.left_boundary, "right_boundary": out.right_boundary,
            "span_position": out.span_position,
        }

    return collate


class SpanBoundaryHead(nn.Module):
    """SBO head (Joshi et al. 2020, eq. 1-2): [x_{s-1}; x_{e+1}; p_i] -> 2-layer FFN (GeLU,
    LayerNorm) -> y_i; logits = y_i @ E^T + b with E the encoder's (tied) word embeddings."""

    def __init__(self, hidden_size: int, vocab_size: int, max_span_positions: int = MAX_SPAN_POSITIONS,
                 layer_norm_eps: float = 1e-12):
        super().__init__()
        self.config = {"hidden_size": hidden_size, "vocab_size": vocab_size,
                       "max_span_positions": max_span_positions, "layer_norm_eps": layer_norm_eps}
        self.position_embeddings = nn.Embedding(max_span_positions, hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(3 * hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size, eps=layer_norm_eps),
            nn.Linear(hidden_size, hidden_size), nn.GELU(), nn.LayerNorm(hidden_size, eps=layer_norm_eps),
        )
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        nn.init.normal_(self.position_embeddings.weight, std=0.02)

    def forward(self, hidden: torch.Tensor, left: torch.Tensor, right: torch.Tensor, position: torch.Tensor,
                word_embeddings: torch.Tensor) -> torch.Tensor:
        """Logits [M, V] for the M masked tokens (where `position >= 0`), in row-major order."""
        rows, cols = (position >= 0).nonzero(as_tuple=True)
        pos = position[rows, cols].clamp(max=self.position_embeddings.num_embeddings - 1)
        x = torch.cat([hidden[rows, left[rows, cols]], hidden[rows, right[rows, cols]], self.position_embeddings(pos)], -1)
        return self.mlp(x) @ word_embeddings.t() + self.bias

    def save(self, directory: str | Path) -> None:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}, str(directory / "model.safetensors"))
        config = {**self.config, "architecture": "SpanBoundaryHead",
                  "paper": "Joshi et al. 2020, SpanBERT, span boundary objective",
                  "output_embeddings": "tied to the encoder's bert.embeddings.word_embeddings"}
        (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> "SpanBoundaryHead":
        directory = Path(directory)
        try:
            config = json.loads((directory / "config.json").read_text())
            state = load_tensors(directory / "model.safetensors")
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"{directory}: cannot read the SBO head: {exc}") from exc
        head = cls(config["hidden_size"], config["vocab_size"], config["max_span_positions"], config["layer_norm_eps"])
        head.load_state_dict(state)
        return head


class SpanBertPretrainer(PretrainingWrapper):
    """`BertForMaskedLM` + `SpanBoundaryHead`; loss terms mlm and sbo."""

    def __init__(self, model: BertForMaskedLM, sbo: SpanBoundaryHead, sbo_weight: float = 1.0):
        super().__init__(model, term="mlm")
        self.sbo = sbo
        self.sbo_weight = sbo_weight

    def forward(self, input_ids, attention_mask, labels, left_boundary, right_boundary, span_position, **_):
        hidden = self.model.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mlm = masked_lm_loss(self.model.cls.predictions, hidden, labels)
        logits = self.sbo(hidden, left_boundary, right_boundary, span_position,
                          self.model.bert.embeddings.word_embeddings.weight)
        sbo = F.cross_entropy(logits.float(), labels[span_position >= 0])
        return PretrainingOutput(loss=mlm + self.sbo_weight * sbo, loss_terms={"mlm": mlm.detach(), "sbo": sbo.detach()})

    def save_pretrained(self, save_directory, **kwargs) -> None:
        self.model.save_pretrained(save_directory, **kwargs)
        self.sbo.save(Path(save_directory) / SBO_DIR)



def build_model(model_config: dict, tokenizer) -> SpanBertPretrainer:
    cfg = dict(model_config)
    max_span_positions = cfg.pop("max_span_positions", MAX_SPAN_POSITIONS)
    sbo_weight = cfg.pop("sbo_weight", 1.0)
    config = bert_config(cfg, tokenizer)
    sbo = SpanBoundaryHead(config.hidden_size, config.vocab_size, max_span_positions, config.layer_norm_eps)
    return SpanBertPretrainer(BertForMaskedLM(config), sbo, sbo_weight)


def load_pretrainer(path) -> SpanBertPretrainer:
    """Encoder + SBO head back from a checkpoint folder; the SBO weight from its manifest if any."""
    return SpanBertPretrainer(load_weights(BertForMaskedLM, path), SpanBoundaryHead.load(Path(path) / SBO_DIR),
                              float(checkpoint_model_config(path).get("sbo_weight", 1.0)))

FAMILY = FamilySpec(
    name="spanbert",
    tokenizer_kind="wordpiece",
    special_tokens=SPECIAL_TOKENS,
    presets=BERT_SHAPES,
    build_model=build_model,
    make_collator=make_collator,
    truncate_example=truncate_block,
    packing="contiguous",
    objective=OBJECTIVE,
    auto_class="AutoModelForMaskedLM",
    # no model type of its own: a SpanBERT checkpoint is a BERT (its PEFT sites are BERT's)
    classifier_heads={"encoder_mean": EncoderMeanHead("BertEncoderMeanForSequenceClassification",
                                                        "transformers.models.bert.modeling_bert",
                                                        "BertPreTrainedModel", "BertModel", "bert")},
    flops=functools.partial(flops.mlm_family_flops, sbo=True),
    description="SpanBERT: geometric whole-word span masking + span boundary objective, no NSP (Joshi et al. 2020)",
)
