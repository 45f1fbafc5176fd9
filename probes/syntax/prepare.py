"""What the syntax probes load once per run: the treebank splits (`plan_splits`, `prepare`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from probes.core import runner
from probes.syntax.settings import SyntaxSettings
from workbench.errors import ConfigError


# --------------------------------------------------------------------------- data
@dataclass
class SplitPlan:
    """Which sentences of which files the probes train on, stop on, and are scored on."""

    train: list  # Sentence objects the activations are extracted for ("train pool": fit + stop)
    fit: np.ndarray  # indices into train: probe training sentences
    stop: np.ndarray  # indices into train: early-stopping sentences
    eval: list
    train_split: str
    eval_split: str
    files: list[Path]
    description: dict[str, Any]


def plan_splits(treebank: str, train_split: str, eval_split: str, *, max_train_sentences: int | None,
                max_eval_sentences: int | None, early_stopping_fraction: float, holdout_fraction: float,
                seed: int) -> SplitPlan:
    """Load the treebank and choose sentences (see the module docstring, "Splits")."""
    from workbench.data.conllu import TREEBANKS, load_treebank, treebank_path

    if treebank not in TREEBANKS:
        raise ConfigError(f"unknown treebank {treebank!r}; known: {sorted(TREEBANKS)}")
    have = TREEBANKS[treebank]
    requested = (train_split, eval_split)
    if train_split not in have or eval_split not in have:
        if (train_split, eval_split) != ("train", "dev"):
            raise ConfigError(f"treebank {treebank} has splits {have}, not {train_split!r}/{eval_split!r}")
        train_split, eval_split = (have[0], have[1]) if len(have) >= 2 else (have[0], have[0])
    rng = np.random.default_rng([seed, 1])
    train_all = load_treebank(treebank, train_split)
    files = [treebank_path(treebank, train_split)]
    if train_split == eval_split:  # one split: hold out sentences for evaluation
        order = rng.permutation(len(train_all))
        n_eval = max(1, int(round(holdout_fraction * len(train_all))))
        eval_ids = np.sort(order[:n_eval])
        train_ids = np.sort(order[n_eval:])
        eval_all = [train_all[i] for i in eval_ids]
        train_all = [train_all[i] for i in train_ids]
    else:
        eval_all = load_treebank(treebank, eval_split)
        files.append(treebank_path(treebank, eval_split))
    train = _cap(train_all, max_train_sentences, rng)
    evals = _cap(eval_all, max_eval_sentences, rng)
    if len(train) < 2:
        raise ConfigError(f"need at least 2 training sentences, got {len(train)}")
    order = rng.permutation(len(train))
    n_stop = min(len(train) - 1, max(1, int(round(early_stopping_fraction * len(train)))))
    stop, fit = np.sort(order[:n_stop]), np.sort(order[n_stop:])
    desc = {"treebank": treebank, "requested": list(requested), "train_split": train_split,
            "eval_split": eval_split, "held_out_from_one_split": train_split == eval_split,
            "train_sentences_available": len(train_all), "eval_sentences_available": len(eval_all),
            "fit_sentences": len(fit), "stop_sentences": len(stop), "eval_sentences": len(evals)}  # fmt: skip
    return SplitPlan(train, fit, stop, evals, train_split, eval_split, files, desc)


def _cap(sentences: list, cap: int | None, rng: np.random.Generator) -> list:
    """A seeded sample of `cap` sentences, kept in file order (all of them without a cap)."""
    if cap is None or cap >= len(sentences):
        return list(sentences)
    if cap < 1:
        raise ConfigError(f"sentence caps must be >= 1, got {cap}")
    return [sentences[i] for i in np.sort(rng.choice(len(sentences), size=cap, replace=False))]



# --------------------------------------------------------------------------- data, once per run
@dataclass
class SyntaxData:
    plan: SplitPlan
    train_words: list
    eval_words: list
    train_key: str  # activation-cache keys: the treebank split and, for a subset, its size and seed
    eval_key: str


def prepare(settings: SyntaxSettings) -> runner.Prepared:
    s = settings
    plan = plan_splits(s.treebank, s.train_split, s.eval_split, max_train_sentences=s.max_train_sentences,
                       max_eval_sentences=s.max_eval_sentences, early_stopping_fraction=s.early_stopping_fraction,
                       holdout_fraction=s.holdout_fraction, seed=s.seed)
    desc = plan.description
    subset = s.max_train_sentences is not None or desc["held_out_from_one_split"]
    train_key = f"{s.treebank}-{plan.train_split}" + (f"-n{len(plan.train)}-seed{s.seed}" if subset else "")
    eval_subset = desc["held_out_from_one_split"] or len(plan.eval) < desc["eval_sentences_available"]
    eval_key = f"{s.treebank}-{plan.eval_split}" + (f"-n{len(plan.eval)}-seed{s.seed}" if eval_subset else "")
    data = SyntaxData(plan, [x.words for x in plan.train], [x.words for x in plan.eval], train_key, eval_key)
    return runner.Prepared(data=data, files=plan.files, notes={"splits": desc, "extraction": {}})
