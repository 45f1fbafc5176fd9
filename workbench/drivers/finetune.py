"""Fine-tuning runner: any checkpoint -> a classifier on a real task, over several seeds.

Tasks (`TASKS`): sentence classification on `sentence_polarity` (Pang & Lee 2005, 10,662
snippets, pos/neg) and `subjectivity` (Pang & Lee 2004, 10,000 sentences, subj/obj), and token
classification `upos` (UD English EWT, its own train/dev/test; one label per word, read at the
word's first subword as in Devlin et al. 2019, Sec. 5.3), and the span tasks `conll2002_es` /
`conll2002_nl` (named entities, Tjong Kim Sang 2002: BIO tags as word labels the same way, the
shared task's train/testa/testb, scored by conlleval span F1, `workbench.conlleval`, in place of
accuracy: rows `span_f1`, `span_f1_epoch`).

The sentence sets come without a split, so one is drawn once per `split_seed` (a seeded
permutation, cut into test/dev/train fractions) and shared by every training seed; the ids of each
split are written to `<run folder>/splits.json` and into the results manifest. With
`max_train_examples`, seed runs train on the first N ids of the (already shuffled) train split:
these are the *members* a membership attack must find, every other id is a non-member
(`members(checkpoint)` reads both back from a saved checkpoint).

How each family classifies a sentence (`pooling`, "auto" picks the first listed):
| family | pooling | class |
|---|---|---|
| bert, spanbert, roberta, albert, electra, deberta | first ([CLS] / <s>) / encoder_mean | transformers `AutoModelForSequenceClassification` / `workbench.running.classifier_heads` |
| gpt | last (last non-pad token) | `GPT2ForSequenceClassification` |
| t5, bart | decoder_last (decoder state at the final </s>) / encoder_mean | transformers' class / `workbench.running.classifier_heads` |
| elmo | scalar_mix (Peters et al. 2018, mean over tokens) | `workbench.running.classifier_heads.ElmoForSequenceClassification` |
Token classification uses `AutoModelForTokenClassification` (T5: the encoder) or, for ELMo and
BART, the heads in `workbench.running.classifier_heads`.

Training: AdamW with linear warm-up and decay (Devlin et al. 2019's fine-tuning recipe), dev
accuracy after every epoch, early stopping after `patience` epochs without a new best, test
accuracy of the best epoch. Every `save_every` optimizer steps and at each epoch end the whole
state (weights, optimizer, scheduler, torch RNG, epoch, batch index, dev curve) is written
atomically to `seed-S/resume/`; rerunning the same command continues exactly there (the data
order of an epoch is a pure function of (seed, epoch)), so an interrupted run ends with the same
weights as an uninterrupted one. The step, optimizer and checkpoint folder are the shared pieces
of `workbench.loop`; `run_finetune(..., hooks=TrainingHooks(...))` adds an after-step hook, a
teacher and the loss that reads it (each term's epoch mean goes into the curve), or a parameter
filter (`freeze_body` is one: the head only); the manifest records what trained.

Layout under the runs root:
```
finetune/<name>/config.json            the config (a rerun with a different one is refused)
finetune/<name>/splits.json            ids per split, split seed, label names
finetune/<name>/seed-S/best/           save_pretrained folder + tokenizer + manifest.json
finetune/<name>/seed-S/step-NNNNNNN/   one per epoch with keep_epoch_checkpoints (membership sweeps)
finetune/<name>/seed-S/resume/         trainer state while the seed runs
finetune/<name>/seed-S/result.json     dev curve, best epoch, dev/test accuracy (the seed is done)
```
Rows go to the results store (probe="finetune"): per seed `accuracy` on dev and test (the best
epoch), the per-epoch curve `accuracy_epoch` (dev) and `train_loss_epoch`, and the baselines (model
`majority`, and `bow_logreg` (sentences) or `word_majority` (UPOS)) on the same split. The mean over
seeds with its 95% t-interval is computed where it is shown (`workbench.store.aggregate`); runs written
before issue 41 also stored it as a seed-less `accuracy` row per split (extra `over`), which readers
leave out (`workbench.store.aggregate.per_unit`) so that no seed counts twice.

Concerns:
- the config and the fine-tuning method's record: `FinetuneConfig`, `load_finetune_config`,
  `method_options`, `method_record`
- task data and its split (issue 51 moves it to `workbench.data`): `TaskData`, `split_indices`,
  `load_task`, `load_span_task`, `used_splits`, `members`
- encoding and evaluation: `Encoded`, `encode`, `collate`, `choose_pooling`, `evaluate`,
  `to_model_device`, `evaluate_count`
- the classifier training step, its resume state and its cost (what prune, distill and peft share):
  `epoch_order`, `save_resume_state`, `finetune_cost_basis`, `finetune_cost`, `classification_loss`,
  `trainable_filter`, `SeedResult`, `train_seed`
- baselines and statistics over seeds: `baselines`, `t_interval`
- the driver (a run prepared once, seeds as units, one results-store run): `Prepared`, `run_slug`,
  `prepare`, `FinetuneResult`, `train_seed_unit`, `finetune_units`, `run_finetune`, `collect`
- what `bertology finetune` prints: `format_table`, `report`
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.store.checkpoints import seed_dir, single_checkpoint, step_dir
from workbench.running.classifier_loading import build_classifier, load_classifier
from workbench.drivers.spec import IDENTITY, NOT_IDENTITY, DriverSpec, identity_hash
from workbench.coerce import load_config
from workbench.errors import CheckpointError, ConfigError
from workbench.io import atomic_dir, atomic_write_json, sha256_file
from workbench.store.rowschema import RowSchema
from workbench.loop import (
    NO_HOOKS,
    TrainingHooks,
    adamw,
    apply_param_filter,
    evaluating,
    linear_warmup_decay,
    loss_terms,
    optimizer_step,
    outside,
    prepare_teacher,
    write_model_folder,
)

PROBE = "finetune"
# The `extra` of the rows `run_finetune` writes (checked by the results store, `workbench.store.rowschema`).
_METHOD_KEYS = {"lora_r": int, "lora_alpha": float, "lora_targets": str, "pooler": str, "adapter_size": int,
                "adapter_norms": str, "prompt_tokens": int}  # `method_record`: the options its method reads
EXTRA_SCHEMAS = (
    RowSchema(PROBE, "per seed", required={"best_epoch": int, "checkpoint": str, "pooling": str, "method": str},
              optional={"trainable": int | None, "total_parameters": int | None, **_METHOD_KEYS}),
    RowSchema(PROBE, "per epoch", required={"epoch": int}),
    RowSchema(PROBE, "baseline", optional={"label": str, "C": float, "ngrams": list, "precision": float, "recall": float}),
    # The seed-less mean older runs stored (before issue 41). `run_finetune` writes none; the kind stays
    # declared so that such a run can still be copied into a store (the app's tests plant one to check
    # that readers leave it out: `workbench.store.aggregate.per_unit`).
    RowSchema(PROBE, "over seeds (older runs)", required={"over": str},
              optional={"interval": str, "method": str, **_METHOD_KEYS}),
)
SENTENCE_TASKS = {"sentence_polarity": "sentence_polarity", "subjectivity": "subjectivity"}
TOKEN_TASKS = {"upos": "en_ewt"}
# span tasks: token classification over BIO tags, scored by span F1 (`workbench.conlleval`)
SPAN_TASKS = {"conll2002_es": "es", "conll2002_nl": "nl"}
TASKS = tuple(SENTENCE_TASKS) + tuple(TOKEN_TASKS) + tuple(SPAN_TASKS)
POOLINGS = ("auto", "first", "last", "decoder_last", "encoder_mean", "scalar_mix")
# the poolings a family supports for sentence tasks, the first is "auto": its `FamilySpec.poolings`;
# a model that is no family here (a local HF encoder) gets these
DEFAULT_POOLINGS = ("first", "encoder_mean")
STATE_DIR = "resume"
METHOD_OPTIONS = ("lora_r", "lora_alpha", "adapter_size", "prompt_tokens", "lora_targets", "adapter_norms", "pooler")


def _reads(option: str):
    """The identity rule of a method option (`workbench.drivers.spec`): it counts when the config's method
    (not full) reads it (`method_record`)."""
    return lambda cfg: cfg.method != "full" and option in method_record(cfg)
BEST_DIR = "best"


# ---------------------------------------------------------------------------------------- config

@dataclass
class FinetuneConfig:
    """One fine-tuning experiment. Unknown keys and bad values are `ConfigError`s (`load_finetune_config`)."""

    checkpoint: str                       # a checkpoint folder, a training folder (its last step) or a Hub name
    task: str = "sentence_polarity"       # one of TASKS
    name: str | None = field(default=None, metadata=NOT_IDENTITY)  # run folder name; default <task>-<checkpoint name>
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata=NOT_IDENTITY)  # a seed's weights: the seed
    epochs: int = 3
    lr: float = 5e-5
    batch_size: int = 32
    max_len: int = 128                    # tokens per example (special tokens included); longer ones are cut
    weight_decay: float = 0.01
    warmup: float = 0.1                   # fraction of the planned steps
    clip: float = 1.0                     # gradient-norm clip, 0 = none
    patience: int = 2                     # epochs without a new best dev accuracy before stopping
    pooling: str = "auto"                 # see the module table
    freeze_body: bool = False             # train only the head (ELMo's original setting; = method head)
    # the method and the options it reads count for the identity (full fine-tuning reads none: its
    # hash is the one from before methods)
    method: str = field(default="full", metadata={IDENTITY: lambda c: c.method != "full"})  # full | head | bitfit | adapter | prompt | lora (workbench.running.peft_methods)
    lora_r: int = field(default=8, metadata={IDENTITY: _reads("lora_r")})              # lora: rank of each update
    lora_alpha: float = field(default=16.0, metadata={IDENTITY: _reads("lora_alpha")})  # lora: the update is scaled by alpha / r
    adapter_size: int = field(default=64, metadata={IDENTITY: _reads("adapter_size")})  # adapter: bottleneck width m
    prompt_tokens: int = field(default=20, metadata={IDENTITY: _reads("prompt_tokens")})  # prompt: number of trained input vectors
    lora_targets: str = field(default="qv", metadata={IDENTITY: _reads("lora_targets")})  # lora: qv (Hu et al.) | qkv (GPT-2: the whole fused c_attn)
    adapter_norms: str = field(default="train", metadata={IDENTITY: _reads("adapter_norms")})  # adapter: train (Houlsby et al.) | frozen: the body's layer norms
    pooler: str = field(default="auto", metadata={IDENTITY: _reads("pooler")})  # every method but full: BERT's pooler trains when not pretrained | train | frozen
    split_seed: int = 0
    dev_fraction: float = 0.1             # sentence tasks: fractions of the whole set
    test_fraction: float = 0.1
    max_train_examples: int | None = None # train on the first N of the shuffled train split
    max_eval_examples: int | None = None  # cap dev and test (quick runs)
    save_every: int = field(default=200, metadata=NOT_IDENTITY)  # optimizer steps between resume states
    keep_epoch_checkpoints: bool = False  # a step-N checkpoint at every epoch end
    baselines: bool = field(default=True, metadata=NOT_IDENTITY)
    threads: int | None = field(default=None, metadata=NOT_IDENTITY)
    device: str = field(default="auto", metadata=NOT_IDENTITY)  # auto (cuda when available) | cpu | cuda | cuda:N
    output_dir: str | None = field(default=None, metadata=NOT_IDENTITY)  # default <runs root>/finetune/<name>
    progress: bool = field(default=True, metadata=NOT_IDENTITY)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def training_hash(self) -> str:
        """What changes a seed's trained weights: the identity fields (`workbench.drivers.spec.identity_hash`;
        not the seed list, paths, display, baselines)."""
        return identity_hash(self)


def load_finetune_config(source: str | Path | dict | FinetuneConfig, overrides: dict | None = None) -> FinetuneConfig:
    """A validated config from a YAML file or a dict, with `overrides` on top (`workbench.coerce.load_config`:
    None values ignored)."""
    cfg, where = load_config(FinetuneConfig, source, overrides, label="finetune config")
    _validate(cfg, where)
    return cfg


def _validate(cfg: FinetuneConfig, where: str) -> None:
    def fail(key, msg):
        raise ConfigError(f"{where}: {key}: {msg}")

    if cfg.task not in TASKS:
        fail("task", f"unknown task {cfg.task!r} (known: {', '.join(TASKS)})")
    if not cfg.seeds:
        fail("seeds", "list at least one seed")
    if any(s < 0 for s in cfg.seeds):
        fail("seeds", f"seeds must be >= 0, got {cfg.seeds}")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        fail("seeds", f"seeds repeat: {cfg.seeds}")
    for key in ("epochs", "batch_size", "save_every"):
        if getattr(cfg, key) < 1:
            fail(key, f"must be >= 1, got {getattr(cfg, key)}")
    if cfg.max_len < 4:
        fail("max_len", f"must be >= 4, got {cfg.max_len}")
    if cfg.patience < 1:
        fail("patience", f"must be >= 1, got {cfg.patience}")
    if not cfg.lr > 0 or not math.isfinite(cfg.lr):
        fail("lr", f"must be > 0, got {cfg.lr}")
    if cfg.weight_decay < 0:
        fail("weight_decay", f"must be >= 0, got {cfg.weight_decay}")
    if not 0 <= cfg.warmup < 1:
        fail("warmup", f"must be a fraction in [0, 1), got {cfg.warmup}")
    if cfg.clip < 0:
        fail("clip", f"must be >= 0, got {cfg.clip}")
    if cfg.pooling not in POOLINGS:
        fail("pooling", f"unknown pooling {cfg.pooling!r} (known: {', '.join(POOLINGS)})")
    if cfg.split_seed < 0:
        fail("split_seed", f"must be >= 0, got {cfg.split_seed}")
    for key in ("dev_fraction", "test_fraction"):
        if not 0 < getattr(cfg, key) < 0.5:
            fail(key, f"must be in (0, 0.5), got {getattr(cfg, key)}")
    for key in ("max_train_examples", "max_eval_examples"):
        v = getattr(cfg, key)
        if v is not None and v < 2:
            fail(key, f"must be >= 2, got {v}")
    if not (cfg.device in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", cfg.device)):
        fail("device", f"must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")
    if cfg.threads is not None and cfg.threads < 1:
        fail("threads", f"must be >= 1, got {cfg.threads}")
    if not cfg.checkpoint:
        fail("checkpoint", "give a checkpoint folder or a Hub model name")
    if cfg.name is not None and not re.fullmatch(r"[\w.+-]+", cfg.name):
        fail("name", f"use letters, digits and . _ + - only, got {cfg.name!r}")
    from workbench.running.peft_methods import check_method

    check_method(cfg.method, method_options(cfg), where)
    if cfg.freeze_body and cfg.method not in ("full", "head"):
        fail("freeze_body", f"trains the head only, which contradicts method {cfg.method}; give one")
    if cfg.method == "prompt" and cfg.max_len - cfg.prompt_tokens < 4:
        fail("prompt_tokens", f"{cfg.prompt_tokens} prompt tokens leave fewer than 4 of max_len {cfg.max_len}")


def method_options(cfg: FinetuneConfig):
    """The sizes of the config's fine-tuning method (`workbench.running.peft_methods.MethodOptions`)."""
    from workbench.running.peft_methods import MethodOptions

    return MethodOptions(**{k: getattr(cfg, k) for k in METHOD_OPTIONS})


