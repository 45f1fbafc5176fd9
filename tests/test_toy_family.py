"""A new family is one file (issue 51): a toy family written into a temporary package, found
through the family packages (`$BERTOLOGY_FAMILY_PACKAGES`, the search path `workbench.families`
is on), is trained, probed, fine-tuned with LoRA and costed with no other edit.

The toy is a BERT-style masked LM under a model type of its own (`toy_bert`, registered with the
Auto classes by its module), so that nothing the workbench knows about BERT by model type can
answer for it: its PEFT sites, LoRA targets, poolings, classifier head and FLOPs formula all come
from its `FamilySpec`.
"""

from __future__ import annotations

import json
import textwrap
import uuid

import pytest

from workbench.store.results import ResultsStore
from tests.training_helpers import run_tiny_training, tiny_finetune_config

TOY_FAMILY = '''
"""Toy: a BERT-style masked LM on contiguous WordPiece blocks, under a model type of its own."""

from transformers import (AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification,
                          AutoModelForTokenClassification, BertConfig, BertForMaskedLM, BertForSequenceClassification,
                          BertForTokenClassification, BertModel, BertPreTrainedModel)

from workbench.families import flops
from workbench.families.base import (BERT_ADAPTER_SITES, FamilySpec, PretrainingWrapper, add_special_tokens,
                                     EncoderMeanHead, pad_sequences, truncate_block)
from workbench.families.bert import BERT_SHAPES, MLM_DEFAULTS, SPECIAL_TOKENS, apply_mlm, mlm_options, objective_options
from workbench.running.model_loading import load_weights


class ToyConfig(BertConfig):
    model_type = "toy_bert"


class ToyPreTrainedModel(BertPreTrainedModel):
    config_class = ToyConfig


class ToyModel(BertModel):
    config_class = ToyConfig


class ToyForMaskedLM(BertForMaskedLM):
    config_class = ToyConfig


class ToyForSequenceClassification(BertForSequenceClassification):
    config_class = ToyConfig


class ToyForTokenClassification(BertForTokenClassification):
    config_class = ToyConfig


AutoConfig.register("toy_bert", ToyConfig, exist_ok=True)
for auto, cls in ((AutoModel, ToyModel), (AutoModelForMaskedLM, ToyForMaskedLM),
                  (AutoModelForSequenceClassification, ToyForSequenceClassification),
                  (AutoModelForTokenClassification, ToyForTokenClassification)):
    auto.register(ToyConfig, cls, exist_ok=True)

OBJECTIVE = {"objective": "mlm", **MLM_DEFAULTS}


def make_collator(objective, tokenizer):
    opts = mlm_options(objective_options("toy", MLM_DEFAULTS, objective))

    def collate(examples, generator):
        ids, mask = pad_sequences([add_special_tokens(tokenizer, ex) for ex in examples], tokenizer.pad_token_id)
        masked, labels = apply_mlm(ids, mask, tokenizer, opts, generator)
        return {"input_ids": masked, "attention_mask": mask, "labels": labels}

    return collate


def build_model(model_config, tokenizer):
    config = ToyConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, **model_config)
    return PretrainingWrapper(ToyForMaskedLM(config), term="mlm")


def load_pretrainer(path):
    return PretrainingWrapper(load_weights(ToyForMaskedLM, path), term="mlm")


FAMILY = FamilySpec(
    name="toy",
    tokenizer_kind="wordpiece",
    special_tokens=SPECIAL_TOKENS,
    presets=BERT_SHAPES,
    build_model=build_model,
    make_collator=make_collator,
    truncate_example=truncate_block,
    objective=OBJECTIVE,
    auto_class="AutoModelForMaskedLM",
    hf_model_types=("toy_bert",),
    poolings=("encoder_mean", "first"),
    classifier_heads={"encoder_mean": EncoderMeanHead("ToyEncoderMeanForSequenceClassification", __name__,
                                                        "ToyPreTrainedModel", "ToyModel", "bert")},
    adapter_sites=BERT_ADAPTER_SITES,
    lora_targets=("query", "value"),
    flops=flops.mlm_family_flops,
    description="Toy: BERT's masked LM under a model type of its own (tests/test_toy_family.py)",
)
'''


