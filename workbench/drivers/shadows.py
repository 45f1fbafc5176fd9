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

`python -m workbench.drivers.shadows CONFIG.yaml` trains the set a YAML file describes (its `shadows:`
mapping: train (a training config), pool {sources, max_documents, seed}, n_models, seed, out; or for
classifiers finetune (a fine-tuning config), pool {max_examples, seed}, use, n_models, seed, out).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from workbench.errors import ConfigError, DataFormatError
from workbench.io import atomic_write_json, sha256_file
from workbench.progress import progress as progress_bar

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


def train_shadow_set(train_config, pool: dict, n_models: int, out_dir: str | Path, seed: int = 0,
                     progress: bool = True, shared_tokenizer: bool = True) -> ShadowSet:
    """Train `n_models` models of `train_config` (a TrainConfig, dict or YAML path), model m on the
    pool documents `balanced_keep(...)[m]` selects; see the module docstring.

    shared_tokenizer: one tokenizer trained on the whole pool for every model (default), so that
    the models differ only in their weights: with a tokenizer trained on each model's own half
    (the backend's procedure), members are cut into fewer, rarer pieces than non-members and a
    per-token loss separates them through the tokenizer alone (a tiny pool makes that dominant)."""
    from workbench.config import load_train_config
    from workbench.data_cache import TokenizedCorpus
    from workbench.families import get_family
    from workbench.tokenization import train_tokenizer
    from workbench.drivers.train import TrainingData, train_seed

    out = Path(out_dir)
    sources = list(pool.get("sources") or [])
    max_docs = pool.get("max_documents")
    pool_seed = int(pool.get("seed", 0))
    docs = pool_documents(sources, max_docs, pool_seed)
    if len(docs) < 4:
        raise ConfigError(f"shadow pool has {len(docs)} documents; need at least 4")
    keep = balanced_keep(len(docs), n_models, seed)
    base = load_train_config(train_config)
    family = get_family(base.family)
    shared = None
    if shared_tokenizer:
        pool_dir = out / "corpus-pool"
        pool_corpus = (write_corpus_split(pool_dir, docs, [], sources, "shadow set: the whole pool (tokenizer)", seed)
                       if not (pool_dir / "manifest.json").is_file() else _load_corpus(pool_dir))
        shared = train_tokenizer(family, pool_corpus, base.tokenizer.vocab_size, show_progress=False)
    models = []
    for m in progress_bar(range(n_models), desc="shadow models", disable=not progress):
        corpus_dir = out / f"corpus-{m:02d}"
        train = [d for d, k in zip(docs, keep[m]) if k]
        held = [d for d, k in zip(docs, keep[m]) if not k]
        if (corpus_dir / "manifest.json").is_file():
            corpus = _load_corpus(corpus_dir)
            if corpus.doc_ids("train") != [d.doc_id for d in train]:
                raise ConfigError(f"{corpus_dir}: holds a different split (another pool or seed); use a new folder")
        else:
            corpus = write_corpus_split(corpus_dir, train, held, sources,
                                        f"shadow set: balanced_keep(seed={seed}) model {m} of {n_models}", seed)
        cfg = load_train_config(base, {"output_dir": str(out / f"model-{m:02d}"), "name": f"{base.name}-shadow-{m:02d}",
                                 "corpus": {"sources": sources, "heldout_fraction": 0.5, "seed": seed,
                                            "max_documents": max_docs}, "progress": False})
        tok = shared or train_tokenizer(family, corpus, cfg.tokenizer.vocab_size, show_progress=False)
        data = TrainingData(corpus, tok, TokenizedCorpus.build(tok, corpus, "train", show_progress=False),
                            TokenizedCorpus.build(tok, corpus, "heldout", show_progress=False))
        final = train_seed(cfg, m, data)
        models.append({"index": m, "checkpoint": final.relative_to(out).as_posix(),
                       "corpus": corpus_dir.relative_to(out).as_posix(), "n_train": len(train)})
    record = {"format": SET_FORMAT, "n_models": n_models, "seed": seed, "shared_tokenizer": shared_tokenizer,
              "pool": {"sources": sources, "max_documents": max_docs, "seed": pool_seed, "documents": len(docs)},
              "train_config": base.to_dict(), "models": models}
    atomic_write_json(out / SET_FILE, record)
    return ShadowSet.load(out)


def finetune_pool(data, max_examples: int | None, seed: int) -> list[int]:
    """Indices of a seeded sample of `max_examples` examples of the task's train split (all when None)."""
    train = list(data.splits["train"])
    if max_examples is not None and max_examples < len(train):
        pick = np.sort(np.random.default_rng(seed).permutation(len(train))[:max_examples])
        train = [train[i] for i in pick]
    return train