def method_record(cfg: FinetuneConfig) -> dict:
    """The method and the options it reads, as manifests and rows record them."""
    keys = {"lora": ("lora_r", "lora_alpha", "lora_targets", "pooler"), "adapter": ("adapter_size", "adapter_norms", "pooler"),
            "prompt": ("prompt_tokens", "pooler"), "head": ("pooler",), "bitfit": ("pooler",)}
    return {"method": cfg.method, **{k: getattr(cfg, k) for k in keys.get(cfg.method, ())}}


# ------------------------------------------------------------------------------------------ data

@dataclass
class TaskData:
    """A task's examples and its fixed split. `words[i]` is example i as words; `labels[i]` is a
    label index (sentence tasks) or a list of them, one per word (token tasks)."""

    task: str
    kind: str                     # "sentence" or "token"
    ids: list[str]
    words: list[list[str]]
    labels: list                  # int or list[int]
    label_names: list[str]
    splits: dict[str, list[int]]  # split -> example indices (train in training order)
    files: list[Path]
    split_seed: int | None
    metric: str = "accuracy"      # what dev selection and test report: accuracy, or span_f1 (span tasks)

    def split_ids(self) -> dict[str, list[str]]:
        return {s: [self.ids[i] for i in idx] for s, idx in self.splits.items()}


