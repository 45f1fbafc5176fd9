"""The membership probe's attacks and settings (`Settings`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from probes.core import runner
from probes.membership import attacks as ma
from workbench.errors import ConfigError


SETTINGS_KINDS = ("pretrain", "finetune")
ATTACKS = ("loss", "zlib", "reference_diff", "reference_ratio", "reference", "mink", "minkpp", "lira")
CONTROL_TASK = "tfidf_control"  # the `layers` task's model-free control row (no layer)
REFERENCE_ATTACKS = ("reference_diff", "reference_ratio", "reference")  # `reference`: old name of reference_diff
LM_ONLY = ("zlib", "mink", "minkpp")


# --------------------------------------------------------------------------- the probe module
@dataclass
class Settings(runner.Settings):
    setting: str = field(default="pretrain", metadata={"help": "pretrain | finetune (where membership comes from)"})
    attacks: tuple[str, ...] = field(default=("loss", "zlib", "mink", "minkpp"), metadata={
        "help": "comma-separated: loss,zlib,reference_diff,reference_ratio,mink,minkpp,lira (reference_* need "
                "--reference, lira --shadows; `reference` is the old name of reference_diff)"})
    n_examples: int = field(default=1000, metadata={"help": "members and non-members each (length-matched)"})
    passage_words: int = field(default=32, metadata={"help": "pretrain: words per passage"})
    min_words: int = field(default=8, metadata={"help": "pretrain: shortest last passage of a document kept"})
    length_bin: int = field(default=1, metadata={"help": "match lengths within bins of this many words"})
    corpus: str | None = field(default=None, metadata={
        "help": "pretrain: corpus folder to take members/non-members from instead of the checkpoint's own"})
    mink_ratios: tuple[float, ...] = field(default=ma.MINK_RATIOS, metadata={"help": "Min-K and Min-K++ fractions of the lowest-scored tokens"})
    reference: str | None = field(default=None, metadata={
        "help": "reference checkpoint trained on data disjoint from the target's (reference attack)"})
    shadows: str | None = field(default=None, metadata={"help": "shadow-set folder (workbench.drivers.shadows) for LiRA"})
    fix_variance: bool = field(default=False, metadata={"help": "LiRA: one global deviation instead of per example"})
    equal_counts: bool | None = field(default=None, metadata={
        "help": "LiRA: thin shadows to equal IN and OUT counts per example (see docs/membership.md: a target "
                "from its own balanced shadow set biases online LiRA below 0.5 otherwise); default: on exactly "
                "when the target is one of the shadow set's models"})
    max_roc_points: int = field(default=200, metadata={"help": "ROC points stored per attack"})
    electra_head: str = field(default="generator", metadata={
        "help": "ELECTRA: score with its generator (PLL) or its discriminator (log P(original) per token of the "
                "unmodified text); other families ignore it"})

    def validate(self, spec) -> None:
        super().validate(spec)
        if self.electra_head not in ("generator", "discriminator"):
            raise ConfigError(f"membership: electra_head must be generator or discriminator, got {self.electra_head!r}")
        if self.setting not in SETTINGS_KINDS:
            raise ConfigError(f"membership: setting must be one of {list(SETTINGS_KINDS)}, got {self.setting!r}")
        bad = [a for a in self.attacks if a not in ATTACKS]
        if bad:
            raise ConfigError(f"membership: unknown attack(s) {bad}; known: {list(ATTACKS)}")
        if self.setting == "finetune" and set(self.attacks) & set(LM_ONLY):
            raise ConfigError(f"membership: {sorted(set(self.attacks) & set(LM_ONLY))} need a language model's "
                              f"token log-probs; the finetune setting offers loss, reference_diff, reference_ratio, lira")
        if set(self.attacks) & set(REFERENCE_ATTACKS) and not self.reference:
            raise ConfigError("membership: the reference attack needs --reference CHECKPOINT")
        if "lira" in self.attacks and not self.shadows:
            raise ConfigError("membership: the lira attack needs --shadows SHADOW_SET_FOLDER")
        if self.n_examples < 10 or self.passage_words < 2 or self.min_words < 1 or self.length_bin < 1:
            raise ConfigError("membership: n_examples must be >= 10, passage_words >= 2, min_words and length_bin >= 1")
        if any(not 0 < k <= 1 for k in self.mink_ratios) or not self.mink_ratios:
            raise ConfigError(f"membership: mink_ratios must lie in (0, 1], got {list(self.mink_ratios)}")
        if self.corpus is not None and not (Path(self.corpus) / "manifest.json").is_file():
            raise ConfigError(f"{self.corpus}: not a corpus folder (no manifest.json)")
        if self.shadows is not None and not (Path(self.shadows) / "shadows.json").is_file():
            raise ConfigError(f"{self.shadows}: not a shadow set (no shadows.json)")
