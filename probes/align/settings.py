"""The alignment probe's name, tasks and settings (`Settings`, with the corpus-spec check), and the small
helpers every task shares: vector preparation, the target-side handle, activations, layer pairing, CIs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench import geometry as ac
from probes.core import runner
from workbench.errors import ConfigError


NAME = "align"
TASKS = ("bli", "fake-language", "parallel", "model-pair", "diachronic")
KS = (1, 5, 10)


@dataclass
class Settings(runner.Settings):
    BASELINES = ("random_init", "random_rotation")

    baselines: tuple[str, ...] = field(default=("random_init", "random_rotation"), metadata={
        "help": "comma-separated baselines ('' for none): random_init (fresh weights), random_rotation"})
    src_corpus: str = field(default="raw:wikitext2", metadata={
        "help": "source-language corpus spec (raw:<name>, ud:<treebank>[:<split>], columns:<path>, a+b)"})
    tgt_corpus: str = field(default="raw:cess_esp+raw:conll2002_esp", metadata={"help": "target-language corpus spec"})
    dictionary: str = field(default="swadesh:en-es", metadata={"help": "swadesh:<src>-<tgt> or tsv:<path>"})
    seed_dictionary: str = field(default="numerals", metadata={
        "help": "unsupervised seed: numerals | identical | a dictionary spec"})
    target_checkpoint: str = field(default="", metadata={
        "help": "model for the target side of bli/parallel/fake-language ('' = the same model)"})
    shift_target: bool = field(default=True, metadata={
        "help": "fake-language: shift the target text into the fake alphabet (off: another model reads plain text)"})
    fake_corpus: str = field(default="raw:wikitext2", metadata={"help": "fake-language: English corpus spec"})
    vocab_size: int = field(default=2000, metadata={"help": "most frequent word types per side"})
    min_count: int = field(default=3, metadata={"help": "occurrences a word type needs"})
    max_sentences: int = field(default=3000, metadata={"help": "sentences sampled per corpus (0 = all)"})
    max_words: int = field(default=64, metadata={"help": "words kept per sentence"})
    lowercase: bool = field(default=True, metadata={"help": "word types are lowercased"})
    test_fraction: float = field(default=0.5, metadata={"help": "held-out part of the dictionary (bli)"})
    retrieval: str = field(default="csls", metadata={"help": "csls | cosine"})
    csls_k: int = field(default=10, metadata={"help": "CSLS neighbourhood"})
    refine_iters: int = field(default=5, metadata={"help": "self-learning iterations from the seed"})
    center: bool = field(default=True, metadata={"help": "unit length, mean centring, unit length before mapping"})
    parallel_src: str = field(default="ud:en_pud", metadata={"help": "parallel: source treebank spec"})
    parallel_tgt: str = field(default="ud:es_pud", metadata={"help": "parallel: target treebank spec (same sent_ids)"})
    parallel_train_fraction: float = field(default=0.5, metadata={"help": "parallel: pairs used to fit the map"})
    pair_corpus: str = field(default="ud:en_ewt:dev", metadata={"help": "model-pair: corpus spec"})
    pair_words: int = field(default=4000, metadata={"help": "model-pair: word tokens compared"})
    pair_cka: tuple[str, ...] = field(default=("linear",), metadata={
        "help": "model-pair: comma-separated CKA variants: linear (Kornblith et al. 2019), standardized (every "
                "dimension z-scored first: robust to massive/rogue dimensions; adds per-layer "
                "top_dim_variance_share rows)"})
    old_corpus: str = field(default="raw:brown", metadata={"help": "diachronic: older corpus spec"})
    new_corpus: str = field(default="raw:wikitext2+raw:ewt_raw", metadata={"help": "diachronic: newer corpus spec"})
    anchors: int = field(default=1000, metadata={"help": "diachronic: frequent shared words the map is fitted on"})
    top_moved: int = field(default=20, metadata={"help": "diachronic: most-moved words listed"})
    moved_layer: int = field(default=-1, metadata={"help": "diachronic: layer whose most-moved words are listed"})
    permutations: int = field(default=0, metadata={
        "help": "diachronic: random re-splits of the two corpora's pooled documents (by document, the independent "
                "unit) giving each word's displacement a null distribution (0 = none; needs raw:/split: corpora)"})

    def validate(self, spec) -> None:
        super().validate(spec)
        if self.retrieval not in ac.METHODS:
            raise ConfigError(f"retrieval must be one of {ac.METHODS}, got {self.retrieval!r}")
        for name in ("vocab_size", "min_count", "csls_k", "refine_iters", "max_words", "pair_words", "anchors",
                     "top_moved"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_sentences < 0:
            raise ConfigError(f"max_sentences must be >= 0 (0 = all), got {self.max_sentences}")
        if self.permutations < 0:
            raise ConfigError(f"permutations must be >= 0 (0 = none), got {self.permutations}")
        for name in ("test_fraction", "parallel_train_fraction"):
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in (0, 1), got {getattr(self, name)}")
        for name in ("src_corpus", "tgt_corpus", "fake_corpus", "parallel_src", "parallel_tgt", "pair_corpus",
                     "old_corpus", "new_corpus"):
            _check_spec(name, getattr(self, name))
        if self.permutations and "diachronic" in self.tasks:
            for name in ("old_corpus", "new_corpus"):
                for part in getattr(self, name).split("+"):
                    if part.strip().partition(":")[0] not in ("raw", "split"):
                        raise ConfigError(f"{name}: permutations re-split documents, so every part must be raw:<name> "
                                          f"or split:<corpus>:<rule>, got {part.strip()!r}")
        unknown = [v for v in self.pair_cka if v not in ac.CKA_VARIANTS]
        if unknown or not self.pair_cka:
            raise ConfigError(f"pair_cka must list variants among {ac.CKA_VARIANTS}, got {list(self.pair_cka)!r}")
        if self.seed_dictionary not in ("numerals", "identical") and ":" not in self.seed_dictionary:
            raise ConfigError(f"seed_dictionary must be numerals, identical or a dictionary spec, "
                              f"got {self.seed_dictionary!r}")


def _check_spec(name: str, spec: str) -> None:
    from probes.align import communities

    for part in spec.split("+"):
        kind, sep, arg = part.strip().partition(":")
        if kind not in ("raw", "ud", "columns", "split") or not sep or not arg:
            raise ConfigError(f"{name}: corpus spec {part!r} must be raw:<name>, ud:<treebank>[:<split>], "
                              f"columns:<path> or split:<corpus>:<rule>")
        if kind == "split":
            try:
                communities.parse(arg)
            except ConfigError as e:
                raise ConfigError(f"{name}: {e}") from None


# --------------------------------------------------------------------------- helpers


def unit_center_unit(X: np.ndarray, center: bool) -> np.ndarray:
    """Artetxe et al. (2018)'s 'unit, center, unit' (or unit length only)."""
    X = ac.normalize(X)
    return ac.normalize(X, center=True) if center else X