def split_indices(n: int, seed: int, dev_fraction: float, test_fraction: float) -> dict[str, list[int]]:
    """A seeded permutation of range(n) cut into test | dev | train (train keeps the permuted order,
    so its first N are a random sample). Disjoint and covering by construction."""
    perm = np.random.default_rng(seed).permutation(n)
    n_test, n_dev = round(n * test_fraction), round(n * dev_fraction)
    return {"train": perm[n_test + n_dev:].tolist(), "dev": perm[n_test: n_test + n_dev].tolist(),
            "test": perm[:n_test].tolist()}


def load_task(cfg: FinetuneConfig) -> TaskData:
    """The task's examples and split (see the module docstring)."""
    if cfg.task in SENTENCE_TASKS:
        from workbench.data.raw import LABELS, load_labelled_with_ids, source_files

        name = SENTENCE_TASKS[cfg.task]
        pairs = load_labelled_with_ids(name)
        names = list(LABELS[name])
        index = {n: i for i, n in enumerate(names)}
        splits = split_indices(len(pairs), cfg.split_seed, cfg.dev_fraction, cfg.test_fraction)
        return TaskData(cfg.task, "sentence", [i for i, _ in pairs], [ex.text.split() for _, ex in pairs],
                        [index[ex.label] for _, ex in pairs], names, splits, source_files(name), cfg.split_seed)
    if cfg.task in SPAN_TASKS:
        return load_span_task(cfg)
    from workbench.data.conllu import load_treebank, treebank_path

    bank = TOKEN_TASKS[cfg.task]
    ids, words, tags, splits, files = [], [], [], {}, []
    for split in ("train", "dev", "test"):
        start = len(ids)
        for s in load_treebank(bank, split):
            ids.append(f"{bank}/{split}/{s.sent_id}")
            words.append(list(s.words))
            tags.append(list(s.upos))
        splits[split] = list(range(start, len(ids)))
        files.append(treebank_path(bank, split))
    names = sorted({t for ts in tags for t in ts})
    index = {n: i for i, n in enumerate(names)}
    labels = [[index[t] for t in ts] for ts in tags]
    rng = np.random.default_rng(cfg.split_seed)  # the train order (and so a max_train_examples sample)
    splits["train"] = [splits["train"][i] for i in rng.permutation(len(splits["train"]))]
    return TaskData(cfg.task, "token", ids, words, labels, names, splits, files, cfg.split_seed)


def load_span_task(cfg: FinetuneConfig) -> TaskData:
    """CoNLL-2002 named entities (`workbench.data.conll2002`): the shared task's train / testa (dev)
    / testb (test), BIO tags as word labels, the train order shuffled by `split_seed`."""
    from workbench.data.conll2002 import conll2002_path, load_conll2002

    lang = SPAN_TASKS[cfg.task]
    ids, words, tags, splits, files = [], [], [], {}, []
    for split in ("train", "dev", "test"):
        start = len(ids)
        for s in load_conll2002(lang, split):
            ids.append(s.sent_id)
            words.append(list(s.words))
            tags.append(list(s.tags))
        splits[split] = list(range(start, len(ids)))
        files.append(conll2002_path(lang, split))
    names = sorted({t for ts in tags for t in ts})
    index = {n: i for i, n in enumerate(names)}
    rng = np.random.default_rng(cfg.split_seed)
    splits["train"] = [splits["train"][i] for i in rng.permutation(len(splits["train"]))]
    return TaskData(cfg.task, "token", ids, words, [[index[t] for t in ts] for ts in tags], names, splits, files,
                    cfg.split_seed, metric="span_f1")


def used_splits(data: TaskData, cfg: FinetuneConfig) -> dict[str, list[int]]:
    """The example indices a run trains and evaluates on (the caps applied)."""
    out = dict(data.splits)
    if cfg.max_train_examples is not None:
        out["train"] = out["train"][: cfg.max_train_examples]
    if cfg.max_eval_examples is not None:
        out["dev"] = out["dev"][: cfg.max_eval_examples]
        out["test"] = out["test"][: cfg.max_eval_examples]
    return out


# ------------------------------------------------------------------------------------- encoding

@dataclass
class Encoded:
    """Examples as token ids (special tokens included) and labels (token tasks: -100 on every
    position but the first subword of a word)."""

    ids: list[np.ndarray]
    labels: list  # int or np.ndarray per example
    truncated: int = 0
    unlabelled_words: int = 0  # token tasks: words with no subword of their own, or cut off
    span_labels: list[str] | None = None  # span tasks: the BIO tag names, so `evaluate` scores span F1


