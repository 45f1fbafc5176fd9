"""Shadow models for LiRA (Carlini et al. 2022): N models of one training config, each on a random half of a pool.

A shadow set is a folder:

    <out>/shadows.json          pool (sources, documents per source, seed), the keep matrix's seed,
                                the training config, and one entry per model (checkpoint, corpus)
    <out>/corpus-II/            model II's corpus split in the corpus builder's format: train.jsonl =
                                the pool documents it trains on, heldout.jsonl = the rest, manifest.json
    <out>/model-II/seed-S/...   an ordinary training run (`workbench.drivers.train.train_seed`): its checkpoint
                                manifests reference corpus-II, so membership is read from manifests,
                                exactly as for any backend checkpoint

Every pool document is in the training half of exactly ceil(N/2) models (`balanced_keep`: for each
document, a seeded random order of the models, the first half train on it), so online LiRA has IN
and OUT models for every document. Any model of the set can serve as the target and the others as
its shadows (the evaluation of Carlini et al.). Training reuses the backend's one loop with a
corpus-split override: `train_seed(cfg, seed, data=...)` with this set's corpus and a tokenizer
trained on its train half (as the backend does), so a shadow differs from a backend model only
in which documents it saw. Rerunning finishes an interrupted set (finished models are kept).

Fine-tuned classifiers (`train_finetune_shadow_set`, record kind "finetune"): the pool is a seeded
sample of the task's train split (dev and test stay out: they pick each model's epoch and report its
accuracy, and no model trains on them); model m is `bertology finetune`'s recipe (`workbench.drivers.finetune`,
one config for all) on the pool examples `balanced_keep(...)[m]` selects. Its `splits.json` lists
train = its IN half followed by its OUT half and `n_train` = the IN half, so `finetune.members`
reads IN = members, OUT (and dev/test) = non-members from the checkpoint as for any fine-tuned model.
Layout `<out>/model-II/seed-S/{best,step-NNNNNNN}` (S = m, unpadded: `checkpoints.seed_dir`); `use`
picks the recorded checkpoint of each model: "best" (best dev epoch, what `bertology finetune`
reports) or "last" (the last epoch's step folder, which must exist).

`bertology shadows CONFIG.yaml` (or `python -m workbench.drivers.shadows CONFIG.yaml`) trains the set
a YAML file describes (its `shadows:` mapping: train (a training config), pool {sources,
max_documents, seed}, n_models, seed, out; or for classifiers finetune (a fine-tuning config), pool
{max_examples, seed}, use, n_models, seed, out). It is a driver (`DRIVER`, `workbench.drivers.spec`):
the models are its units, so `--jobs N` trains N at once in local processes and `--executor slurm`
one Slurm job each. The parent writes every model's corpus split (and the pool's tokenizer corpus)
first; a unit trains one model (a worker opens what the parent wrote and trains the pool's tokenizer
again: the same data, the same tokenizer) and returns its entry of shadows.json, which the parent
writes once every model is done. A model's weights depend on its index alone, wherever it runs.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workbench.drivers.spec import NOT_IDENTITY, DriverSpec
from workbench.errors import ConfigError, DataFormatError
from workbench.io import atomic_write_json, sha256_file

SET_FILE = "shadows.json"
SET_FORMAT = 1


def balanced_keep(n_documents: int, n_models: int, seed: int) -> np.ndarray:
    """[n_models, n_documents] bool: model m trains on document d. For each document a seeded
    random order of the models; the first ceil(n_models / 2) in that order train on it."""
    if n_models < 2:
        raise ConfigError(f"a shadow set needs at least 2 models, got {n_models}")
    rng = np.random.default_rng(seed)
    order = rng.random((n_models, n_documents)).argsort(0).argsort(0)  # rank of each model per document
    return order < (n_models + 1) // 2


def pool_documents(sources: list[str], max_documents: int | None, seed: int):
    """The pool: per source a seeded sample of `max_documents` documents (all when None), in source order."""
    from workbench.data.raw import RAW_CORPORA, load_documents

    unknown = [s for s in sources if s not in RAW_CORPORA]
    if unknown or not sources:
        raise ConfigError(f"shadow pool: unknown or no sources {unknown or sources}; known: {sorted(RAW_CORPORA)}")
    docs = []
    for s in sources:
        got = load_documents(s)
        if max_documents is not None and max_documents < len(got):
            idx = np.sort(np.random.default_rng([seed, zlib.crc32(s.encode())]).permutation(len(got))[:max_documents])
            got = [got[i] for i in idx]
        docs += got
    return docs


def write_corpus_split(out_dir: Path, train, heldout, sources: list[str], method: str, seed: int):
    """A corpus folder in `workbench.data.corpus`'s format (train.jsonl, heldout.jsonl, manifest.json)
    from explicit document lists; returns the loaded `CorpusSplit`."""
    from workbench.data.corpus import MANIFEST_FORMAT, text_counts, write_corpus
    from workbench.data.raw import source_files
    from workbench.paths import data_root

    root = data_root()
    manifest = {
        "format": MANIFEST_FORMAT, "sources": list(sources), "seed": seed, "max_documents": None,
        "heldout_fraction": round(len(heldout) / max(1, len(train) + len(heldout)), 6),
        "split_method": method,
        "doc_ids": {"train": [d.doc_id for d in train], "heldout": [d.doc_id for d in heldout]},
        "source_files": {s: {str(p.relative_to(root)): sha256_file(p) for p in source_files(s)} for s in sources},
        "counts": {"train": text_counts(train), "heldout": text_counts(heldout)},
    }
    return write_corpus(out_dir, {"train": train, "heldout": heldout}, manifest)


@dataclass
class ShadowSet:
    """A trained shadow set: its folder, the record in shadows.json, each model's final checkpoint."""

    folder: Path
    record: dict
    checkpoints: list[Path]

    @property
    def kind(self) -> str:
        """"pretrain" (language models on corpus halves) or "finetune" (classifiers on task halves)."""
        return self.record.get("kind", "pretrain")

    @classmethod
    def load(cls, folder: str | Path) -> ShadowSet:
        folder = Path(folder)
        path = folder / SET_FILE
        if not path.is_file():
            raise DataFormatError(path, None, "not a shadow set (no shadows.json); train one with python -m workbench.drivers.shadows")
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            ckpts = [folder / m["checkpoint"] for m in record["models"]]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DataFormatError(path, None, f"not a shadow-set record ({e})") from None
        missing = [str(c) for c in ckpts if not (c / "config.json").is_file()]
        if missing:
            raise DataFormatError(path, None, f"{len(missing)} model checkpoint(s) missing, e.g. {missing[0]}")
        return cls(folder, record, ckpts)


