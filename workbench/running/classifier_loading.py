"""Classifiers from checkpoints, through the one loader (`workbench.running.model_loading.load_weights`).

`build_classifier` puts a freshly initialised classification head over the pretrained body of a
checkpoint (what `bertology finetune` trains; seed torch before calling: the head's initial
weights are drawn then); `load_classifier` opens a fine-tuned classifier folder again, its
parameter-efficient fine-tuning's adapters re-attached (`workbench.running.model_loading.reattach_peft`);
`ModelHandle.load_classifier` wraps one in a handle that keeps the folder's identity.

Which class (`classifier_class`): transformers' `AutoModelForSequenceClassification` /
`AutoModelForTokenClassification` where the family has one (BERT reads [CLS], GPT-2 the last
non-pad token, T5/BART the decoder state at the final </s>), else a head of
`workbench.running.classifier_heads`: ELMo's (Peters et al. 2018: a scalar mix over its layers),
the encoder-mean heads of every family (`pooling: encoder_mean`) and BART's encoder token head.
"""

from __future__ import annotations

from pathlib import Path

from workbench.errors import CheckpointError
from workbench.running.model_loading import load_weights, read_config, reattach_peft


def classifier_class(family: str, kind: str, pooling: str):
    """A workbench head class for (family, task kind "sentence" | "token", pooling), or None where
    transformers' Auto class is the one to use: the family's `FamilySpec.classifier_heads` decides."""
    from workbench.families import find_family
    from workbench.running.classifier_heads import head_class

    spec = find_family(family)
    if spec is None:
        if pooling == "encoder_mean":
            raise KeyError(family)  # as before: no encoder-mean head for a model that is no family here
        return None
    entry = spec.classifier_heads.get("token" if kind == "token" else pooling)
    if entry is None and pooling == "encoder_mean":
        raise KeyError(family)
    return None if entry is None else head_class(entry)


def _auto_class(token: bool):
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    return AutoModelForTokenClassification if token else AutoModelForSequenceClassification


def build_classifier(path: Path, family: str, kind: str, pooling: str, label_names: list[str], pad_id: int):
    """The pretrained body of `path` under a freshly initialised head (seed torch before calling);
    a classifier folder of the same head class keeps its saved head."""
    labels = {"id2label": dict(enumerate(label_names)),
              "label2id": {n: i for i, n in enumerate(label_names)}}
    config = read_config(path, **labels)
    if getattr(config, "pad_token_id", None) is None:
        config.pad_token_id = pad_id  # GPT-2 finds the last non-pad token through it
    cls = classifier_class(family, kind, pooling)
    what = f"a {kind} classifier"
    if cls is None:
        model, info = load_weights(_auto_class(kind == "token"), path, what, loading_info=True, config=config)
        prefix = model.base_model_prefix + "."
        # BERT's pooler (a dense layer over [CLS]) is part of the classification head when the
        # checkpoint was saved without one (MLM pretraining without NSP): freshly initialised.
        body_missing = [k for k in info.get("missing_keys", []) if k.startswith(prefix) and ".pooler." not in k]
        if body_missing:
            raise CheckpointError(f"{path}: weights missing for {len(body_missing)} tensors of the "
                                  f"model body, e.g. {body_missing[:3]}")
    elif cls.__name__ in (getattr(config, "architectures", None) or []):
        # a classifier folder of this very class (the sweep's rewound start weights): its saved
        # head too, as the Auto branch loads a saved head (a fresh head would undo the rewind)
        model = load_weights(cls, path, what, config=config)
    else:
        try:
            model = cls(config)
        except Exception as e:
            raise CheckpointError(f"{path}: cannot build {what} ({type(e).__name__}: {e})") from e
        body = getattr(model, model.base_model_prefix)
        body.load_state_dict(load_weights(type(body), path, what).state_dict())
    return model


def load_classifier(path: str | Path):
    """Open a fine-tuned classifier folder: transformers' Auto classes, or a
    `workbench.running.classifier_heads` class named in `config.architectures` (ELMo; T5/BART
    encoder_mean), with a PEFT method's adapters re-attached; in eval mode."""
    from workbench.running import classifier_heads as heads
    from workbench.store.checkpoints import read_manifest

    path = Path(path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"{path}: no config.json (not a fine-tuned checkpoint)")
    arch = (getattr(read_config(path), "architectures", None) or [""])[0]
    cls = heads.head_classes().get(arch) or _auto_class(arch.endswith("ForTokenClassification"))
    model = load_weights(cls, path, "a fine-tuned classifier")
    return reattach_peft(model, path, read_manifest(path)).eval()
