"""Opening a checkpoint folder and making models from models: what `ModelHandle.load` and
`ModelHandle.derive` (`workbench.running.models`) do before a handle wraps the model.

`open_checkpoint` reads a folder (config, tokenizer, weights with the LM head class the model was
trained with, the workbench manifest), checks that the body's weights are all there and that the
tokenizer belongs to them, and re-attaches a parameter-efficient fine-tuning's adapters
(`reattach_peft`: the file read here, the surgery in `workbench.running.peft_methods`). `Lineage` records where a derived model comes from;
`derive_model` makes one (`Derivation`s such as the random-init twin, Hewitt & Manning 2019).

The one loader. `load_weights(model_class, folder)` is the only call in the workbench that reads a
model's weights from a checkpoint folder (`from_pretrained` from local files only, never remote
code, transformers' loading report silenced, every failure a `CheckpointError` naming the folder);
`read_config` reads its config.json and `load_tensors` a bare safetensors file of extra weights (a
family's side head). On top of it: `open_checkpoint` (the LM head class a model was trained with,
for `ModelHandle.load`), `workbench.running.classifier_loading` (fine-tuning's classifiers, fresh
or saved, `ModelHandle.load_classifier`), each family's `load_pretrainer` (the pretraining module
back, `load_pretrainer` here picks the family from the manifest) and LM scoring's extra heads
(`workbench.running.lm_scores`). tests/test_one_loader.py checks that no other module reads weights.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from workbench.store.checkpoints import MANIFEST_NAME, read_manifest, resolve_checkpoint, weight_files
from workbench.errors import CheckpointError, WorkbenchError
from workbench.hf_quiet import quiet_transformers
from workbench.running.runner import CAUSAL_MODEL_TYPES

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class Lineage:
    """Where a derived model comes from: its parent (folder or None for an in-memory model), the
    parent's hash and own lineage, the transform and its parameters (JSON values)."""

    parent: str | None
    parent_hash: str
    transform: str
    params: dict
    parent_lineage: "Lineage | None" = None
    fresh_weights: bool = False  # the transform built new weights (random init), none of the parent's

    def record(self) -> dict[str, Any]:
        """The lineage as JSON values (a checkpoint manifest's `derived_from`)."""
        return {"parent": self.parent, "parent_sha256": self.parent_hash, "transform": self.transform,
                "params": self.params, "fresh_weights": self.fresh_weights,
                "parent_derived_from": self.parent_lineage.record() if self.parent_lineage else None}

    @classmethod
    def from_record(cls, record: Mapping[str, Any] | None, where: str = "manifest") -> "Lineage | None":
        if record is None:
            return None
        try:
            return cls(parent=record.get("parent"), parent_hash=str(record["parent_sha256"]),
                       transform=str(record["transform"]), params=dict(record.get("params") or {}),
                       parent_lineage=cls.from_record(record.get("parent_derived_from"), where),
                       fresh_weights=bool(record.get("fresh_weights", False)))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise CheckpointError(f"{where}: unreadable derived_from record ({type(e).__name__}: {e})") from None

    def describe(self) -> str:
        """One line, oldest ancestor first: `<parent> -> head_mask{...} -> quantize{...}`."""
        head = self.parent_lineage.describe() if self.parent_lineage else (self.parent or f"in-memory {self.parent_hash[:12]}")
        return f"{head} -> {self.transform}{json.dumps(self.params, sort_keys=True)}"


@dataclass(frozen=True)
class Derivation:
    """A named way of making a model from a model (`ModelHandle.derive`).

    `apply(model, **params)` returns the model to run. With `fresh_weights=False` it receives a deep
    copy of the parent's model (and may change it in place); with `fresh_weights=True` it receives
    the parent's model itself, reads only its class and config, and builds new weights (then the
    derived handle keeps none of what was learnt with the parent's weights)."""

    name: str
    apply: Callable[..., Any]
    fresh_weights: bool = False


def random_init(model, seed: int):
    """Same class and config, fresh weights: the class's own `_init_weights` under
    `torch.manual_seed(seed)` inside a forked RNG (the global RNG is untouched)."""
    config = copy.deepcopy(model.config)
    devices = [p.device for p in model.parameters()][:1] or [torch.device("cpu")]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        twin = type(model)(config)
    return twin.to(devices[0])


# Registered derivations (a transform with its own `apply` needs no entry). random_init is the usual
# "is it the architecture or the training?" baseline of probing papers (Hewitt & Manning 2019's
# random BERT; Tenney et al. 2019): the runner's random-init twin.
DERIVATIONS: dict[str, Derivation] = {"random_init": Derivation("random_init", random_init, fresh_weights=True)}