@dataclass
class ShadowsConfig:
    """A shadow set's settings (a YAML file's `shadows:` mapping, module docstring): `train` (a
    training config: a mapping or a YAML path) for language models, or `finetune` (a fine-tuning
    config) for classifiers."""

    pool: dict
    train: Any = None
    finetune: Any = None
    n_models: int = 16
    seed: int = 0
    use: str = "best"                 # classifiers: each model's best dev epoch, or its last
    shared_tokenizer: bool = True     # language models: one tokenizer trained on the whole pool
    out: str | None = field(default=None, metadata=NOT_IDENTITY)   # default <runs root>/shadows/<name>
    name: str | None = field(default=None, metadata=NOT_IDENTITY)  # default: the config file's stem

    @property
    def kind(self) -> str:
        return "finetune" if self.finetune is not None else "pretrain"

    def folder(self) -> Path:
        from workbench.paths import runs_root

        return Path(self.out or runs_root() / "shadows" / (self.name or "shadows"))


def load_shadows_config(source, overrides: dict | None = None) -> ShadowsConfig:
    """A validated `ShadowsConfig` from a YAML file (its `shadows:` mapping; the file's stem names the
    set), a mapping (with or without the `shadows:` level) or a config, `overrides` by the one rule."""
    from workbench.coerce import load_config
    from workbench.io import read_yaml

    name = None
    if isinstance(source, ShadowsConfig):
        data, where = dataclasses.asdict(source), "<config>"
    else:
        where = "shadows" if isinstance(source, dict) else str(source)
        raw = source if isinstance(source, dict) else read_yaml(Path(source))
        data = raw.get("shadows", raw if isinstance(source, dict) else None)
        if not isinstance(source, dict):
            name = Path(source).stem
        if not isinstance(data, dict) or not ({"train", "finetune"} & set(data)) or "pool" not in data:
            raise ConfigError(f"{where}: needs a shadows: mapping with train (or finetune), pool, n_models")
    cfg, where = load_config(ShadowsConfig, {"name": name, **data}, overrides, label=where)
    if (cfg.train is None) == (cfg.finetune is None):
        raise ConfigError(f"{where}: give train (language models) or finetune (classifiers), not both")
    if not isinstance(cfg.pool, dict):
        raise ConfigError(f"{where}: pool: expected a mapping, got {cfg.pool!r}")
    if cfg.use not in ("best", "last"):
        raise ConfigError(f"finetune shadow set: use must be best or last, got {cfg.use!r}")
    if cfg.n_models < 2:
        raise ConfigError(f"a shadow set needs at least 2 models, got {cfg.n_models}")
    return cfg


