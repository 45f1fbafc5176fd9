"""One way to load a model (issue 41, item 3): every read of model weights goes through
`workbench.running.model_loading` (`load_weights`, `load_tensors`), and the loaders folded onto it
return the weights they returned before (planted tiny checkpoints; the reference is the plain
transformers call each loader made before it was folded).

The scan reads the AST of every module of workbench/, probes/ and app/ and of the scripts of
benchmarks/ and experiments/ (a benchmark measures the model the workbench loads) and reports:
- `X.from_pretrained(...)` where X is not a tokenizer or a config: anywhere but model_loading.py;
- `torch.load(...)`: anywhere but `TORCH_LOAD_ALLOWED`;
- a safetensors reader (`load_file`, `safe_open`): anywhere but model_loading.py and `SAFETENSORS_ALLOWED`.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("workbench", "probes", "app", "benchmarks", "experiments")
LOADER = "workbench/running/model_loading.py"
# torch.load of a training run's resume state (weights + optimizer + scheduler + RNG of an
# unfinished run, written and read by the loop that owns it), never of a checkpoint folder:
TORCH_LOAD_ALLOWED = {
    "workbench/drivers/train.py": "the pretraining loop's resume state (workbench.drivers.train)",
    "workbench/drivers/finetune.py": "the fine-tuning loop's resume state (finetune._load_state)",
    "experiments/diagnostics/behaviour_check.py": ("hashes what two source trees wrote with the checking "
                                                   "script's own reader, not either tree's loader"),
}
SAFETENSORS_ALLOWED = {
    "workbench/compress/masks.py": "pruning masks (bool tensors beside a checkpoint), not weights",
    "workbench/store/checkpoints.py": "tensor names from a safetensors header (weight_names), never the tensors",
    "experiments/diagnostics/behaviour_check.py": TORCH_LOAD_ALLOWED["experiments/diagnostics/behaviour_check.py"],
}
SAFETENSORS_READERS = ("load_file", "safe_open")


def _receiver(func: ast.Attribute) -> str:
    """The last name of what `.from_pretrained` is called on (`AutoConfig`, `cls`, `transformers.X`)."""
    value = func.value
    if isinstance(value, ast.Attribute):
        return value.attr
    if isinstance(value, ast.Name):
        return value.id
    return ""


def offences(root: Path = ROOT) -> list[str]:
    """Every direct read of model weights outside the one loader, as "path:line: what"."""
    out = []
    for package in SCANNED:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=rel)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call):
                    continue
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
                if name == "from_pretrained" and isinstance(func, ast.Attribute):
                    receiver = _receiver(func)
                    if "tokenizer" in receiver.lower() or receiver.lower().endswith("config"):
                        continue
                    if rel != LOADER:
                        out.append(f"{rel}:{node.lineno}: {receiver}.from_pretrained")
                elif (name == "load" and isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                      and func.value.id == "torch" and rel not in TORCH_LOAD_ALLOWED):
                    out.append(f"{rel}:{node.lineno}: torch.load")
                elif name in SAFETENSORS_READERS and rel != LOADER and rel not in SAFETENSORS_ALLOWED:
                    out.append(f"{rel}:{node.lineno}: safetensors {name}")
    return out


def test_no_module_reads_model_weights_outside_the_one_loader():
    found = offences()
    assert not found, ("read model weights through workbench.running.model_loading (load_weights, "
                       "load_tensors), not directly:\n" + "\n".join(found))


def test_the_scan_finds_direct_loads_and_spares_tokenizers_configs_and_the_loader(tmp_path):
    files = {
        "workbench/families/x.py": ("from transformers import BertForMaskedLM, AutoConfig, AutoTokenizer\n"
                                    "def f(p, cls):\n    AutoConfig.from_pretrained(p)\n"
                                    "    AutoTokenizer.from_pretrained(p)\n    BertForMaskedLM.from_pretrained(p)\n"
                                    "    return cls.from_pretrained(p)\n"),
        "probes/y.py": "import torch\nfrom safetensors.torch import load_file\nw = torch.load('m.pt')\nv = load_file('a')\n",
        "app/z.py": "import transformers\nm = transformers.AutoModel.from_pretrained('x')\n",
        "workbench/running/model_loading.py": ("from safetensors.torch import load_file\n"
                                               "def g(c, p):\n    return c.from_pretrained(p), load_file(p)\n"),
        "workbench/running/peft_methods.py": "from safetensors.torch import load_file\nx = load_file('a')\n",
        "workbench/drivers/finetune.py": "import torch\ns = torch.load('resume/model.pt', weights_only=True)\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert sorted(offences(tmp_path)) == [
        "app/z.py:2: AutoModel.from_pretrained",
        "probes/y.py:3: torch.load",
        "probes/y.py:4: safetensors load_file",
        "workbench/families/x.py:5: BertForMaskedLM.from_pretrained",
        "workbench/families/x.py:6: cls.from_pretrained",
        "workbench/running/peft_methods.py:2: safetensors load_file",
    ]


# ---- the loaders return the weights they returned before ------------------------------------------


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def _save(folder: Path, model, tokenizer, manifest: dict) -> Path:
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


# family -> (the conftest tokenizer it builds with, the class its pretraining module was read with
# before; gpt and elmo had no loader: what a script read them with)
PRETRAINERS = {
    "bert": ("bert", "transformers.BertForPreTraining"), "spanbert": ("bert", "transformers.BertForMaskedLM"),
    "electra": ("bert", "transformers.ElectraForPreTraining"), "deberta": ("bert", "transformers.DebertaV2ForMaskedLM"),
    "distilbert": ("bert", "transformers.DistilBertForMaskedLM"), "roberta": ("bart", "transformers.RobertaForMaskedLM"),
    "albert": ("t5", "transformers.AlbertForPreTraining"), "t5": ("t5", "transformers.T5ForConditionalGeneration"),
    "bart": ("bart", "transformers.BartForConditionalGeneration"), "gpt": ("gpt", "transformers.GPT2LMHeadModel"),
    "elmo": ("word", "workbench.families.elmo_modules.ElmoForBiLM"),
}


@pytest.mark.parametrize("name", sorted(PRETRAINERS))
def test_every_family_reloads_its_pretraining_module_with_the_saved_weights(name, tokenizers, ewt_train, tmp_path):
    import importlib

    from workbench.families import get_family
    from workbench.families.base import PretrainingWrapper
    from workbench.running.model_loading import load_pretrainer
    from workbench.tokenization import build_tokenizer

    tok_name, old_class = PRETRAINERS[name]
    family = get_family(name)
    tok = (tokenizers[tok_name] if tok_name != "word" else
           build_tokenizer("word", family.special_tokens, [s.text for s in ewt_train[:500]], vocab_size=300,
                           special_roles=family.special_roles, template=family.template))
    torch.manual_seed(0)
    planted = family.build_model(family.model_config("tiny"), tok).eval()
    folder = _save(tmp_path / name, planted, tok, {"family": name})
    loaded = load_pretrainer(folder)  # the family from the manifest
    assert type(loaded) is type(planted)
    _same(loaded.state_dict(), planted.state_dict())
    # what the family's loader read before it went through the one loader
    module, cls = old_class.rsplit(".", 1)
    before = getattr(importlib.import_module(module), cls).from_pretrained(str(folder))
    _same((loaded.model if isinstance(loaded, PretrainingWrapper) else loaded).state_dict(), before.state_dict())


def test_load_pretrainer_without_a_family_names_the_folder(tiny_checkpoint, tmp_path):
    import shutil

    from workbench.errors import CheckpointError
    from workbench.running.model_loading import load_pretrainer

    folder = tmp_path / "no-family"
    shutil.copytree(tiny_checkpoint, folder)
    (folder / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match=f"{folder}: no family"):
        load_pretrainer(folder)


def _reference_classifier(folder: Path, family: str, kind: str, pooling: str, labels: list[str], pad_id: int):
    """What `build_classifier` built before it moved to workbench.running (transformers called directly)."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

    from workbench.running.classifier_loading import classifier_class

    config = AutoConfig.from_pretrained(folder, id2label=dict(enumerate(labels)),
                                        label2id={n: i for i, n in enumerate(labels)})
    if config.pad_token_id is None:
        config.pad_token_id = pad_id
    cls = classifier_class(family, kind, pooling)
    if cls is None:
        auto = AutoModelForTokenClassification if kind == "token" else AutoModelForSequenceClassification
        return auto.from_pretrained(folder, config=config)
    model = cls(config)
    body = getattr(model, model.base_model_prefix)
    body.load_state_dict(type(body).from_pretrained(folder).state_dict())
    return model


