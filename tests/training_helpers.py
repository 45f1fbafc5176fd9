"""Training helpers for the tests: seconds-long runs of any family on real data."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.store.checkpoints import read_manifest, step_dir
from workbench.config import TrainConfig, load_train_config
from workbench.drivers.train import read_log, train_from_config


@dataclass
class TinyRun:
    checkpoint: Path  # final checkpoint folder
    run_folder: Path
    log: list[dict]
    heldout_before: dict  # held-out loss terms at step 0
    heldout_after: dict  # ... at the last step
    config: TrainConfig


def tiny_config(family: str, steps: int, output_dir: str | Path, **overrides) -> TrainConfig:
    """A seconds-long config: tiny preset, a few real documents, small vocab, short sequences."""
    base = {
        "name": f"tiny-{family}",
        "family": family,
        "preset": "tiny",
        "corpus": {"sources": ["inaugural", "state_union"], "max_documents": 60, "heldout_fraction": 0.2, "seed": 0},
        "tokenizer": {"vocab_size": 1000},
        "max_len": 64,
        "batch_size": 8,
        "lr": 3e-3,
        "warmup": 0.1,
        "steps": steps,
        "eval": {"batches": 2},
        "output_dir": str(output_dir),
        "progress": False,
    }
    return load_train_config(base, overrides)


def run_tiny_training(family: str, steps: int, output_dir: str | Path, **overrides) -> TinyRun:
    """Train a tiny model of `family` for `steps` steps on real data and report held-out loss
    before/after (families' tests assert that it drops and that the checkpoint opens)."""
    cfg = tiny_config(family, steps, output_dir, **overrides)
    final = train_from_config(cfg)[0]
    log = read_log(final.parent)
    m0 = read_manifest(step_dir(final.parent, 0))
    m1 = read_manifest(final)
    return TinyRun(final, final.parent, log, m0["heldout"], m1["heldout"], cfg)


def tiny_finetune_config(checkpoint, output_dir, **overrides):
    """A seconds-long `bertology finetune` config: one seed, one epoch, 64 training examples of
    sentence polarity, no baselines; `overrides` replace any key."""
    from workbench.drivers.finetune import load_finetune_config

    base = {"checkpoint": str(checkpoint), "task": "sentence_polarity", "seeds": [0], "epochs": 1, "lr": 1e-3,
            "max_train_examples": 64, "max_eval_examples": 32, "batch_size": 16, "output_dir": str(output_dir),
            "progress": False, "baselines": False}
    return load_finetune_config({**base, **overrides})