# ------------------------------------------------------------------------ language models

@dataclass
class _PretrainSet:
    """What every model of a language-model set shares (built in the parent, rebuilt in a worker)."""

    out: Path
    docs: list
    keep: np.ndarray
    base: Any          # the TrainConfig
    sources: list
    shared: Any        # the pool's tokenizer, or None


def _pretrain_set(cfg: ShadowsConfig, write: bool) -> _PretrainSet:
    """The pool, the keep matrix, the training config and the shared tokenizer; `write`: the parent
    writes every model's corpus split (a worker finds them)."""
    from workbench.config import load_train_config
    from workbench.families import get_family
    from workbench.tokenization import train_tokenizer

    out = cfg.folder()
    pool = cfg.pool
    sources = list(pool.get("sources") or [])
    docs = pool_documents(sources, pool.get("max_documents"), int(pool.get("seed", 0)))
    if len(docs) < 4:
        raise ConfigError(f"shadow pool has {len(docs)} documents; need at least 4")
    keep = balanced_keep(len(docs), cfg.n_models, cfg.seed)
    base = load_train_config(cfg.train)
    shared = None
    if cfg.shared_tokenizer:
        pool_dir = out / "corpus-pool"
        pool_corpus = (write_corpus_split(pool_dir, docs, [], sources, "shadow set: the whole pool (tokenizer)", cfg.seed)
                       if not (pool_dir / "manifest.json").is_file() else _load_corpus(pool_dir))
        shared = train_tokenizer(get_family(base.family), pool_corpus, base.tokenizer.vocab_size, show_progress=False)
    ctx = _PretrainSet(out, docs, keep, base, sources, shared)
    if write:
        for m in range(cfg.n_models):
            _model_corpus(cfg, ctx, m)
    return ctx


def _model_corpus(cfg: ShadowsConfig, ctx: _PretrainSet, m: int):
    """Model m's corpus split: written once (its train half, the rest held out), then read back."""
    corpus_dir = ctx.out / f"corpus-{m:02d}"
    train = [d for d, k in zip(ctx.docs, ctx.keep[m]) if k]
    held = [d for d, k in zip(ctx.docs, ctx.keep[m]) if not k]
    if (corpus_dir / "manifest.json").is_file():
        corpus = _load_corpus(corpus_dir)
        if corpus.doc_ids("train") != [d.doc_id for d in train]:
            raise ConfigError(f"{corpus_dir}: holds a different split (another pool or seed); use a new folder")
        return corpus, len(train)
    return write_corpus_split(corpus_dir, train, held, ctx.sources,
                              f"shadow set: balanced_keep(seed={cfg.seed}) model {m} of {cfg.n_models}", cfg.seed), len(train)


def train_shadow_model(cfg: ShadowsConfig, m: int, ctx: _PretrainSet | None = None) -> dict:
    """One language model of the set, an executor unit (`ctx` None: a worker, which rebuilds what the
    parent built): trained on its corpus split by the backend's loop; its shadows.json entry."""
    from workbench.config import load_train_config
    from workbench.data_cache import TokenizedCorpus
    from workbench.drivers.train import TrainingData, train_seed
    from workbench.families import get_family
    from workbench.tokenization import train_tokenizer

    ctx = ctx or _pretrain_set(cfg, write=False)
    out, base = ctx.out, ctx.base
    corpus, n_train = _model_corpus(cfg, ctx, m)
    model_cfg = load_train_config(base, {"output_dir": str(out / f"model-{m:02d}"), "name": f"{base.name}-shadow-{m:02d}",
                                         "corpus": {"sources": ctx.sources, "heldout_fraction": 0.5, "seed": cfg.seed,
                                                    "max_documents": cfg.pool.get("max_documents")}, "progress": False})
    tok = ctx.shared or train_tokenizer(get_family(base.family), corpus, model_cfg.tokenizer.vocab_size, show_progress=False)
    data = TrainingData(corpus, tok, TokenizedCorpus.build(tok, corpus, "train", show_progress=False),
                        TokenizedCorpus.build(tok, corpus, "heldout", show_progress=False))
    final = train_seed(model_cfg, m, data)
    return {"index": m, "checkpoint": final.relative_to(out).as_posix(),
            "corpus": (out / f"corpus-{m:02d}").relative_to(out).as_posix(), "n_train": n_train}