@pytest.fixture
def toy_package(tmp_path, monkeypatch):
    """A namespace package holding one file, `toy.py`, named in `$BERTOLOGY_FAMILY_PACKAGES`."""
    package = f"toyfamilies_{uuid.uuid4().hex[:8]}"  # fresh per test: no module cached from another
    (tmp_path / "pkgs" / package).mkdir(parents=True)
    (tmp_path / "pkgs" / package / "toy.py").write_text(textwrap.dedent(TOY_FAMILY), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path / "pkgs"))
    monkeypatch.setenv("BERTOLOGY_FAMILY_PACKAGES", package)
    return package


def test_a_family_in_a_package_of_its_own_is_found_and_asked(toy_package):
    from workbench.families import available_families, family_of_model_type, find_family, get_family
    from workbench.running.models import FAMILY_OF_MODEL_TYPE
    from workbench.running.peft_methods import ADAPTER_TARGETS, LORA_TARGETS, lora_targets

    assert available_families()[-1] == "toy" and "bert" in available_families()
    spec = get_family("toy")
    assert spec.name == "toy" and find_family("toy") is spec
    assert family_of_model_type("toy_bert") is spec and FAMILY_OF_MODEL_TYPE["toy_bert"] == "toy"
    assert "toy_bert" in ADAPTER_TARGETS and LORA_TARGETS["toy_bert"] == ["query", "value"]
    assert lora_targets("toy_bert", "qkv") == ["query", "value", "key"]
    assert find_family("no_such_family") is None and find_family("base") is None  # a helper module is no family


def test_a_new_family_trains_probes_finetunes_with_lora_and_costs_by_one_file(toy_package, tmp_path):
    from probes.syntax import run_syntax_probes
    from workbench.cost import checkpoint_cost, flops_per_token
    from workbench.families.flops import mlm_family_flops
    from workbench.drivers.finetune import run_finetune
    from workbench.families.bert import MLM_DEFAULTS
    from workbench.store.checkpoints import read_manifest

    # train: a few steps of the tiny preset on real text
    run = run_tiny_training("toy", steps=12, output_dir=tmp_path / "train")
    manifest = read_manifest(run.checkpoint)
    assert manifest["family"] == "toy"
    assert json.loads((run.checkpoint / "config.json").read_text())["model_type"] == "toy_bert"
    assert run.heldout_after["mlm"] < run.heldout_before["mlm"]

    # cost: the toy's own FLOPs formula, times the tokens trained
    own = checkpoint_cost(run.checkpoint)["own"]
    per_token = flops_per_token("toy", manifest["model_config"], manifest["tokenizer"]["vocab_size"],
                                run.config.max_len, manifest["objective"])["total"]
    forward = mlm_family_flops(manifest["model_config"], manifest["tokenizer"]["vocab_size"], run.config.max_len,
                               {**MLM_DEFAULTS, **manifest["objective"]})
    assert per_token == pytest.approx(3 * sum(forward.values()))
    assert own["flops"] == pytest.approx(per_token * manifest["tokens_seen"])

    # probe: UPOS on every layer
    _, rows = run_syntax_probes([run.checkpoint], ["upos"], store=ResultsStore(tmp_path / "probe"),
                                max_train_sentences=60, max_eval_sentences=30, baselines=(), mdl_tasks=(),
                                scalar_mix_tasks=(), cache_dir=tmp_path / "cache", progress=False, n_boot=20)
    acc = rows[(rows["metric"] == "accuracy") & (rows["split"] == "dev")]
    assert sorted(acc["layer"]) == [0, 1, 2] and set(acc["family"]) == {"toy"}

    # fine-tune with LoRA: the toy's pooling ("auto" = its first, encoder_mean), head and LoRA targets
    cfg = tiny_finetune_config(run.checkpoint, tmp_path / "finetune", method="lora", lora_r=4, lora_alpha=8)
    res = run_finetune(cfg, store=ResultsStore(tmp_path / "ft-store"))
    best = res.folder / "seed-0" / "best"
    ft = read_manifest(best)
    assert ft["pooling"] == "encoder_mean"
    assert json.loads((best / "config.json").read_text())["architectures"] == ["ToyEncoderMeanForSequenceClassification"]
    assert ft["peft"]["merged_layers"] == 2 * 2  # query and value of both layers
    assert checkpoint_cost(best)["own"]["flops"] > 0  # charged by the toy's classifier body