def encode(handle, data: TaskData, indices: list[int], max_len: int, chunk: int = 256) -> Encoded:
    """Tokenise examples with the model handle's word alignment (`ModelHandle.tokenize_words`),
    cutting content past `max_len` while keeping the closing special tokens."""
    out = Encoded([], [], span_labels=data.label_names if data.metric == "span_f1" else None)
    for c0 in range(0, len(indices), chunk):
        idx = indices[c0: c0 + chunk]
        batch = handle.tokenize_words([data.words[i] or ["."] for i in idx])
        ids_all = batch.input_ids.cpu().numpy()
        wid_all = batch.word_ids.cpu().numpy()
        lens = batch.attention_mask.sum(1).cpu().numpy()
        for b, i in enumerate(idx):
            ids, wid = ids_all[b, : lens[b]], wid_all[b, : lens[b]]
            if len(ids) > max_len:
                out.truncated += 1
                content = np.nonzero(wid >= 0)[0]
                suffix = len(ids) - (content[-1] + 1) if len(content) else 0
                keep = np.r_[np.arange(max_len - suffix), np.arange(len(ids) - suffix, len(ids))]
                ids, wid = ids[keep], wid[keep]
            out.ids.append(ids.astype(np.int64))
            if data.kind == "sentence":
                out.labels.append(int(data.labels[i]))
                continue
            lab = np.full(len(ids), -100, dtype=np.int64)
            first = (wid >= 0) & np.r_[True, wid[1:] != wid[:-1]]
            lab[first] = np.asarray(data.labels[i])[wid[first]]
            out.unlabelled_words += len(data.labels[i]) - int(first.sum())
            out.labels.append(lab)
    return out


def collate(enc: Encoded, rows: list[int], pad_id: int) -> dict[str, torch.Tensor]:
    T = max(len(enc.ids[r]) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    token = not isinstance(enc.labels[rows[0]], int)
    labels = torch.full((len(rows), T), -100, dtype=torch.long) if token else torch.empty(len(rows), dtype=torch.long)
    for b, r in enumerate(rows):
        n = len(enc.ids[r])
        ids[b, :n] = torch.from_numpy(enc.ids[r])
        mask[b, :n] = 1
        if token:
            labels[b, :n] = torch.from_numpy(enc.labels[r])
        else:
            labels[b] = enc.labels[r]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# ---------------------------------------------------------------------------------------- models

def choose_pooling(family: str, kind: str, pooling: str) -> str:
    """The pooling a (family, task kind) uses: `pooling`, or the family's default for "auto"."""
    if kind == "token":
        return "token"
    from workbench.families import find_family

    spec = find_family(family)
    allowed = spec.poolings if spec is not None else DEFAULT_POOLINGS
    if pooling == "auto":
        return allowed[0]
    if pooling not in allowed:
        raise ConfigError(f"pooling {pooling!r} is not available for family {family} (available: {', '.join(allowed)})")
    return pooling


def members(checkpoint: str | Path) -> tuple[list[str], list[str]]:
    """(member ids, non-member ids) of a fine-tuned checkpoint, from its manifest and the run's
    splits.json: members are the training examples it saw; non-members every other example of
    the task (the unused part of the train split, dev and test)."""
    path = Path(checkpoint)
    try:
        m = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
        splits_path = Path(m["finetune"]["splits"])
        splits = json.loads(splits_path.read_text(encoding="utf-8"))
    except (OSError, KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: not a fine-tuned checkpoint with a readable split ({e})") from e
    if sha256_file(splits_path) != m["finetune"]["splits_sha256"]:
        raise CheckpointError(f"{splits_path}: changed since {path} was trained")
    n = m["finetune"]["n_train"]
    mem = splits["ids"]["train"][:n]
    non = splits["ids"]["train"][n:] + splits["ids"]["dev"] + splits["ids"]["test"]
    return mem, non


# -------------------------------------------------------------------------------------- training

def evaluate(model, enc: Encoded, rows: list[int], pad_id: int, batch_size: int) -> tuple[float, int, float]:
    """(score, number of labelled items, mean loss) of `model` on examples `rows`: accuracy, or for
    span tasks (`enc.span_labels`) conlleval's span F1 over the words' first-piece predictions."""
    order = sorted(rows, key=lambda r: len(enc.ids[r]))  # little padding
    correct = total = 0
    loss_sum = 0.0
    gold_tags, pred_tags = [], []
    with evaluating(model):
        for b0 in range(0, len(order), batch_size):
            batch = to_model_device(collate(enc, order[b0: b0 + batch_size], pad_id), model)
            out = model(**batch)
            pred = out.logits.argmax(-1)
            keep = batch["labels"] != -100
            correct += int((pred[keep] == batch["labels"][keep]).sum())
            k = int(keep.sum())
            total += k
            loss_sum += float(out.loss) * k
            if enc.span_labels is not None:
                for g, p, m in zip(batch["labels"].tolist(), pred.tolist(), keep.tolist()):
                    gold_tags.append([enc.span_labels[x] for x, keep_x in zip(g, m) if keep_x])
                    pred_tags.append([enc.span_labels[x] for x, keep_x in zip(p, m) if keep_x])
    if enc.span_labels is not None:
        from workbench.conlleval import span_f1

        return span_f1(gold_tags, pred_tags).f1, total, (loss_sum / total if total else float("nan"))
    return (correct / total if total else float("nan")), total, (loss_sum / total if total else float("nan"))


def to_model_device(batch: dict, model) -> dict:
    """`batch`'s tensors moved to the device of `model`'s parameters."""
    device = next(model.parameters()).device
    return {k: v.to(device) for k, v in batch.items()}


def evaluate_count(enc: Encoded) -> int:
    """How many labelled items `evaluate` scores on `enc` (examples, or labelled tokens)."""
    return sum(1 if isinstance(y, int) else int((y != -100).sum()) for y in enc.labels)


def epoch_order(seed: int, epoch: int, n: int) -> np.ndarray:
    """The order the training examples 0..n-1 are visited in epoch `epoch` of seed `seed`: a
    permutation from its own generator (seeded by seed and epoch), so a resumed run and a script
    that replays the loop see the same batches."""
    return np.random.default_rng([seed, epoch, 7211]).permutation(n)


def save_resume_state(folder: Path, model, optimizer, scheduler, loop: dict) -> None:
    """Write what `run_finetune` resumes a seed from (weights, optimizer, schedule, loop counters);
    public because a pruning sweep writes it too, to retrain a ticket from a rewind step k with the
    schedule continuing at k (workbench.drivers.prune_sweep)."""
    with atomic_dir(folder) as tmp:
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"scheduler": scheduler.state_dict(), "torch_rng": torch.get_rng_state(),
                    "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
                    "loop": json.dumps(loop)}, tmp / "state.pt")


def _load_state(folder: Path, model, optimizer, scheduler) -> dict:
    try:
        model.load_state_dict(torch.load(folder / "model.pt", weights_only=True, map_location="cpu"))
        optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True, map_location="cpu"))
        state = torch.load(folder / "state.pt", weights_only=True, map_location="cpu")
    except (OSError, RuntimeError, EOFError) as e:
        raise CheckpointError(f"{folder}: cannot load the fine-tuning state ({e}); delete it to start the seed over") from e
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    return json.loads(state["loop"])