def train_finetune_shadow_set(finetune_config, pool: dict, n_models: int, out_dir: str | Path, seed: int = 0,
                              use: str = "best", progress: bool = True) -> ShadowSet:
    """`n_models` classifiers fine-tuned with one `workbench.drivers.finetune` config (a FinetuneConfig, dict
    or YAML path), model m on the pool examples `balanced_keep(...)[m]` selects (module docstring).
    The config's seeds, name, output folder and max_train_examples are set per model."""
    import dataclasses

    from workbench.store.checkpoints import seed_dir, step_dir
    from workbench.drivers.finetune import load_finetune_config, load_task, prepare, train_seed

    if use not in ("best", "last"):
        raise ConfigError(f"finetune shadow set: use must be best or last, got {use!r}")
    out = Path(out_dir)
    base = load_finetune_config(finetune_config)
    data = load_task(base)
    if data.kind != "sentence":
        raise ConfigError(f"finetune shadow set: membership supports sentence tasks, not {base.task} ({data.kind})")
    pool_seed = int(pool.get("seed", 0))
    idx = finetune_pool(data, pool.get("max_examples"), pool_seed)
    if len(idx) < 4:
        raise ConfigError(f"finetune shadow pool has {len(idx)} examples; need at least 4")
    keep = balanced_keep(len(idx), n_models, seed)
    models = []
    for m in progress_bar(range(n_models), desc="shadow classifiers", disable=not progress):
        ins = [i for i, k in zip(idx, keep[m]) if k]
        outs = [i for i, k in zip(idx, keep[m]) if not k]
        data_m = dataclasses.replace(data, splits={"train": ins + outs, "dev": data.splits["dev"],
                                                   "test": data.splits["test"]})
        cfg = load_finetune_config(base, {
            "name": f"{base.task}-shadow-{m:02d}", "output_dir": str(out / f"model-{m:02d}"), "seeds": [m],
            "max_train_examples": len(ins), "keep_epoch_checkpoints": base.keep_epoch_checkpoints or use == "last",
            "baselines": False, "progress": False})
        run = prepare(cfg, data_m)
        res = train_seed(cfg, m, run)
        ck = Path(res.checkpoint) if use == "best" else step_dir(seed_dir(run.folder, m), res.curve[-1]["step"])
        if use == "last" and not ck.is_dir():
            raise ConfigError(f"finetune shadow set: model {m}'s last-epoch checkpoint {ck} is not a folder (use: "
                              f"last needs the step folder that keep_epoch_checkpoints saves)")
        models.append({"index": m, "checkpoint": ck.relative_to(out).as_posix(), "n_train": len(ins),
                       "best_epoch": res.best_epoch, "dev_accuracy": res.dev["accuracy"]})
    record = {"format": SET_FORMAT, "kind": "finetune", "n_models": n_models, "seed": seed, "use": use,
              "pool": {"task": base.task, "max_examples": pool.get("max_examples"), "seed": pool_seed,
                       "examples": len(idx), "ids": [data.ids[i] for i in idx]},
              "finetune_config": base.to_dict(), "models": models}
    atomic_write_json(out / SET_FILE, record)
    return ShadowSet.load(out)


def _load_corpus(folder: Path):
    from workbench.data.corpus import CorpusSplit

    return CorpusSplit.load(folder)


def main(argv: list[str] | None = None) -> int:
    """`python -m workbench.drivers.shadows CONFIG.yaml [--out DIR]`: train the shadow set a config describes."""
    import argparse

    from workbench.errors import cli_errors
    from workbench.io import read_yaml
    from workbench.paths import runs_root

    p = argparse.ArgumentParser(prog="python -m workbench.drivers.shadows", description=main.__doc__)
    p.add_argument("config")
    p.add_argument("--out", default=None, help="set folder (default: the config's shadows.out or <runs root>/shadows/<name>)")
    args = p.parse_args(argv)

    def run() -> int:
        path = Path(args.config)
        spec = read_yaml(path).get("shadows")
        if not isinstance(spec, dict) or not ({"train", "finetune"} & set(spec)) or "pool" not in spec:
            raise ConfigError(f"{path}: needs a shadows: mapping with train (or finetune), pool, n_models")
        out = Path(args.out or spec.get("out") or runs_root() / "shadows" / path.stem)
        if "finetune" in spec:
            s = train_finetune_shadow_set(spec["finetune"], spec["pool"], int(spec.get("n_models", 16)), out,
                                          int(spec.get("seed", 0)), use=str(spec.get("use", "best")))
            print(f"{len(s.checkpoints)} classifiers in {s.folder}")
            return 0
        s = train_shadow_set(spec["train"], spec["pool"], int(spec.get("n_models", 16)), out, int(spec.get("seed", 0)),
                             shared_tokenizer=bool(spec.get("shared_tokenizer", True)))
        print(f"{len(s.checkpoints)} models in {s.folder}")
        return 0

    return cli_errors(run, prog="python -m workbench.drivers.shadows")


if __name__ == "__main__":
    raise SystemExit(main())