# ------------------------------------------------------------------------ classifiers

def finetune_pool(data, max_examples: int | None, seed: int) -> list[int]:
    """Indices of a seeded sample of `max_examples` examples of the task's train split (all when None)."""
    train = list(data.splits["train"])
    if max_examples is not None and max_examples < len(train):
        pick = np.sort(np.random.default_rng(seed).permutation(len(train))[:max_examples])
        train = [train[i] for i in pick]
    return train


@dataclass
class _FinetuneSet:
    out: Path
    base: Any          # the FinetuneConfig
    data: Any          # the task's examples
    idx: list
    keep: np.ndarray


def _finetune_set(cfg: ShadowsConfig) -> _FinetuneSet:
    from workbench.drivers.finetune import load_finetune_config, load_task

    base = load_finetune_config(cfg.finetune)
    data = load_task(base)
    if data.kind != "sentence":
        raise ConfigError(f"finetune shadow set: membership supports sentence tasks, not {base.task} ({data.kind})")
    idx = finetune_pool(data, cfg.pool.get("max_examples"), int(cfg.pool.get("seed", 0)))
    if len(idx) < 4:
        raise ConfigError(f"finetune shadow pool has {len(idx)} examples; need at least 4")
    return _FinetuneSet(cfg.folder(), base, data, idx, balanced_keep(len(idx), cfg.n_models, cfg.seed))


def train_shadow_classifier(cfg: ShadowsConfig, m: int, ctx: _FinetuneSet | None = None,
                            threads: int | None = None) -> dict:
    """One classifier of the set, an executor unit (`ctx` None: a worker rebuilds it; `threads`: the
    worker's torch threads when the config sets none): `bertology finetune`'s recipe on its IN half;
    its shadows.json entry."""
    from workbench.store.checkpoints import seed_dir, step_dir
    from workbench.drivers.finetune import load_finetune_config, prepare, train_seed

    ctx = ctx or _finetune_set(cfg)
    out, base, data = ctx.out, ctx.base, ctx.data
    ins = [i for i, k in zip(ctx.idx, ctx.keep[m]) if k]
    outs = [i for i, k in zip(ctx.idx, ctx.keep[m]) if not k]
    data_m = dataclasses.replace(data, splits={"train": ins + outs, "dev": data.splits["dev"],
                                               "test": data.splits["test"]})
    model_cfg = load_finetune_config(base, {
        "name": f"{base.task}-shadow-{m:02d}", "output_dir": str(out / f"model-{m:02d}"), "seeds": [m],
        "max_train_examples": len(ins), "keep_epoch_checkpoints": base.keep_epoch_checkpoints or cfg.use == "last",
        "baselines": False, "progress": False, "threads": base.threads if base.threads is not None else threads})
    run = prepare(model_cfg, data_m)
    res = train_seed(model_cfg, m, run)
    ck = Path(res.checkpoint) if cfg.use == "best" else step_dir(seed_dir(run.folder, m), res.curve[-1]["step"])
    if cfg.use == "last" and not ck.is_dir():
        raise ConfigError(f"finetune shadow set: model {m}'s last-epoch checkpoint {ck} is not a folder (use: "
                          f"last needs the step folder that keep_epoch_checkpoints saves)")
    return {"index": m, "checkpoint": ck.relative_to(out).as_posix(), "n_train": len(ins),
            "best_epoch": res.best_epoch, "dev_accuracy": res.dev["accuracy"]}


# ------------------------------------------------------------------------ the driver

def shadow_units(cfg: ShadowsConfig, store=None):
    """The driver's units (`DriverSpec.units`): the set's models, each `train_shadow_model` or
    `train_shadow_classifier`; in this process they share what the parent built."""
    from workbench.drivers.executor import Unit, UnitPlan

    if cfg.kind == "finetune":
        ctx, fn, desc = _finetune_set(cfg), train_shadow_classifier, "shadow classifiers"
    else:
        ctx, fn, desc = _pretrain_set(cfg, write=True), train_shadow_model, "shadow models"

    def units(parallel: bool) -> list:
        if not parallel:
            return [Unit(fn, (cfg, m, ctx), name=f"model {m}") for m in range(cfg.n_models)]
        extra = (None, 1) if fn is train_shadow_classifier else (None,)  # one torch thread unless the config sets them
        return [Unit(fn, (cfg, m, *extra), name=f"model {m}") for m in range(cfg.n_models)]

    return UnitPlan(units, cfg.n_models, ctx.out, desc=desc, state=ctx)