def _save_checkpoint(folder: Path, model, tokenizer, manifest: dict, method: dict | None = None) -> None:
    """A plain checkpoint of `model`; with a fine-tuning `method` record (`method_record`) other than
    full, the plain architecture `workbench.running.peft_methods.plain_copy` makes of it (LoRA merged,
    adapters in a file beside it, prompt rows in the vocabulary) and the record in the manifest."""
    if method is None or method["method"] == "full":
        with atomic_dir(folder) as tmp:
            write_model_folder(tmp, model, tokenizer, manifest)
        return
    from workbench.running.peft_methods import plain_copy, save_extra

    plain, tokenizer, record = plain_copy(model, tokenizer, method["method"])
    with atomic_dir(folder) as tmp:
        write_model_folder(tmp, plain, tokenizer, {**manifest, "peft": {**method, **save_extra(tmp, record)}})


def finetune_cost_basis(handle, family: str, train: Encoded, num_labels: int, method: str = "full",
                        classifier: str | None = None) -> dict:
    """Training FLOPs per token of this fine-tuning with `method` (`workbench.cost.finetune_flops`:
    each part's forward times the passes the method needs, at the train examples' mean length as
    the attention span; None when the body is not counted), for the classifier kind that runs
    (`classifier`: the pooling, "token" for token tasks; a T5/BART encoder head runs no decoder). The method's own matrices (LoRA,
    adapters) are added once they are attached (`workbench.cost.with_method_modules`)."""
    from workbench.cost import finetune_flops, kaplan_flops_per_token

    mean_len = float(np.mean([len(x) for x in train.ids])) if train.ids else 0.0
    flops = finetune_flops(family, handle.model.config.to_dict(), max(1, round(mean_len)), num_labels, method,
                           classifier=classifier)
    try:  # Kaplan et al. (2020)'s 6N of the classifier that runs, kept beside the full count
        kaplan = kaplan_flops_per_token(family, handle.model.config.to_dict(), classifier)
    except KeyError:
        kaplan = None
    return {"flops_per_token": None if flops is None else flops["total"], "mean_train_length": mean_len,
            "flops": flops, "kaplan_flops_per_token": kaplan}


def finetune_cost(run: Prepared, meter, tokens: int, seconds: float, hooks: dict | None = None,
                  teacher_tokens: int | None = None) -> dict:
    """The fine-tuned checkpoint's `cost` record: own (FLOPs x tokens trained, a distillation
    teacher's forwards over `teacher_tokens` included; device, energy) plus the base checkpoint's
    total and a distillation teacher's (`workbench.cost.cost_record`)."""
    from workbench.cost import cost_record, finetune_cost_flops, own_cost, teacher_folder

    fpt = run.manifest_base["cost_basis"]["flops_per_token"]
    flops = finetune_cost_flops(run.manifest_base["cost_basis"], tokens, teacher_folder(hooks), teacher_tokens)
    joules, source = meter.reading()
    own = own_cost(flops=flops, flops_per_token=fpt, tokens=tokens, seconds=seconds,
                   device=meter.info, energy_joules=joules, energy_source=source, what=f"fine-tuning ({run.data.task})",
                   kaplan_per_token=run.manifest_base["cost_basis"].get("kaplan_flops_per_token"))
    return cost_record(own, run.checkpoint, teacher=teacher_folder(hooks))


def classification_loss(out, batch) -> dict[str, torch.Tensor]:
    """The classifier's own cross-entropy (transformers computes it from `labels`)."""
    return {"loss": out.loss}


def trainable_filter(cfg: FinetuneConfig, model, hooks: TrainingHooks):
    """The parameter filter of a run: `freeze_body` (train the head only), the fine-tuning method's
    (`workbench.running.peft_methods.attach`, which adds the modules the method trains to `model`), or the
    hooks' own."""
    from workbench.running.peft_methods import attach

    if cfg.freeze_body and hooks.trainable is not None:
        raise ConfigError(f"freeze_body and a parameter filter ({hooks.trainable.name}) both choose what trains; "
                          f"give one")
    if cfg.freeze_body:
        return outside(getattr(model, model.base_model_prefix), "head_only")
    if cfg.method != "full" and hooks.trainable is not None:
        raise ConfigError(f"method {cfg.method} and a parameter filter ({hooks.trainable.name}) both choose what "
                          f"trains; give one")
    return attach(model, cfg.method, method_options(cfg)) if cfg.method != "full" else hooks.trainable


@dataclass
class SeedResult:
    seed: int
    curve: list[dict]          # per epoch: epoch, step, dev_accuracy, train_loss
    best_epoch: int
    best_step: int
    dev: dict                  # accuracy, n
    test: dict
    checkpoint: str
    seconds: float
    trainable: dict | None = None  # count_trainable's record (older result files lack it)


def _end_epoch(cfg: FinetuneConfig, run: Prepared, seed: int, out: Path, model, loop: dict, manifest: dict,
               method: dict | None, cost: Callable[[int], dict]) -> None:
    """The end of an epoch of `train_seed`: dev accuracy, the curve's point, the epoch's and the
    best checkpoint, early stopping; `loop` is updated in place (the next epoch starts at batch 0).

    `cost(epoch)` is the checkpoint's cost record, called after the dev pass so its seconds and
    energy include it. Apart from the step loop because it runs once per epoch and only reads the
    running sums `train_seed` has already put into `loop`.
    """
    from workbench.progress import get_logger

    metric = run.data.metric
    acc, _, _ = evaluate(model, run.dev, list(range(len(run.dev.ids))), run.pad_id, cfg.batch_size)
    epoch = loop["epoch"] + 1
    loop["curve"].append({"epoch": epoch, "step": loop["step"], f"dev_{metric}": acc,
                          "train_loss": loop["loss_sum"] / max(1, loop["loss_n"])})
    if "term_sums" in loop:
        loop["curve"][-1]["train_terms"] = {k: v / max(1, loop["loss_n"]) for k, v in loop["term_sums"].items()}
        loop["term_sums"] = {}
    ck_manifest = {**manifest, "epoch": epoch, "step": loop["step"], f"dev_{metric}": acc, "cost": cost(epoch)}
    if cfg.keep_epoch_checkpoints:
        _save_checkpoint(step_dir(out, loop["step"]), model, run.tokenizer, ck_manifest, method)
    if acc > loop["best"]:
        loop.update(best=acc, best_epoch=epoch, best_step=loop["step"], bad_epochs=0)
        _save_checkpoint(out / BEST_DIR, model, run.tokenizer, ck_manifest, method)
    else:
        loop["bad_epochs"] += 1
        loop["stopped"] = loop["bad_epochs"] >= cfg.patience
    if cfg.progress:
        get_logger(__name__).info(f"{run.name} seed {seed} epoch {epoch}: dev {metric} {acc:.4f} "
                                  f"(best {loop['best']:.4f} at epoch {loop['best_epoch']})")
    loop.update(epoch=epoch, batch=0, loss_sum=0.0, loss_n=0)


