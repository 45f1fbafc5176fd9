"""ELECTRA: a small masked-LM generator and a discriminator trained on replaced-token detection
(Clark et al. 2020).

- The collator masks 15% of `[CLS] block [SEP]` (contiguous blocks, no NSP); as in ELECTRA's
  `pretrain_helpers.mask`, a chosen token becomes [MASK] 85% of the time and stays unchanged
  otherwise (no random replacements; `mask_prob`/`random_prob` change that).
- The generator (`ElectraForMaskedLM`, hidden size about 1/4 of the discriminator's in the
  small/tiny presets, 1/3 in base, as in the paper's Table 6) predicts the masked tokens; its
  prediction at each masked position is sampled (`workbench.objectives.replaced_token_detection`,
  no gradient through the sample) and written into the original sequence.
- The discriminator (`ElectraForPreTraining`) labels every real token original/replaced.
- loss = mlm_gen + lambda * rtd with lambda = 50 (`model: {rtd_weight: ...}`); `rtd_acc` is
  logged too.
- Embedding sharing: generator and discriminator share ONE embeddings module (token, position and
  segment embeddings and their LayerNorm), as ELECTRA shares its embeddings when the two differ in
  size: both use the discriminator's `embedding_size`, and the generator projects it to its own
  hidden size (`ElectraModel.embeddings_project`). The generator's output layer is tied to the
  same token embeddings.

Checkpoint: the discriminator is the main folder (`AutoModel` -> `ElectraModel`,
`AutoModelForPreTraining` -> `ElectraForPreTraining`); the generator is saved in `generator/`
(`AutoModelForMaskedLM`). `load_pretrainer` reloads both and re-ties them.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining

from workbench.families import flops
from workbench.families.base import (BERT_ADAPTER_SITES, BERT_ADAPTER_SITES_BEFORE_DROPOUT, FamilySpec,
                                     PretrainingOutput, PretrainingWrapper, add_special_tokens, EncoderMeanHead,
                                     pad_sequences, truncate_block)
from workbench.families.bert import SPECIAL_TOKENS, apply_mlm, checkpoint_model_config, mlm_options, objective_options
from workbench.objectives.electra import replaced_token_detection
from workbench.objectives.mlm import IGNORE_INDEX
from workbench.running.model_loading import load_weights

GENERATOR_DIR = "generator"
RTD_WEIGHT = 50.0

PRESETS = {
    # discriminator hidden 64 (E 32), generator hidden 16: for tests.
    "tiny": dict(num_hidden_layers=2, embedding_size=32, hidden_size=64, num_attention_heads=2,
                 intermediate_size=128, max_position_embeddings=256,
                 generator=dict(hidden_size=16, num_attention_heads=1, intermediate_size=64)),
    # ELECTRA-Small's widths (H 256, E 128, generator 1/4) with 4 layers: the CPU demo size.
    "small": dict(num_hidden_layers=4, embedding_size=128, hidden_size=256, num_attention_heads=4,
                  intermediate_size=1024, max_position_embeddings=512,
                  generator=dict(hidden_size=64, num_attention_heads=1, intermediate_size=256)),
    # ELECTRA-Base: H = E = 768, generator 1/3 (256).
    "base": dict(num_hidden_layers=12, embedding_size=768, hidden_size=768, num_attention_heads=12,
                 intermediate_size=3072, max_position_embeddings=512,
                 generator=dict(hidden_size=256, num_attention_heads=4, intermediate_size=1024)),
}

OBJECTIVE = {"objective": "mlm_gen+rtd", "mlm_rate": 0.15, "mask_prob": 0.85, "random_prob": 0.0,
             "whole_word": False, "masking": "dynamic", "dupe_factor": 1, "temperature": 1.0}


def make_collator(objective: dict, tokenizer):
    opts = mlm_options(objective_options("electra", OBJECTIVE, objective))

    def collate(examples: list[list[int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
        ids, mask = pad_sequences([add_special_tokens(tokenizer, ex) for ex in examples], tokenizer.pad_token_id)
        masked, labels = apply_mlm(ids, mask, tokenizer, opts, generator)
        # the generator's samples are drawn in the model's forward from these seeds (one per row
        # so that slicing a batch keeps them), keeping every random choice on the loop's generator
        seeds = torch.randint(0, 2**62, (len(examples),), generator=generator)
        return {"input_ids": masked, "attention_mask": mask, "labels": labels, "original_ids": ids,
                "sample_seed": seeds, "temperature": torch.full((len(examples),), float(opts["temperature"]))}

    return collate


def tie_embeddings(discriminator: ElectraForPreTraining, generator: ElectraForMaskedLM) -> None:
    """Make the generator use the discriminator's embeddings module (same parameters) and tie its
    output layer to those token embeddings."""
    generator.electra.embeddings = discriminator.electra.embeddings
    generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight


class ElectraPretrainer(PretrainingWrapper):
    """Generator + discriminator; `self.model` is the discriminator (the main checkpoint)."""

    def __init__(self, discriminator: ElectraForPreTraining, generator: ElectraForMaskedLM, rtd_weight: float = RTD_WEIGHT):
        super().__init__(discriminator, term="rtd")
        self.generator = generator
        self.rtd_weight = rtd_weight
        tie_embeddings(discriminator, generator)

    def forward(self, input_ids, attention_mask, labels, original_ids, sample_seed, temperature=None, token_type_ids=None, **_):
        chosen = labels != IGNORE_INDEX
        gen_hidden = self.generator.electra(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        gen_logits = self.generator.generator_lm_head(self.generator.generator_predictions(gen_hidden[chosen]))  # [M, V]
        mlm_gen = F.cross_entropy(gen_logits.float(), labels[chosen])

        # sample replacements at the M masked positions (viewed as one row of length M)
        g = torch.Generator().manual_seed(int(sample_seed.flatten()[0]))
        t = 1.0 if temperature is None else float(temperature.flatten()[0])
        sampled, _ = replaced_token_detection(
            input_ids[chosen][None], labels[chosen][None], gen_logits[None], generator=g,
            original_ids=original_ids[chosen][None], temperature=t,
        )
        disc_ids = original_ids.clone()
        disc_ids[chosen] = sampled[0]
        rtd_labels = (disc_ids != original_ids).float()

        logits = self.model(input_ids=disc_ids, attention_mask=attention_mask).logits.float()
        real = attention_mask.bool()
        rtd = F.binary_cross_entropy_with_logits(logits[real], rtd_labels[real])
        with torch.no_grad():
            acc = ((logits[real] > 0).float() == rtd_labels[real]).float().mean()
            replaced = rtd_labels[real].mean()
        return PretrainingOutput(
            loss=mlm_gen + self.rtd_weight * rtd,
            loss_terms={"mlm_gen": mlm_gen.detach(), "rtd": rtd.detach(), "rtd_acc": acc, "replaced_frac": replaced},
        )

    def save_pretrained(self, save_directory, **kwargs) -> None:
        self.model.save_pretrained(save_directory, **kwargs)
        self.generator.save_pretrained(Path(save_directory) / GENERATOR_DIR, **kwargs)

def build_model(model_config: dict, tokenizer) -> ElectraPretrainer:
    cfg = dict(model_config)
    gen_cfg = dict(cfg.pop("generator"))
    rtd_weight = float(cfg.pop("rtd_weight", RTD_WEIGHT))
    common = dict(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id)
    disc_config = ElectraConfig(**common, **cfg)
    # the generator shares the discriminator's depth, embedding size and positions; only its width differs
    gen_config = ElectraConfig(**common, **{**cfg, **gen_cfg, "embedding_size": disc_config.embedding_size})
    return ElectraPretrainer(ElectraForPreTraining(disc_config), ElectraForMaskedLM(gen_config), rtd_weight)


def load_pretrainer(path) -> ElectraPretrainer:
    """Discriminator and generator back from a checkpoint folder written by `save_pretrained`
    (the generator from `generator/`), re-tied; lambda from its manifest if any."""
    disc = load_weights(ElectraForPreTraining, path)
    gen = load_weights(ElectraForMaskedLM, Path(path) / GENERATOR_DIR)
    return ElectraPretrainer(disc, gen, float(checkpoint_model_config(path).get("rtd_weight", RTD_WEIGHT)))

FAMILY = FamilySpec(
    name="electra",
    tokenizer_kind="wordpiece",
    special_tokens=SPECIAL_TOKENS,
    presets=PRESETS,
    build_model=build_model,
    make_collator=make_collator,
    truncate_example=truncate_block,
    packing="contiguous",
    objective=OBJECTIVE,
    auto_class="AutoModelForPreTraining",
    hf_model_types=("electra",),
    classifier_heads={"encoder_mean": EncoderMeanHead("ElectraEncoderMeanForSequenceClassification",
                                                        "transformers.models.electra.modeling_electra",
                                                        "ElectraPreTrainedModel", "ElectraModel", "electra")},
    adapter_sites=BERT_ADAPTER_SITES,
    adapter_sites_before_dropout=BERT_ADAPTER_SITES_BEFORE_DROPOUT,
    flops=flops.electra_flops,
    non_embedding_params=flops.electra_params,
    lm_head="generator",
    description="ELECTRA: generator MLM + discriminator replaced-token detection, shared embeddings (Clark et al. 2020)",
)