CLASSIFIERS = [("bert", "sentence", "first"), ("bert", "sentence", "encoder_mean"), ("bert", "token", "token"),
               ("gpt", "sentence", "last"), ("t5", "sentence", "encoder_mean"), ("bart", "sentence", "decoder_last"),
               ("bart", "token", "token")]


@pytest.mark.parametrize("family,kind,pooling", CLASSIFIERS)
def test_classifiers_are_built_and_reloaded_with_the_same_weights_as_before(family, kind, pooling, tiny_models,
                                                                           tmp_path):
    from workbench.drivers import distill
    from workbench.running.classifier_loading import build_classifier, load_classifier
    from workbench.running.models import ModelHandle
    from workbench.store.identity import weights_hash

    model, tok = tiny_models[family]
    folder = _save(tmp_path / "lm", model, tok, {"family": family})
    labels, pad = ["a", "b", "c"], tok.pad_token_id if tok.pad_token_id is not None else 0
    torch.manual_seed(5)
    built = build_classifier(folder, family, kind, pooling, labels, pad)
    torch.manual_seed(5)
    _same(built.state_dict(), _reference_classifier(folder, family, kind, pooling, labels, pad).state_dict())
    saved = _save(tmp_path / "cls", built, tok, {"family": family, "kind": "finetune"})
    _same(load_classifier(saved).state_dict(), built.state_dict())
    torch.manual_seed(6)  # a classifier folder of the same head class keeps its saved head
    _same(build_classifier(saved, family, kind, pooling, labels, pad).state_dict(), built.state_dict())
    if kind == "sentence":
        handle = ModelHandle.load_classifier(saved)
        assert handle.checkpoint_hash == weights_hash(saved) == distill.classifier_handle(saved).checkpoint_hash
        assert handle.family == family and handle.manifest["kind"] == "finetune"
        _same(handle.model.state_dict(), built.state_dict())


def test_a_broken_weight_file_is_one_checkpoint_error_naming_the_folder_and_what(tiny_models, tmp_path):
    from workbench.errors import CheckpointError
    from workbench.running.classifier_loading import load_classifier
    from workbench.running.model_loading import load_pretrainer

    model, tok = tiny_models["bert"]
    folder = _save(tmp_path / "ck", model, tok, {"family": "bert"})
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match=f"{folder}: cannot load BertForPreTraining"):
        load_pretrainer(folder)
    with pytest.raises(CheckpointError, match=f"{folder}: cannot load a fine-tuned classifier"):
        load_classifier(folder)


def test_the_prune_sweep_reads_the_head_shape_from_the_config(tiny_models, tmp_path):
    from workbench.drivers.prune_sweep import checkpoint_head_shape

    model, tok = tiny_models["bert"]
    folder = _save(tmp_path / "ck", model, tok, {"family": "bert"})
    assert checkpoint_head_shape(str(folder)) == (model.config.num_hidden_layers, model.config.num_attention_heads)