def train_seed(cfg: FinetuneConfig, seed: int, run: Prepared,
               on_step: Callable[[int], None] | None = None, hooks: TrainingHooks | None = None) -> SeedResult:
    """Fine-tune one seed (resuming its saved state if any) and return its results.

    `on_step(step)` is called after every optimizer step (a test interrupts training through it);
    `hooks` (`workbench.loop.TrainingHooks`) add an after-step hook, a teacher and the loss that
    reads it, or a parameter filter; a composite loss's terms are kept per epoch in the curve."""
    from workbench.progress import progress

    hooks = hooks or NO_HOOKS
    out = seed_dir(run.folder, seed)
    done = out / "result.json"
    if done.is_file():
        return SeedResult(**json.loads(done.read_text(encoding="utf-8")))
    # ---- setup: model under a fresh head, what trains, optimizer, schedule, resume
    t0 = time.time()
    from workbench.cost import EnergyMeter, device_info, teacher_tokens, with_method_modules

    metric = run.data.metric
    torch.manual_seed(seed)
    model = build_classifier(run.checkpoint, run.family, run.data.kind, run.pooling, run.data.label_names,
                             run.pad_id)
    trainable = apply_param_filter(model, trainable_filter(cfg, model, hooks))
    run.manifest_base["cost_basis"] = with_method_modules(run.manifest_base["cost_basis"], model)  # LoRA, adapters
    model.to(run.device)
    method = method_record(cfg)
    optimizer = adamw(model.named_parameters(), cfg.lr, cfg.weight_decay)
    prepare_teacher(hooks, run.device)
    train_rows = list(range(len(run.train.ids)))
    per_epoch = math.ceil(len(train_rows) / cfg.batch_size)
    total = per_epoch * cfg.epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_warmup_decay(round(cfg.warmup * total), total))
    loop = {"epoch": 0, "batch": 0, "step": 0, "loss_sum": 0.0, "loss_n": 0, "curve": [],
            "best": -1.0, "best_epoch": -1, "best_step": 0, "bad_epochs": 0, "stopped": False}
    if hooks.loss is not None:
        loop["term_sums"] = {}  # every term of a composite loss, summed over the epoch's steps
    if (out / STATE_DIR).is_dir():
        loop = _load_state(out / STATE_DIR, model, optimizer, scheduler)
    seconds_before = loop.get("seconds", 0.0)
    meter = EnergyMeter(device_info(run.device), already_joules=loop.get("energy_joules"))

    # The epoch's running loss sums stay on the device (float64: the same additions, in the same order,
    # as Python floats): reading a loss every step would make a GPU wait for each step before the
    # host could queue the next. They are read into `loop` only where it is saved or the epoch ends.
    def on_device(value: float) -> torch.Tensor:
        return torch.tensor(value, dtype=torch.float64, device=run.device)

    def read_sums() -> None:
        loop["loss_sum"] = float(loss_sum)
        if "term_sums" in loop:
            loop["term_sums"] = {k: float(v) for k, v in term_sums.items()}

    loss_sum = on_device(loop["loss_sum"])
    term_sums = {k: on_device(v) for k, v in loop.get("term_sums", {}).items()}
    last_shown = 0.0

    def save_state():
        read_sums()
        loop["seconds"] = seconds_before + time.time() - t0
        loop["energy_joules"] = meter.reading()[0]
        save_resume_state(out / STATE_DIR, model, optimizer, scheduler, loop)

    manifest = {**run.manifest_base, "seed": seed, "trainable": trainable}
    if hooks.describe():
        manifest["hooks"] = hooks.describe()
    bar = progress(total=total, initial=loop["step"], desc=f"{run.name} seed {seed}", unit="step", disable=not cfg.progress)
    # ---- the epochs: steps, then evaluate on dev and save
    while loop["epoch"] < cfg.epochs and not loop["stopped"]:
        order = epoch_order(seed, loop["epoch"], len(train_rows))
        model.train()
        while loop["batch"] < per_epoch:
            b0 = loop["batch"] * cfg.batch_size
            host_batch = collate(run.train, [train_rows[i] for i in order[b0: b0 + cfg.batch_size]], run.pad_id)
            # tokens for the cost record, counted on the host copy (no wait for the device)
            loop["tokens"] = loop.get("tokens", 0) + int(host_batch["attention_mask"].sum())
            batch = to_model_device(host_batch, model)
            terms = loss_terms(model, batch, hooks, classification_loss)
            terms["loss"].backward()
            optimizer_step(model, optimizer, scheduler, cfg.clip, hooks, loop["step"] + 1)
            loop["batch"] += 1
            loop["step"] += 1
            loss_sum += terms["loss"].detach().double()
            loop["loss_n"] += 1
            if "term_sums" in loop:
                for k, v in terms.items():
                    term_sums[k] = term_sums[k] + v.detach().double() if k in term_sums else v.detach().double()
            bar.update(1)
            if cfg.progress and time.monotonic() - last_shown >= 2.0:  # the only per-step read, and only when shown
                last_shown = time.monotonic()
                bar.set_postfix(loss=f"{float(terms['loss'].detach()):.3f}", epoch=loop["epoch"])
            if loop["step"] % cfg.save_every == 0 and loop["batch"] < per_epoch:
                save_state()
            if on_step is not None:
                on_step(loop["step"])
        # end of an epoch: dev accuracy, best checkpoint, early stopping
        read_sums()
        _end_epoch(cfg, run, seed, out, model, loop, manifest, method, lambda epoch: finetune_cost(
            run, meter, loop.get("tokens", 0), seconds_before + time.time() - t0, manifest.get("hooks"),
            teacher_tokens(hooks.teacher, loop.get("tokens", 0), epoch)))
        loss_sum, term_sums = on_device(0.0), {}
        save_state()
    bar.close()
    # test accuracy of the best epoch, read back from its saved checkpoint (its dev accuracy is the curve's best)
    best = load_classifier(out / BEST_DIR).to(run.device)
    dev_acc, dev_n = loop["best"], evaluate_count(run.dev)
    test_acc, test_n, _ = evaluate(best, run.test, list(range(len(run.test.ids))), run.pad_id, cfg.batch_size)
    res = SeedResult(seed, loop["curve"], loop["best_epoch"], loop["best_step"], {metric: dev_acc, "n": dev_n},
                     {metric: test_acc, "n": test_n}, str(out / BEST_DIR), round(seconds_before + time.time() - t0, 2),
                     trainable)
    atomic_write_json(done, dataclasses.asdict(res))
    shutil.rmtree(out / STATE_DIR, ignore_errors=True)
    return res


# ------------------------------------------------------------------------------------- baselines

