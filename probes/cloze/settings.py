"""The cloze probe's tasks and settings (`Settings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from probes.cloze import tasks as ct
from probes.cloze.scoring import scoring_error
from probes.core import runner
from workbench.errors import ConfigError


TASKS = ct.TASKS
FIXED_CHOICE_TASKS = tuple(t for t in TASKS if t in ct.CHOICES)
PAPER_SIZES = (62, 125, 250, 500, 1000, 2000)



# --------------------------------------------------------------------------- the probe module


@dataclass
class Settings(runner.Settings):
    baselines: tuple[str, ...] = field(default=("random_init", "majority", "control"), metadata={
        "help": "subset of random_init,majority,control ('' for none)"})
    BASELINES = ("random_init", "majority", "control")
    n_train: int = field(default=2000, metadata={"help": "train items per task (capped by the lexicon)"})
    n_test: int = field(default=500, metadata={"help": "dev and test items per task (capped by the lexicon)"})
    lens: bool = field(default=True, metadata={"help": "logit lens: the head on every layer"})
    probe: bool = field(default=True, metadata={"help": "linear probe on the blank's vector at every layer"})
    nonsense: bool = field(default=True, metadata={"help": "language control: nonsense words for content words"})
    scoring: tuple[str, ...] = field(default=("raw",), metadata={
        "help": "zero-shot and lens scoring rules, subset of raw,contextual,pmi_dc: raw = the head's own score; "
                "contextual = minus its score in the content-free template (Zhao et al. 2021; rows *_contextual_*); "
                "pmi_dc = answer tokens after the item and the task's domain premise, minus after the premise "
                "alone (Holtzman et al. 2021; rows *_pmi_dc_*)"})
    curve_sizes: tuple[int, ...] = field(default=(), metadata={
        "help": "learning curve: fine-tune on these train sizes (paper: 62,125,250,500,1000,2000; '' = off)"})
    curve_seeds: int = field(default=3, metadata={"help": "fine-tuning seeds per learning-curve size"})
    curve_steps: int = field(default=200, metadata={"help": "fine-tuning updates per run"})
    curve_lr: float = field(default=1e-4, metadata={"help": "fine-tuning learning rate (AdamW)"})

    def validate(self, spec) -> None:
        super().validate(spec)
        why = scoring_error(self.scoring)
        if why:
            raise ConfigError(why)
        if self.n_train < 2 or self.n_test < 10:
            raise ConfigError(f"cloze: n_train must be >= 2 and n_test >= 10, got {self.n_train}, {self.n_test}")
        if any(n < 2 for n in self.curve_sizes) or self.curve_seeds < 1 or self.curve_steps < 1 or self.curve_lr <= 0:
            raise ConfigError("cloze: curve_sizes must be >= 2, curve_seeds and curve_steps >= 1, curve_lr > 0")
