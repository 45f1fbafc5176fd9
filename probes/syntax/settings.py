"""The syntax probes' tasks, baselines and settings (`SyntaxSettings`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from probes.core import fitting, runner
from workbench.errors import ConfigError


TASKS = ("upos", "xpos", "deprel", "arc", "structural-distance", "structural-depth")
CLASSIFICATION_TASKS = ("upos", "xpos", "deprel", "arc")
STRUCTURAL_TASKS = ("structural-distance", "structural-depth")
# `structural:` settings, passed through to `probes.syntax.structural.fit_structural_probe` (its defaults).
STRUCTURAL_SETTINGS = ("rank", "epochs", "batch_size", "lr", "patience", "lr_decay", "standardize")
BASELINES = ("majority", "control", "random_init")
PROBE_KINDS = ("linear", "mlp")
# The arc task's control (`probes.syntax.items`): "type_pairs", a label per (head form, dependent form)
# drawn from the arc/none distribution (our analogue); "hewitt_liang", Hewitt & Liang (2019)'s edge
# control (each word type attaches to itself, the first or the last word of its sentence).
ARC_CONTROLS = ("type_pairs", "hewitt_liang")
PAIR_FEATURES = ("concat", "concat_product")
NAME = "syntax"
# Named protocols of the structural probes. "workbench": the settings as given (2,000 training trees,
# rank 64, the eval split of the run). "hewitt-manning": Hewitt & Manning (2019)'s data protocol:
# every training tree, a full-rank projection, scored on the test split (`SyntaxSettings.__post_init__`).
STRUCTURAL_PROTOCOLS = ("workbench", "hewitt-manning")
# What "hewitt-manning" sets; a setting it owns must be left at its default (or the preset's value).
HEWITT_MANNING = {"eval_split": "test", "structural_max_train_sentences": None, "max_train_sentences": None}


# --------------------------------------------------------------------------- settings
def _no_cap_if_zero(value):
    return None if value == 0 else value


@dataclass
class SyntaxSettings(runner.Settings):
    """Settings of the syntax probes (see the module docstring); every field is a CLI option."""

    tasks: tuple[str, ...] = field(default=TASKS, metadata={"help": "comma-separated tasks"})
    baselines: tuple[str, ...] = field(default=BASELINES, metadata={
        "help": "subset of majority,control,random_init ('' for none)"})
    treebank: str = field(default="en_ewt", metadata={"help": "en_ewt | en_gum | es_gsd | en_pud | es_pud"})
    train_split: str = "train"
    eval_split: str = "dev"
    pooling: str = field(default="first", metadata={"help": "first | mean | last subword of each word"})
    classifier: tuple[str, ...] = field(default=("linear",), metadata={"help": "linear | mlp | linear,mlp (alias --probe)"})
    max_train_sentences: int | None = field(default=None, metadata={"help": "cap on training sentences (seeded sample)"})
    max_eval_sentences: int | None = None
    pair_features: str = field(default="concat", metadata={"help": "concat | concat_product (deprel, arc)"})
    deprel_subtypes: bool = True
    mdl_tasks: tuple[str, ...] = field(default=("upos",), metadata={"help": "tasks with an MDL online code ('' for none)"})
    mdl_max_examples: int | None = 20000
    mdl_fractions: tuple[float, ...] | None = None
    mdl_probe: str = field(default="linear", metadata={
        "help": "MDL's probe: linear | mlp (Hewitt & Liang's one-hidden-layer MLP, Voita & Titov's setting)",
        "key_omits": "linear"})
    arc_control: str = field(default="type_pairs", metadata={
        "help": "arc control task: type_pairs (a label per word-type pair) | hewitt_liang (each type attaches "
                "to itself, the first or the last word)", "key_omits": "type_pairs"})
    scalar_mix_tasks: tuple[str, ...] = field(default=("upos",), metadata={"help": "tasks with a scalar mix ('' for none)"})
    structural_max_train_sentences: int | None = field(default=2000, metadata={
        "help": "cap on the structural probes' training sentences (0 = no cap)"})
    structural: dict = field(default_factory=dict, metadata={
        "help": "structural probe settings: rank (integer or full), epochs, batch_size, lr, patience, lr_decay, "
                "standardize (default true; false = raw features, Hewitt & Manning's probe)"})
    protocol: str = field(default="workbench", metadata={
        "help": "workbench | hewitt-manning (all training trees, full rank, the test split)", "key_omits": "workbench"})
    probe_config: dict = field(default_factory=dict, metadata={"help": "fitting.ProbeConfig overrides"})
    early_stopping_fraction: float = 0.1
    holdout_fraction: float = 0.2
    memory_budget_gb: float = field(default=1.0, metadata={"help": "features in memory per batched fit"})

    BASELINES = BASELINES
    EXECUTION_FIELDS = runner.Settings.EXECUTION_FIELDS + ("memory_budget_gb",)

    def __post_init__(self):
        self.structural_max_train_sentences = _no_cap_if_zero(self.structural_max_train_sentences)
        if self.protocol == "hewitt-manning":
            self._apply_hewitt_manning()

    def _apply_hewitt_manning(self) -> None:
        """Hewitt & Manning (2019)'s protocol for the structural probes, as a preset that a reproduction
        names: every training tree (no cap on the training sentences), a full-rank projection, the
        test split (for every task of the run: the split is the run's). A setting the preset owns,
        given another value, is refused rather than silently overridden. What stays the workbench's:
        early stopping on a held-out tenth of the training trees (theirs: the dev split) and
        standardised features (`structural: {standardize: false}` for their raw features)."""
        given = {"eval_split": (self.eval_split, ("dev", "test")),
                 "structural_max_train_sentences": (self.structural_max_train_sentences, (2000, None)),
                 "max_train_sentences": (self.max_train_sentences, (None,)),
                 "structural.rank": (self.structural.get("rank", "full"), ("full",))}
        for key, (value, allowed) in given.items():
            if value not in allowed:
                raise ConfigError(f"protocol hewitt-manning sets {key} itself; drop {key}={value!r}")
        for key, value in HEWITT_MANNING.items():
            setattr(self, key, value)
        self.structural = {**self.structural, "rank": "full"}

    def validate(self, spec) -> None:
        from workbench.data.conllu import TREEBANKS

        super().validate(spec)
        if not self.classifier or any(k not in PROBE_KINDS for k in self.classifier):
            raise ConfigError(f"classifier must be one or more of {PROBE_KINDS}, got {list(self.classifier)}")
        if self.pair_features not in PAIR_FEATURES:
            raise ConfigError(f"pair_features must be one of {PAIR_FEATURES}, got {self.pair_features!r}")
        if self.pooling not in ("first", "mean", "last"):
            raise ConfigError(f"pooling must be first, mean or last, got {self.pooling!r}")
        if self.treebank not in TREEBANKS:
            raise ConfigError(f"unknown treebank {self.treebank!r}; known: {sorted(TREEBANKS)}")
        if not 0 < self.early_stopping_fraction < 1 or not 0 < self.holdout_fraction < 1:
            raise ConfigError("early_stopping_fraction and holdout_fraction must lie in (0, 1)")
        for key in ("max_train_sentences", "max_eval_sentences", "mdl_max_examples", "structural_max_train_sentences"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise ConfigError(f"{key} must be >= 1 (or unset), got {value}")
        for key in ("mdl_tasks", "scalar_mix_tasks"):
            bad = [t for t in getattr(self, key) if t not in CLASSIFICATION_TASKS]
            if bad:
                raise ConfigError(f"{key}: {bad} are not classification tasks {list(CLASSIFICATION_TASKS)}")
        if self.mdl_probe not in PROBE_KINDS:
            raise ConfigError(f"mdl_probe must be one of {PROBE_KINDS}, got {self.mdl_probe!r}")
        if self.arc_control not in ARC_CONTROLS:
            raise ConfigError(f"arc_control must be one of {ARC_CONTROLS}, got {self.arc_control!r}")
        if self.mdl_fractions is not None and not all(0 < f <= 1 for f in self.mdl_fractions):
            raise ConfigError(f"mdl_fractions must lie in (0, 1], got {list(self.mdl_fractions)}")
        unknown = set(self.structural) - set(STRUCTURAL_SETTINGS)
        if unknown:
            raise ConfigError(f"unknown structural probe settings {sorted(unknown)}")
        if self.protocol not in STRUCTURAL_PROTOCOLS:
            raise ConfigError(f"protocol must be one of {list(STRUCTURAL_PROTOCOLS)}, got {self.protocol!r}")
        if not isinstance(self.structural.get("standardize", True), bool):
            raise ConfigError(f"structural standardize must be true or false, got {self.structural['standardize']!r}")
        rank = self.structural.get("rank", 64)
        if rank != "full" and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
            raise ConfigError(f"structural rank must be a positive integer or 'full', got {rank!r}")
        bad_keys = set(self.probe_config) - set(fitting.ProbeConfig.__dataclass_fields__)
        if bad_keys:
            raise ConfigError(f"unknown probe_config key(s) {sorted(bad_keys)}")
        fitting.ProbeConfig(**self.probe_config)  # bad values (optimizer, device, ...): one line, before any work
        if self.memory_budget_gb <= 0:
            raise ConfigError(f"memory_budget_gb must be > 0, got {self.memory_budget_gb}")
