"""The coreference probes' tasks, baselines, constants and settings (`CorefSettings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from probes.core import fitting, runner
from workbench.errors import ConfigError


TASKS = ("gum-pairs", "gum-entity-type", "gap", "attention-heads", "gap-cloze")
BASELINES = ("majority", "control", "rules", "random_init")
SPANS = ("mean+head", "mean", "head")
GAP_LABELS = ("A", "B", "NEITHER")
PAPER_PARALLELISM_F1 = 0.669  # Webster et al. (2018), Table 5: Parallelism, snippet-context, test overall F1
MENTION_TYPES = ("pronoun", "proper", "nominal")
HEADS_SELECT_SPLIT, HEADS_REPORT_SPLIT = "dev", "test"  # GUM: a best head is chosen on dev, reported on test
HEAD_CRITERIA = {  # metric -> what a head must attend to most (per layer; `_overall` adds the best layer x head)
    "best_head_accuracy": "clark2019: an antecedent's head word, special tokens kept",
    "best_head_accuracy_head_word": "an antecedent's head word, special tokens dropped and rows renormalised",
    "best_head_accuracy_lenient": "any word of an antecedent, special tokens dropped and rows renormalised",
}



# --------------------------------------------------------------------------- settings and data
@dataclass
class CorefSettings(runner.Settings):
    """Settings of the coreference probes (see the module docstring); every field is a CLI option."""

    tasks: tuple[str, ...] = field(default=TASKS, metadata={"help": "comma-separated tasks"})
    baselines: tuple[str, ...] = field(default=BASELINES, metadata={
        "help": "subset of majority,control,rules,random_init ('' for none)"})
    k: int = field(default=20, metadata={"help": "gum-pairs: candidate antecedents per mention"})
    span: str = field(default="mean+head", metadata={"help": "mention vector: mean+head | mean | head"})
    pooling: str = field(default="first", metadata={"help": "first | mean | last subword of each word"})
    max_train_pairs: int = field(default=10000, metadata={"help": "gum-pairs: training pairs (seeded draw of anaphors)"})
    max_train_mentions: int = field(default=20000, metadata={"help": "gum-entity-type: training mentions (seeded)"})
    max_train_documents: int | None = field(default=None, metadata={"help": "cap on GUM train documents (seeded)"})
    max_eval_documents: int | None = field(default=None, metadata={
        "help": "cap on GUM eval documents (the first N; attention-heads: of dev and of test)"})
    max_gap_examples: int | None = field(default=None, metadata={"help": "cap on each GAP split (the first N rows)"})
    early_stopping_fraction: float = field(default=0.1, metadata={
        "help": "held out for early stopping: GUM train documents; GAP development rows when gap_eval_split is validation"})
    eval_split: str = field(default="dev", metadata={
        "help": "GUM split the probes report on: dev | test (attention-heads: heads chosen on dev, reported on test)"})
    gap_eval_split: str = field(default="test", metadata={
        "help": "GAP split to report on: test (stop on validation) | validation (stop on held-out development rows)"})
    gap_predictions_dir: str | None = field(default=None, metadata={
        "help": "where GAP submission files go (default <runs root>/coref/gap-predictions)"})
    context_thresholds: tuple[int, ...] = field(default=(16, 64, 128), metadata={
        "help": "document context: count words with fewer left-context words than each"})
    attention_batch_size: int = field(default=4, metadata={"help": "windows per forward pass with attentions"})
    probe_config: dict = field(default_factory=dict, metadata={"help": "fitting.ProbeConfig overrides"})
    memory_budget_gb: float = field(default=1.0, metadata={"help": "features in memory per batched fit"})

    BASELINES = BASELINES
    EXECUTION_FIELDS = runner.Settings.EXECUTION_FIELDS + ("memory_budget_gb", "attention_batch_size",
                                                           "gap_predictions_dir")

    def validate(self, spec) -> None:
        super().validate(spec)
        if self.k < 1:
            raise ConfigError(f"k must be >= 1, got {self.k}")
        if self.span not in SPANS:
            raise ConfigError(f"span must be one of {SPANS}, got {self.span!r}")
        if self.pooling not in ("first", "mean", "last"):
            raise ConfigError(f"pooling must be first, mean or last, got {self.pooling!r}")
        if self.max_train_pairs < 1 or self.max_train_mentions < 1:
            raise ConfigError("max_train_pairs and max_train_mentions must be >= 1")
        if self.max_train_documents is not None and self.max_train_documents < 2:
            raise ConfigError(f"max_train_documents must be >= 2 (or unset), got {self.max_train_documents}")
        for key in ("max_eval_documents", "max_gap_examples"):
            if getattr(self, key) is not None and getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1 (or unset), got {getattr(self, key)}")
        if not 0 < self.early_stopping_fraction < 1:
            raise ConfigError("early_stopping_fraction must lie in (0, 1)")
        if self.eval_split not in ("dev", "test"):
            raise ConfigError(f"eval_split must be dev or test, got {self.eval_split!r}")
        if self.gap_eval_split not in ("test", "validation"):
            raise ConfigError(f"gap_eval_split must be test or validation, got {self.gap_eval_split!r}")
        if any(t < 1 for t in self.context_thresholds):
            raise ConfigError("context_thresholds must be >= 1")
        if self.attention_batch_size < 1 or self.memory_budget_gb <= 0:
            raise ConfigError("attention_batch_size must be >= 1 and memory_budget_gb > 0")
        bad = set(self.probe_config) - set(fitting.ProbeConfig.__dataclass_fields__)
        if bad:
            raise ConfigError(f"unknown probe_config key(s) {sorted(bad)}")


def gap_split_roles(settings: CorefSettings) -> dict[str, str]:
    """Which GAP data the GAP probe trains on, early-stops on and reports on: never the same data
    twice. Reporting on test (the default, Webster et al. 2018's protocol): train on development,
    stop on validation. Reporting on validation: stop on a seeded `early_stopping_fraction` of the
    development rows (`gap_fit_stop_rows`), train on the rest; before issue 49 it stopped on
    validation too, so the reported score had picked its own stopping point."""
    if settings.gap_eval_split == "test":
        return {"train": "development", "stop": "validation", "eval": "test"}
    held = f"development-heldout-{settings.early_stopping_fraction:g}"
    return {"train": f"development-rest-{settings.early_stopping_fraction:g}", "stop": held, "eval": "validation"}


def gap_fit_stop_rows(n: int, settings: CorefSettings):
    """(fit rows, stop rows) of GAP development's `n` rows when the report is on validation: a
    seeded draw of round(n x early_stopping_fraction) rows (at least 1) held out for stopping,
    both sorted."""
    import numpy as np

    order = np.random.default_rng([settings.seed, 13]).permutation(n)
    n_stop = max(1, int(round(n * settings.early_stopping_fraction)))
    return np.sort(order[n_stop:]), np.sort(order[:n_stop])