def collect(cfg: ShadowsConfig, store, plan, models: list[dict]) -> ShadowSet:
    """shadows.json from the models' entries (in model order), written once every model is done."""
    ctx = plan.state
    if cfg.kind == "finetune":
        record = {"format": SET_FORMAT, "kind": "finetune", "n_models": cfg.n_models, "seed": cfg.seed, "use": cfg.use,
                  "pool": {"task": ctx.base.task, "max_examples": cfg.pool.get("max_examples"),
                           "seed": int(cfg.pool.get("seed", 0)), "examples": len(ctx.idx),
                           "ids": [ctx.data.ids[i] for i in ctx.idx]},
                  "finetune_config": ctx.base.to_dict(), "models": models}
    else:
        record = {"format": SET_FORMAT, "n_models": cfg.n_models, "seed": cfg.seed,
                  "shared_tokenizer": cfg.shared_tokenizer,
                  "pool": {"sources": ctx.sources, "max_documents": cfg.pool.get("max_documents"),
                           "seed": int(cfg.pool.get("seed", 0)), "documents": len(ctx.docs)},
                  "train_config": ctx.base.to_dict(), "models": models}
    atomic_write_json(ctx.out / SET_FILE, record)
    return ShadowSet.load(ctx.out)


def report(s: ShadowSet) -> str:
    """What `bertology shadows` prints."""
    return f"{len(s.checkpoints)} {'classifiers' if s.kind == 'finetune' else 'models'} in {s.folder}"


DRIVER = DriverSpec("shadows", ShadowsConfig, load_shadows_config, None, report, units=shadow_units, collect=collect)


def train_shadow_set(train_config, pool: dict, n_models: int, out_dir: str | Path, seed: int = 0,
                     progress: bool = True, shared_tokenizer: bool = True, executor=None) -> ShadowSet:
    """Train `n_models` models of `train_config` (a TrainConfig, dict or YAML path), model m on the
    pool documents `balanced_keep(...)[m]` selects; see the module docstring. `executor`
    (`ExecutorOptions`): where the models train (default: one after the other in this process).

    shared_tokenizer: one tokenizer trained on the whole pool for every model (default), so that
    the models differ only in their weights: with a tokenizer trained on each model's own half
    (the backend's procedure), members are cut into fewer, rarer pieces than non-members and a
    per-token loss separates them through the tokenizer alone (a tiny pool makes that dominant)."""
    cfg = load_shadows_config({"train": train_config, "pool": pool, "n_models": n_models, "seed": seed,
                               "shared_tokenizer": shared_tokenizer, "out": str(out_dir)})
    return DRIVER.run(cfg, executor=_options(executor, progress))


def train_finetune_shadow_set(finetune_config, pool: dict, n_models: int, out_dir: str | Path, seed: int = 0,
                              use: str = "best", progress: bool = True, executor=None) -> ShadowSet:
    """`n_models` classifiers fine-tuned with one `workbench.drivers.finetune` config (a FinetuneConfig, dict
    or YAML path), model m on the pool examples `balanced_keep(...)[m]` selects (module docstring).
    The config's seeds, name, output folder and max_train_examples are set per model."""
    if use not in ("best", "last"):
        raise ConfigError(f"finetune shadow set: use must be best or last, got {use!r}")
    cfg = load_shadows_config({"finetune": finetune_config, "pool": pool, "n_models": n_models, "seed": seed,
                               "use": use, "out": str(out_dir)})
    return DRIVER.run(cfg, executor=_options(executor, progress))


def _options(executor, progress: bool):
    from workbench.drivers.executor import ExecutorOptions

    return dataclasses.replace(executor or ExecutorOptions(), progress=progress and (executor is None or executor.progress))


def _load_corpus(folder: Path):
    from workbench.data.corpus import CorpusSplit

    return CorpusSplit.load(folder)


def main(argv: list[str] | None = None) -> int:
    """`python -m workbench.drivers.shadows CONFIG.yaml [--out DIR]`: `bertology shadows`, the same command."""
    import argparse

    from workbench.drivers.spec import add_command_arguments, run_command
    from workbench.errors import cli_errors

    p = argparse.ArgumentParser(prog="python -m workbench.drivers.shadows", description="Train a LiRA shadow set.")
    add_command_arguments(p, "shadows")
    args = p.parse_args(argv)

    def run() -> int:
        print(run_command("shadows", args))
        return 0

    return cli_errors(run, prog="python -m workbench.drivers.shadows")


if __name__ == "__main__":
    raise SystemExit(main())