def target_side(unit: runner.Unit, settings: Settings):
    """The handle reading the target side: the unit's own, or the `target` role (`target_checkpoint`,
    loaded once per run by the runner; its random-init twin for a twin unit)."""
    target = unit.roles.get("target")
    if target is None:
        return unit.handle, unit.model
    from workbench.store.checkpoints import checkpoint_name

    name = checkpoint_name(target.path)
    if not unit.is_twin:
        return target, name
    if "target_twin" not in unit.state:
        unit.state["target_twin"] = target.derive("random_init", {"seed": settings.seed + runner.TWIN_SEED_OFFSET + 1})
    return unit.state["target_twin"], name + runner.RANDOM_INIT_SUFFIX


def word_activations(handle, unit: runner.Unit, sentences, key: str, settings: Settings):
    """Cached word activations from any handle (the unit's accessor when it is the unit's model)."""
    if handle is unit.handle:
        return unit.activations(sentences, key)
    from workbench.activations import CACHE_DTYPES, extract

    stack = handle.stacks[0] if unit.stack not in handle.stacks else unit.stack
    return extract(handle, sentences, key, stack=stack, batch_size=settings.batch_size,
                   cache_dir=settings.cache_dir, dtype=CACHE_DTYPES[settings.cache_dtype], progress=settings.progress)


def paired_layers(n_src: int, n_tgt: int) -> list[int]:
    """Target layer paired with each source layer: the same relative depth (identity for equal depths)."""
    if n_src == n_tgt:
        return list(range(n_src))
    return [int(round(l * (n_tgt - 1) / max(n_src - 1, 1))) for l in range(n_src)]


def layer_accuracy_ci(correct: np.ndarray, settings: Settings, offset: int = 0):
    """95% bootstrap over test items (each its own unit) of per-layer accuracies; correct: [L, n] bool."""
    from probes.core import statistics  # imported here: this hunk stays apart from the module's imports

    _, low, high = statistics.ratio_bootstrap(correct.astype(np.float64), None, None, n_boot=settings.n_boot,
                                              seed=settings.seed + offset)
    return low, high