def derive_model(model, transform: str, params: Mapping[str, Any] | None, apply: Callable[..., Any] | None,
                 stamp: Callable[[Any], tuple]) -> tuple[Any, dict, Derivation]:
    """(derived model in eval mode, canonical JSON parameters, the derivation) for
    `ModelHandle.derive`; `stamp(model)` is the tensor stamp that proves the parent untouched."""
    params = dict(params or {})
    try:
        canonical = json.loads(json.dumps(params, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise WorkbenchError(f"derive {transform!r}: parameters must be JSON values ({e})") from None
    spec = DERIVATIONS.get(transform) if apply is None else Derivation(transform, apply)
    if spec is None:
        raise WorkbenchError(f"derive: unknown transform {transform!r} without an apply function; "
                             f"registered: {sorted(DERIVATIONS)}")
    parent_stamp = stamp(model)
    if spec.fresh_weights:
        derived = spec.apply(model, **params)
    else:
        copied = copy.deepcopy(model)
        derived = spec.apply(copied, **params)
        derived = copied if derived is None else derived
    if derived is model or stamp(model) != parent_stamp:
        raise WorkbenchError(f"derive {transform!r}: the transform changed the parent model (it must "
                             f"change the copy it is given, or return a new model)")
    return derived.eval(), canonical, spec


@dataclass
class OpenedCheckpoint:
    """What `open_checkpoint` read: the arguments of a `ModelHandle` over the folder."""

    model: Any
    tokenizer: Any
    path: Path
    manifest: dict
    family: str | None
    max_length: int | None
    head_trained: bool
    weight_files: list[Path]
    shifted_position_offset: int
    lineage: Lineage | None
    prompt_ids: list[int] = field(default_factory=list)


def _checked_folder(path) -> tuple[Path, dict, list[Path]]:
    path = resolve_checkpoint(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint folder")
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json (not a save_pretrained folder)")
    manifest = read_manifest(path) or {}
    weights = weight_files(path)
    if not weights:
        raise CheckpointError(f"{path}: no weight files (model.safetensors or pytorch_model.bin)")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise CheckpointError(f"{path}: no tokenizer (tokenizer.json / tokenizer_config.json)")
    return path, manifest, weights


def _head_class(config):
    """The LM head class a model was trained with: seq2seq, causal or masked LM."""
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

    archs = [a for a in (getattr(config, "architectures", None) or [])]
    if getattr(config, "is_encoder_decoder", False):
        return AutoModelForSeq2SeqLM
    if config.model_type in CAUSAL_MODEL_TYPES or any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
        return AutoModelForCausalLM
    return AutoModelForMaskedLM


def load_weights(model_class, path: str | Path, what: str | None = None, loading_info: bool = False, **kwargs):
    """`model_class.from_pretrained(path, **kwargs)`: the one place the workbench reads a model's
    weights from a folder (module docstring). Local files only, never remote code, transformers'
    per-load report silenced (the callers check the loading info themselves). With `loading_info`,
    (model, info) as transformers returns them. Any failure is a `CheckpointError`
    "<path>: cannot load <what> (<error>)" (`what` defaults to the class name)."""
    import workbench.families  # noqa: F401  (registers custom families such as ELMo)

    try:
        with quiet_transformers():
            return model_class.from_pretrained(str(path), local_files_only=True, trust_remote_code=False,
                                               output_loading_info=loading_info, **kwargs)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load {what or model_class.__name__} ({type(e).__name__}: {e})") from e


def read_config(path: str | Path, **overrides):
    """A checkpoint folder's config.json (`AutoConfig`, local files only, never remote code), with
    `overrides` set on it (the fine-tuning labels)."""
    from transformers import AutoConfig

    from workbench.families import find_family

    # the family's module registers an architecture of its own with the Auto classes (ELMo, always
    # imported with the package; any other from the folder's manifest)
    find_family((read_manifest(Path(path)) or {}).get("family"))
    return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False, **overrides)


def read_tokenizer(path: str | Path):
    """A checkpoint folder's tokenizer (`AutoTokenizer`, local files only, never remote code)."""
    from transformers import AutoTokenizer

    with quiet_transformers():
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def load_tensors(file: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file of extra weights beside a checkpoint (a family's side
    head: SpanBERT's SBO head), on the CPU."""
    from safetensors.torch import load_file

    return load_file(str(file))


def reattach_peft(model, path: str | Path, manifest: Mapping[str, Any] | None):
    """`model` with a saved adapter checkpoint's adapters back in its forward (read with
    `load_tensors`, put back by `workbench.running.peft_methods.reattach_adapters`); every other
    method's folder is a plain checkpoint and its model comes back as it is."""
    from workbench.running.peft_methods import reattach_adapters, saved_adapter_file

    file = saved_adapter_file(path, dict(manifest or {}))
    return model if file is None else reattach_adapters(model, load_tensors(file), dict(manifest), path)


def load_pretrainer(path: str | Path, family: str | None = None):
    """The pretraining module of a checkpoint folder written here (the model with every pretraining
    head, the loss the training loop optimises): the family module's `load_pretrainer`, or
    for a family whose training module is a plain transformers model (ELMo's `ElmoForBiLM`) its
    `FamilySpec.auto_class`. `family` defaults to the one the folder's manifest records."""
    import transformers

    from workbench.families import family_module, get_family

    family = family or (read_manifest(Path(path)) or {}).get("family")
    if not family:
        raise CheckpointError(f"{path}: no family in its manifest.json (not a checkpoint trained here)")
    module = family_module(family)
    if hasattr(module, "load_pretrainer"):
        return module.load_pretrainer(path)
    return load_weights(getattr(transformers, get_family(family).auto_class), path)


def _load_weights(path: Path, config, attentions: bool):
    """(model, missing LM-head keys): the head class's weights; the bare `AutoModel` for families
    without one in the Auto registry (ELMo). Missing body weights are an error."""
    from transformers import AutoModel

    kwargs = dict(config=config, loading_info=True, what="weights")
    if attentions:
        kwargs["attn_implementation"] = "eager"
    try:
        model, info = load_weights(_head_class(config), path, **kwargs)
    except CheckpointError as e:
        if "Unrecognized configuration class" not in str(e):
            raise
        model, info = load_weights(AutoModel, path, **kwargs)
    missing = list(info.get("missing_keys", []) or [])
    base = model.base_model
    prefix = model.base_model_prefix + "."
    in_base = [k for k in missing if base is model or k.startswith(prefix)]
    if in_base:
        raise CheckpointError(f"{path}: weights missing for {len(in_base)} tensors of the model body, "
                              f"e.g. {in_base[:5]} (corrupt or mismatched checkpoint)")
    return model, [k for k in missing if k not in in_base and not k.endswith("final_logits_bias")]


def open_checkpoint(path: str | Path, device: str | torch.device, attentions: bool,
                    max_length: int | None) -> OpenedCheckpoint:
    """Read a checkpoint folder or a Hub name from the local cache (`ModelHandle.load` says what is
    loaded); every failure is a `CheckpointError` naming the folder. Never runs remote code."""
    import workbench.families  # noqa: F401  (registers custom families such as ELMo)

    path, manifest, weights = _checked_folder(path)
    family = manifest.get("family")
    if max_length is None:
        # A checkpoint trained here read `max_len` tokens at a time: positions (and relative
        # buckets) past that are untrained, so its windows are that long, not the config's limit.
        trained_len = (manifest.get("config") or {}).get("max_len")
        max_length = int(trained_len) if isinstance(trained_len, int) and trained_len > 0 else None
    try:
        config = read_config(path)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read config.json ({type(e).__name__}: {e})") from e
    try:
        tokenizer = read_tokenizer(path)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot load the tokenizer ({type(e).__name__}: {e})") from e
    model, head_missing = _load_weights(path, config, attentions)
    try:
        n_emb = model.get_input_embeddings().num_embeddings
    except (NotImplementedError, AttributeError):
        n_emb = getattr(config, "vocab_size", None)
    if n_emb is not None and len(tokenizer) > n_emb:
        raise CheckpointError(f"{path}: tokenizer has {len(tokenizer)} tokens but the model's embedding "
                              f"matrix only {n_emb} rows (tokenizer does not belong to these weights)")
    # parameter-efficient fine-tuning (workbench.running.peft_methods): adapters back into the forward,
    # their file into the hash; a prompt-tuned model's prompt ids after the tokenizer's prefix
    from workbench.running.peft_methods import ADAPTER_FILE

    model = reattach_peft(model, path, manifest)
    if (path / ADAPTER_FILE).is_file():
        weights = [*weights, path / ADAPTER_FILE]
    model.to(device)
    objective = (manifest.get("config") or {}).get("objective") or {}
    return OpenedCheckpoint(
        model=model, tokenizer=tokenizer, path=path, manifest=manifest, family=family, max_length=max_length,
        head_trained=not head_missing, weight_files=weights,
        shifted_position_offset=int(objective.get("shifted_position_offset", 0) or 0),
        lineage=Lineage.from_record(manifest.get("derived_from"), str(path / MANIFEST_NAME)),
        prompt_ids=list((manifest.get("peft") or {}).get("prompt_ids") or []))