def baselines(data: TaskData, splits: dict[str, list[int]]) -> list[dict]:
    """Majority class, and a bag-of-words logistic regression (sentences: tf-idf of word uni- and
    bigrams, C chosen on dev from {0.25, 1, 4}) or the most frequent tag of each word form (UPOS;
    unseen words get the majority tag), all trained on the same training examples as the model."""
    rows = []
    train = splits["train"]
    if data.kind == "sentence":
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        y = {s: np.array([data.labels[i] for i in idx]) for s, idx in splits.items()}
        majority = int(np.bincount(y["train"]).argmax())
        texts = {s: [" ".join(data.words[i]) for i in idx] for s, idx in splits.items()}
        vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, token_pattern=r"\S+", lowercase=True)
        X = {"train": vec.fit_transform(texts["train"])}
        X.update({s: vec.transform(texts[s]) for s in ("dev", "test")})
        fits = {c: LogisticRegression(C=c, max_iter=2000).fit(X["train"], y["train"]) for c in (0.25, 1.0, 4.0)}
        best_c = max(fits, key=lambda c: (fits[c].score(X["dev"], y["dev"]), -c))
        for s in ("dev", "test"):
            rows.append(("majority", s, float(np.mean(y[s] == majority)), len(y[s]), {"label": data.label_names[majority]}))
            rows.append(("bow_logreg", s, float(fits[best_c].score(X[s], y[s])), len(y[s]), {"C": best_c, "ngrams": [1, 2]}))
    else:
        from collections import Counter, defaultdict

        tag_counts = Counter(t for i in train for t in data.labels[i])
        majority = tag_counts.most_common(1)[0][0]
        per_word: dict[str, Counter] = defaultdict(Counter)
        for i in train:
            for w, t in zip(data.words[i], data.labels[i]):
                per_word[w][t] += 1
        word_tag = {w: c.most_common(1)[0][0] for w, c in per_word.items()}
        if data.metric == "span_f1":  # the same two taggers, scored as spans (conlleval)
            from workbench.conlleval import span_f1

            names = data.label_names
            for s in ("dev", "test"):
                gold = [[names[t] for t in data.labels[i]] for i in splits[s]]
                n_gold = sum(len(g) for g in gold)
                tagged = {"majority": [[names[majority]] * len(g) for g in gold],
                          "word_majority": [[names[word_tag.get(w, majority)] for w in data.words[i]] for i in splits[s]]}
                for model_name, pred in tagged.items():
                    sc = span_f1(gold, pred)
                    rows.append((model_name, s, sc.f1, n_gold, {"precision": sc.precision, "recall": sc.recall,
                                                                 "label": names[majority]}))
            return [{"model": m, "family": "baseline", "probe": PROBE, "task": data.task, "split": s,
                     "metric": "span_f1", "value": v, "n": n, "extra": extra} for m, s, v, n, extra in rows]
        for s in ("dev", "test"):
            gold = [(w, t) for i in splits[s] for w, t in zip(data.words[i], data.labels[i])]
            rows.append(("majority", s, float(np.mean([t == majority for _, t in gold])), len(gold),
                         {"label": data.label_names[majority]}))
            rows.append(("word_majority", s, float(np.mean([word_tag.get(w, majority) == t for w, t in gold])),
                         len(gold), {}))
    return [{"model": m, "family": "baseline", "probe": PROBE, "task": data.task, "split": s, "metric": "accuracy",
             "value": v, "n": n, "extra": extra} for m, s, v, n, extra in rows]


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): Student-t interval over seeds; NaN bounds for a single seed (`workbench.store.aggregate`)."""
    from workbench.store.aggregate import t_interval as interval

    return interval(values, confidence)


# -------------------------------------------------------------------------------------- the run

@dataclass
class Prepared:
    """Everything a seed run shares: resolved checkpoint, tokenizer, encoded splits, folder."""

    name: str
    folder: Path
    checkpoint: Path
    model_name: str               # what the rows call the base model
    device: torch.device
    family: str
    pooling: str
    tokenizer: Any
    pad_id: int
    data: TaskData
    splits: dict[str, list[int]]
    train: Encoded
    dev: Encoded
    test: Encoded
    manifest_base: dict


def run_slug(text: str) -> str:
    """`text` as a run-folder name part: runs of characters other than word characters, `.`, `+`
    and `-` become one `_` ("model" when nothing is left)."""
    return re.sub(r"[^\w.+-]+", "_", text).strip("_") or "model"


def prepare(cfg: FinetuneConfig, data: TaskData | None = None, hooks: TrainingHooks | None = None) -> Prepared:
    """Resolve the checkpoint, load and split the task (or take `data`, e.g. a planted task in a
    test), tokenise, and claim the run folder (for this config and these training hooks)."""
    from workbench.store.checkpoints import checkpoint_name
    from workbench.running.models import ModelHandle
    from workbench.paths import runs_root

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    path = single_checkpoint(cfg.checkpoint)
    handle = ModelHandle.load(path)
    family = handle.family
    pooling = choose_pooling(family, "sentence" if cfg.task in SENTENCE_TASKS else "token", cfg.pooling)
    # a folder is named as the workbench names checkpoints; a Hub name stays as it was given
    model_name = checkpoint_name(path) if Path(cfg.checkpoint).expanduser().exists() else cfg.checkpoint
    name = cfg.name or f"{cfg.task}-{run_slug(model_name)}" + ("" if cfg.method == "full" else f"-{cfg.method}")
    folder = Path(cfg.output_dir) if cfg.output_dir else runs_root() / "finetune" / name
    data = data or load_task(cfg)
    splits = used_splits(data, cfg)

    # the folder belongs to one config: a rerun resumes it, a different config is refused
    folder.mkdir(parents=True, exist_ok=True)
    key = {"training_hash": cfg.training_hash(), "checkpoint": str(path)}
    if hooks is not None and hooks.describe():
        key["hooks"] = hooks.describe()
    cfg_file = folder / "config.json"
    if cfg_file.is_file():
        old = json.loads(cfg_file.read_text(encoding="utf-8"))
        recorded = {k: old.get(k) for k in ("training_hash", "checkpoint", "hooks") if k in old or k in key}
        if recorded != key:
            raise ConfigError(f"{folder}: holds a fine-tuning run with another config, checkpoint or hooks; "
                              f"choose another --name or delete the folder")
    else:
        atomic_write_json(cfg_file, {**key, "config": cfg.to_dict()})
    split_file = folder / "splits.json"
    split_doc = {"task": cfg.task, "split_seed": data.split_seed, "label_names": data.label_names,
                 "ids": data.split_ids()}
    if not split_file.is_file():
        atomic_write_json(split_file, split_doc)
    elif json.loads(split_file.read_text(encoding="utf-8")) != json.loads(json.dumps(split_doc)):
        raise ConfigError(f"{split_file}: the split on disk differs from this run's (data changed?)")

    max_len = min(cfg.max_len, handle.max_length)
    n_prompt = cfg.prompt_tokens if cfg.method == "prompt" else 0
    enc = {s: encode(handle, data, idx, max_len - n_prompt) for s, idx in splits.items()}
    if n_prompt:
        # prompt tuning: n ids past the vocabulary, right after the tokenizer's prefix ([CLS], <s>)
        from workbench.running.peft_methods import insert_prompt

        first = handle.model.get_input_embeddings().num_embeddings
        ids = list(range(first, first + n_prompt))
        for e in enc.values():
            for i in range(len(e.ids)):
                e.ids[i], e.labels[i] = insert_prompt(e.ids[i], e.labels[i], ids, len(handle._prefix))
    manifest_base = {
        "kind": "finetune", "family": family, "task": cfg.task, "task_kind": data.kind, "pooling": pooling,
        "label_names": data.label_names, "base_checkpoint": str(path), "base_checkpoint_sha256": handle.checkpoint_hash,
        "finetune": {"splits": str(split_file), "splits_sha256": sha256_file(split_file),
                     "n_train": len(splits["train"]), "config": cfg.to_dict(), "method": cfg.method},
    }
    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          "cpu" if cfg.device == "auto" else cfg.device)
    manifest_base["cost_basis"] = finetune_cost_basis(handle, family, enc["train"], len(data.label_names),
                                                      "head" if cfg.freeze_body else cfg.method, pooling)
    return Prepared(name, folder, path, model_name, device, family, pooling, handle.tokenizer, handle.pad_id, data, splits,
                    enc["train"], enc["dev"], enc["test"], manifest_base)


@dataclass
class FinetuneResult:
    run_id: str
    rows: Any  # pandas DataFrame
    seeds: list[SeedResult]
    folder: Path


def train_seed_unit(cfg: FinetuneConfig, seed: int, data: TaskData | None = None,
                    hooks: TrainingHooks | None = None) -> SeedResult:
    """One seed as an executor unit (a local process or a submitit job): the run prepared again (the
    parent claimed the folder and wrote the split; this finds them), then `train_seed`. A seed's
    weights depend on its seed alone (data order, head, dropout), so they equal the in-process ones."""
    return train_seed(cfg, seed, prepare(cfg, data, hooks), hooks=hooks)


def finetune_units(cfg: FinetuneConfig, store=None, data: TaskData | None = None, hooks: TrainingHooks | None = None,
                   on_step: Callable[[int], None] | None = None):
    """The driver's units (`DriverSpec.units`): the run prepared (folder claimed, split written,
    baselines computed), then one unit per seed: `train_seed` on the prepared run in this process,
    `train_seed_unit` with one torch thread in a worker."""
    import pandas as pd

    from workbench.drivers.executor import Unit, UnitPlan, replace_threads

    run = prepare(cfg, data, hooks)
    base_rows = baselines(run.data, run.splits) if cfg.baselines else []
    if cfg.baselines and cfg.progress:  # a message while it runs: the command prints every row at the end
        from workbench.progress import get_logger

        get_logger(__name__).info("baselines:\n%s", format_table(pd.DataFrame(base_rows)))

    def units(parallel: bool) -> list:
        if not parallel:
            return [Unit(train_seed, (cfg, s, run), {"on_step": on_step, "hooks": hooks}, name=f"seed {s}")
                    for s in cfg.seeds]
        worker_cfg = replace_threads(cfg)
        return [Unit(train_seed_unit, (worker_cfg, s, data, hooks), name=f"seed {s}") for s in cfg.seeds]

    return UnitPlan(units, len(cfg.seeds), run.folder, desc="seeds", state=(run, base_rows))


def run_finetune(cfg: FinetuneConfig, store=None, on_step: Callable[[int], None] | None = None,
                 data: TaskData | None = None, hooks: TrainingHooks | None = None,
                 executor=None) -> FinetuneResult:
    """Fine-tune every seed of `cfg`, then write one results-store run (rows + manifest).

    `data` replaces the task's own examples and split (tests plant a task in it); `hooks` as in
    `train_seed`; `executor` (`workbench.drivers.executor.ExecutorOptions`, default: this process) runs the
    seeds as independent units (`finetune_units`, `collect`)."""
    from workbench.drivers.executor import run_plan

    plan = finetune_units(cfg, store, data, hooks, on_step)
    return collect(cfg, store, plan, run_plan(plan, executor))


def collect(cfg: FinetuneConfig, store, plan, results: list[SeedResult]) -> FinetuneResult:
    """The driver's rows from its seeds' results (`DriverSpec.collect`): one results-store run."""
    import pandas as pd

    from workbench.store.results import ResultsStore

    run, base_rows = plan.state
    store = store or ResultsStore()
    common = {"model": run.model_name, "family": run.family, "probe": PROBE, "task": cfg.task}
    metric = run.data.metric
    rows = list(base_rows)
    for r in results:
        for s in ("dev", "test"):
            rows.append({**common, "seed": r.seed, "step": r.best_step, "split": s, "metric": metric,
                         "value": getattr(r, s)[metric], "n": getattr(r, s)["n"],
                         "extra": {"best_epoch": r.best_epoch, "checkpoint": r.checkpoint, "pooling": run.pooling,
                                   **method_record(cfg), "trainable": (r.trainable or {}).get("parameters"),
                                   "total_parameters": (r.trainable or {}).get("total")}})
        for c in r.curve:
            rows.append({**common, "seed": r.seed, "step": c["step"], "split": "dev", "metric": f"{metric}_epoch",
                         "value": c[f"dev_{metric}"], "n": len(run.dev.ids), "extra": {"epoch": c["epoch"]}})
            rows.append({**common, "seed": r.seed, "step": c["step"], "split": "train", "metric": "train_loss_epoch",
                         "value": c["train_loss"], "n": len(run.train.ids), "extra": {"epoch": c["epoch"]}})
    # per-seed rows only: the mean over seeds with its 95% t-interval is computed where it is shown
    # (`workbench.store.aggregate`: `format_table`, the app's fine-tuning page)
    with store.start_run("finetune", cfg.to_dict(), seeds=cfg.seeds, data_files=run.data.files,
                         checkpoints=[run.checkpoint], name=run.name) as writer:
        writer.add(rows)
        writer.note("splits", {"split_seed": run.data.split_seed, "label_names": run.data.label_names,
                               "ids": {s: [run.data.ids[i] for i in idx] for s, idx in run.splits.items()},
                               "file": str(run.folder / "splits.json")})
        writer.note("encoding", {"truncated": {s: getattr(run, s).truncated for s in ("train", "dev", "test")},
                                 "unlabelled_words": {s: getattr(run, s).unlabelled_words for s in ("train", "dev", "test")}})
        writer.note("seeds", [dataclasses.asdict(r) for r in results])
        writer.note("folder", str(run.folder))
        run_id = writer.run_id
    return FinetuneResult(run_id, pd.DataFrame(rows), results, run.folder)


def format_table(rows) -> str:
    """Accuracy by model and split: per-seed values, mean and t-interval (baselines included)."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df = df[df["metric"].isin(("accuracy", "span_f1"))]  # span tasks report span F1
    score = "span_f1" if (df["metric"] == "span_f1").any() else "accuracy"
    lines = [f"{'model':<34} {'split':<5} {score:>9}  {'95% CI over seeds':<19} per seed"]
    for (model, split), g in df.groupby(["model", "split"], sort=False):
        seeded = g[g["seed"].notna()] if "seed" in g else g.iloc[0:0]
        agg = g[g["seed"].isna()] if "seed" in g else g  # a baseline's one seed-less row
        if agg.empty and len(seeded):  # per-seed rows: the mean over seeds and its 95% t-interval
            from workbench.store.aggregate import aggregate

            agg = aggregate(seeded, over="seed", by=["model", "split"], interval="t")
        value = float(agg["value"].iloc[0]) if len(agg) else float(seeded["value"].mean())
        ci = ""
        if len(agg) and "ci_low" in agg and pd.notna(agg["ci_low"].iloc[0]):
            ci = f"[{agg['ci_low'].iloc[0]:.4f}, {agg['ci_high'].iloc[0]:.4f}]"
        per = " ".join(f"{v:.4f}" for v in seeded["value"]) if len(seeded) else ""
        lines.append(f"{str(model)[:34]:<34} {split:<5} {value:>9.4f}  {ci:<19} {per}")
    return "\n".join(lines)


def report(result) -> str:
    """What `bertology finetune` prints: the per-seed table and where the run went."""
    return f"{format_table(result.rows)}\nrun {result.run_id}; checkpoints under {result.folder}"


DRIVER = DriverSpec("finetune", FinetuneConfig, load_finetune_config, run_finetune, report,
                    identity=FinetuneConfig.training_hash, units=finetune_units, collect=collect)
