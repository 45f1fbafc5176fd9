"""The training config schema: one YAML shape for every family (`experiments/train/*.yaml`).

```yaml
name: bert_small            # default: the file's stem
family: bert                # one of workbench.families.available_families()
preset: small               # tiny | small | base
model: {}                   # overrides of the preset's hyper-parameters
objective: {}               # overrides of the family's objective settings (mask rate, ...)
corpus: {sources: [brown, ...], heldout_fraction: 0.1, seed: 0, max_documents: null}
                            # canaries: {repetitions: [1, 4, 16, 64], digits: 6} plants secrets (data/canaries.py)
tokenizer: {vocab_size: 8000}  # path: FOLDER reuses a trained tokenizer instead (membership reference models)
max_len: 128
batch_size: 32              # GLOBAL sequences per micro-step (split over DDP ranks)
grad_accum: 1               # micro-steps per optimizer step
lr: 5.0e-4
warmup: 0.06                # steps (int >= 1) or a fraction of the total (float < 1)
weight_decay: 0.01
clip: 1.0
steps: 1000                 # or `tokens:` (converted to steps at max_len tokens per sequence)
seeds: [0]                  # several seeds = MultiBERTs-style runs (Sellam et al. 2022)
checkpoints: {log_spaced: true, every: null}
eval: {batches: 2}          # held-out loss on a fixed set of batches at every checkpoint
output_dir: null            # default <runs_root>/train/<name>; each seed in seed-<s>/
device: auto                # auto | cpu | cuda | cuda:N
bf16: true                  # bf16 autocast on CUDA (ignored on CPU)
cpu_bf16: false             # bf16 autocast on CPU too (below; `precision: bf16` says it for every device)
precision: null             # auto | fp32 | bf16 (below); null: `bf16` decides on CUDA, `cpu_bf16` on CPU
dropout_masks: pcg16        # pcg16 | pcg16_modules | bernoulli: how CPU dropout masks are drawn (below)
seq_len_warmup: null        # or {start: 16, steps: 500}: sequence-length warm-up (below)
```

`seq_len_warmup` (default off): train on truncated examples whose length grows linearly from
`start` to `max_len` over the first `steps` optimizer steps, floored to a multiple of 8 (never below
`start`), then `max_len` (Li, Zhang & He 2022, "The Stability-Efficiency Dilemma: Investigating
Sequence Length Warmup for Training GPT Models"). The example stream is unchanged: each example is
cut to the step's length (special tokens kept) before the collator masks it, so the length is a
pure function of the step and resuming stays exact; the tokens cut off are not trained, the log's
`tokens` counts only those trained (and a `tokens:` budget still converts to steps at `max_len`).
Held-out loss is always measured at `max_len`. Families with plain token-block or sentence-pair
examples support it (`FamilySpec.truncate_example`); seq2seq (T5, BART) and ELMo raise ConfigError.

`cpu_bf16` (default off): the forward pass under `torch.autocast("cpu", bfloat16)`. Worth it only
where the CPU multiplies bf16 natively (AVX-512 BF16 or AMX; `lscpu` flags `avx512_bf16`,
`amx_bf16`): measured 1.88x faster training steps for the `small` BERT on a 2-core AMD EPYC with
AVX-512 BF16 (`benchmarks/bench_train.py --variants bf16`); without those flags bf16 matmuls are
emulated and slower than fp32. Weights differ from an fp32 run (bf16 rounding in the forward),
so the config's training hash includes it.

`precision` (default unset): `auto` = bf16 on CUDA (as `bf16: true`) and on CPUs whose flags list
`amx_bf16` or `avx512_bf16`, fp32 elsewhere; `fp32` / `bf16` force one on every device
(`workbench/precision.py` holds the rule). The RESOLVED format, not the word, enters the training
hash, as the `cpu_bf16` key would: `precision: auto` on an AMX CPU, `precision: bf16` and
`cpu_bf16: true` train the same weights and share a hash; `auto` on a CPU without native bf16
hashes like plain fp32. `cpu_bf16: true` with `precision: fp32` is refused (they contradict).

`dropout_masks` (default `pcg16` since 2026-11-26): every `nn.Dropout` module of the training model
draws its CPU mask from 16-bit PCG64 lanes (`workbench/dropout.py`; keep probability quantised to
1/65536) instead of torch's `bernoulli_`: measured 14% less CPU time per step of the main job's
DeBERTa-style `small` model on the 2-core Intel Xeon with AMX (docs/evidence/benchmarks.md). `bernoulli`
trains exactly as before (the runs before that date); the weights differ between the two, so
`pcg16` enters the training hash (and `bernoulli` hashes as the configs before the key did).
Since 2026-11-27 `pcg16` also covers the attention-probability dropout that HF's BERT-style
families apply functionally inside their attention function (`FamilySpec.attention_dropout`
"functional": the model runs the registered attention function
`bertology_pcg16`, eager attention with these masks, instead of the default SDPA with `bernoulli_`):
other weights for those families, so their `pcg16` hash changed; `pcg16_modules` is the `pcg16` of
2026-11-26 (module masks only, the family's default attention) and hashes as it did, to resume or
reproduce runs of that day. DeBERTa (attention dropout through a module) and ELMo train the same
under both and keep their hash. On CUDA all of them draw with torch's Philox and the attention
stays the family's default (SDPA's fused kernels), whatever the setting.

`load_train_config` validates every key and value and raises `ConfigError` naming the file and the
offending key (e.g. `experiments/train/x.yaml: corpus.heldout_fraction: must be in (0, 1), got 2`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from workbench.coerce import NOT_A_KEY, apply_overrides, build_dataclass, settings_hash
from workbench.errors import ConfigError
from workbench.io import read_yaml, sha256_file

DROPOUT_MASKS = ("pcg16", "pcg16_modules", "bernoulli")  # `dropout_masks` values (module docstring)

def _default_sources() -> list[str]:
    """The corpus builder's English pretraining sources (EWT/GUM raw text left out, see there)."""
    from workbench.data.corpus import default_pretraining_sources

    return default_pretraining_sources()


@dataclass
class CorpusConfig:
    sources: list[str] = field(default_factory=_default_sources)
    heldout_fraction: float = 0.1
    seed: int = 0
    max_documents: int | None = None
    # 1: documents as the sources define them (every model trained before 2026-11-26); 2: whole-file
    # sources (webtext) held out by blocks of lines in every file, so membership non-members come
    # from every file (workbench/data/corpus.py)
    recipe: int = 1
    # Random secrets planted in the train split (Carlini et al. 2019), e.g. {repetitions: [1, 4, 16, 64],
    # digits: 6}; see workbench/data/canaries.py. None (the default) plants none.
    canaries: dict | None = None


@dataclass
class TokenizerConfig:
    vocab_size: int = 8000
    # Reuse a trained tokenizer (a checkpoint or tokenizer folder) instead of training one on the
    # corpus, e.g. a membership reference model trained on other data that must read text exactly
    # as its target does (Carlini et al. 2021). vocab_size must equal its size.
    path: str | None = None


@dataclass
class CheckpointConfig:
    log_spaced: bool = True  # 0, 1, 2, 4, 8, ... (training dynamics are fastest early)
    every: int | None = None  # plus every N steps


@dataclass
class EvalConfig:
    batches: int = 2  # held-out batches evaluated at each checkpoint; 0 = none


@dataclass
class SeqLenWarmupConfig:
    start: int  # sequence length (special tokens included) of step 0
    steps: int  # optimizer steps over which the length grows to max_len


@dataclass
class TrainConfig:
    family: str
    name: str = "run"
    preset: str = "tiny"
    model: dict = field(default_factory=dict)
    objective: dict = field(default_factory=dict)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    max_len: int = 128
    batch_size: int = 32
    grad_accum: int = 1
    lr: float = 5e-4
    warmup: float = 0.06
    weight_decay: float = 0.01
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    adam_eps: float = 1e-8
    clip: float = 1.0
    steps: int | None = None
    tokens: int | None = None
    seeds: list[int] = field(default_factory=lambda: [0])
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str | None = None
    device: str = "auto"
    bf16: bool = True
    cpu_bf16: bool = False
    precision: str | None = None  # auto | fp32 | bf16; None = the older keys above decide
    dropout_masks: str = "pcg16"  # pcg16 | pcg16_modules (2026-11-26's pcg16) | bernoulli (torch's, before 2026-11-26)
    seq_len_warmup: SeqLenWarmupConfig | None = None
    deterministic: bool = True
    log_every: int = 1
    progress: bool = True
    source: str = field(default="<dict>", metadata=NOT_A_KEY)  # where the config came from (for messages)

    # ---- derived values -------------------------------------------------------------------
    @property
    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        per_step = self.batch_size * self.grad_accum * self.max_len
        return max(1, math.ceil(self.tokens / per_step))

    def warmup_steps(self) -> int:
        return int(self.warmup) if self.warmup >= 1 else int(round(self.warmup * self.total_steps))

    def seq_len_at(self, step: int) -> int:
        """The example length of optimizer step `step` under `seq_len_warmup` (max_len when off):
        start + (max_len - start) * step / steps floored to a multiple of 8, at least start; max_len
        from step `steps` on (Li, Zhang & He 2022)."""
        w = self.seq_len_warmup
        if w is None or step >= w.steps:
            return self.max_len
        length = w.start + (self.max_len - w.start) * step // w.steps
        return min(self.max_len, max(w.start, length - length % 8))

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("source")
        return d

    def resolved_precision(self, device: str | None = None) -> tuple[str, str]:
        """("fp32" | "bf16", why) of this config's forward on `device` (default: its own `device`)."""
        from workbench.precision import resolve_precision

        return resolve_precision(self.precision, device or self.device, self.bf16, self.cpu_bf16)

    def training_hash(self, device: str | None = None) -> str:
        """Hash of everything that changes the trained weights (not seeds list, paths, display).

        The precision enters as resolved on `device` (default: the config's own `device`): on CPU
        the `cpu_bf16` key is present exactly when the forward runs in bf16, on CUDA the `bf16` key
        says which, so configs without `precision` hash as they always did."""
        from workbench.precision import device_type

        d = self.to_dict()
        d.pop("precision")
        if self.precision is not None:
            bf16 = self.resolved_precision(device)[0] == "bf16"
            if device_type(device or self.device) == "cpu":
                d["cpu_bf16"] = bf16
            else:
                d["bf16"], d["cpu_bf16"] = bf16, False
        for k in ("seeds", "output_dir", "progress", "log_every", "eval", "name", "device"):
            d.pop(k)
        if d["dropout_masks"] == "bernoulli":  # the masks of every run before the key: hash as then
            d.pop("dropout_masks")
        else:  # pcg16_modules: the module masks only, hashed as `pcg16` was before attention was covered
            from workbench.families import get_family

            d["dropout_masks"] = "pcg16"
            if self.dropout_masks == "pcg16" and get_family(self.family).attention_dropout == "functional":
                d["attention_dropout_masks"] = "pcg16"  # only where the training changed (module docstring)
        if d["seq_len_warmup"] is None:  # keys added later hash as before when unused
            d.pop("seq_len_warmup")
        if not d["cpu_bf16"]:
            d.pop("cpu_bf16")
        if d["corpus"]["recipe"] == 1:
            d["corpus"].pop("recipe")
        if d["corpus"]["canaries"] is None:
            d["corpus"].pop("canaries")
        if d["tokenizer"]["path"] is None:
            d["tokenizer"].pop("path")
        else:  # the tokenizer's content, not where it lies, changes the weights
            d["tokenizer"]["path"] = _file_identity(Path(d["tokenizer"]["path"]) / "tokenizer.json")
        return settings_hash(d)


def _file_identity(path: Path) -> str:
    """sha256 of a file's bytes, or its path while it does not exist (training then stops with a
    ConfigError naming it)."""
    return sha256_file(path) if path.is_file() else str(path)


# ---- loading and validation ---------------------------------------------------------------------


def _fail(source: str, key: str, msg: str):
    raise ConfigError(f"{source}: {key}: {msg}")


def _validate(cfg: TrainConfig) -> None:
    from workbench.families import available_families

    s = cfg.source
    known = available_families()
    if cfg.family not in known:
        _fail(s, "family", f"unknown family {cfg.family!r} (known: {', '.join(known)})")
    if cfg.preset not in ("tiny", "small", "base"):
        _fail(s, "preset", f"must be tiny, small or base, got {cfg.preset!r}")
    if (cfg.steps is None) == (cfg.tokens is None):
        _fail(s, "steps", "give exactly one of `steps` and `tokens`")
    if cfg.steps is not None and cfg.steps < 1:
        _fail(s, "steps", f"must be >= 1, got {cfg.steps}")
    if cfg.tokens is not None and cfg.tokens < 1:
        _fail(s, "tokens", f"must be >= 1, got {cfg.tokens}")
    for key in ("max_len", "batch_size", "grad_accum", "log_every"):
        if getattr(cfg, key) < 1:
            _fail(s, key, f"must be >= 1, got {getattr(cfg, key)}")
    if cfg.lr <= 0:
        _fail(s, "lr", f"must be > 0, got {cfg.lr}")
    if cfg.warmup < 0 or (cfg.warmup >= 1 and not float(cfg.warmup).is_integer()):
        _fail(s, "warmup", f"must be a fraction in [0, 1) or a whole number of steps, got {cfg.warmup}")
    if cfg.weight_decay < 0:
        _fail(s, "weight_decay", f"must be >= 0, got {cfg.weight_decay}")
    if cfg.clip < 0:
        _fail(s, "clip", f"must be >= 0 (0 = no clipping), got {cfg.clip}")
    if len(cfg.adam_betas) != 2 or not all(0 <= b < 1 for b in cfg.adam_betas):
        _fail(s, "adam_betas", f"must be two numbers in [0, 1), got {cfg.adam_betas}")
    if not cfg.seeds:
        _fail(s, "seeds", "must list at least one seed")
    if len(set(cfg.seeds)) != len(cfg.seeds):
        _fail(s, "seeds", f"seeds repeat: {cfg.seeds}")
    if not cfg.corpus.sources:
        _fail(s, "corpus.sources", "must list at least one source")
    if not 0 < cfg.corpus.heldout_fraction < 1:
        _fail(s, "corpus.heldout_fraction", f"must be in (0, 1), got {cfg.corpus.heldout_fraction}")
    if cfg.corpus.max_documents is not None and cfg.corpus.max_documents < 2:
        _fail(s, "corpus.max_documents", f"must be >= 2, got {cfg.corpus.max_documents}")
    if cfg.corpus.canaries is not None:
        from workbench.data.canaries import validate_spec

        if not isinstance(cfg.corpus.canaries, dict):
            _fail(s, "corpus.canaries", f"must be a mapping (repetitions, digits, ...), got {cfg.corpus.canaries!r}")
        cfg.corpus.canaries = validate_spec(cfg.corpus.canaries, f"{s}: corpus.canaries")
    if cfg.tokenizer.vocab_size < 50:
        _fail(s, "tokenizer.vocab_size", f"must be >= 50, got {cfg.tokenizer.vocab_size}")
    if cfg.checkpoints.every is not None and cfg.checkpoints.every < 1:
        _fail(s, "checkpoints.every", f"must be >= 1, got {cfg.checkpoints.every}")
    if cfg.eval.batches < 0:
        _fail(s, "eval.batches", f"must be >= 0, got {cfg.eval.batches}")
    if cfg.seq_len_warmup is not None:
        w = cfg.seq_len_warmup
        if not 8 <= w.start <= cfg.max_len:
            _fail(s, "seq_len_warmup.start", f"must be in [8, max_len={cfg.max_len}], got {w.start}")
        if w.steps < 1:
            _fail(s, "seq_len_warmup.steps", f"must be >= 1, got {w.steps}")
    if cfg.dropout_masks not in DROPOUT_MASKS:
        _fail(s, "dropout_masks", f"must be one of {', '.join(DROPOUT_MASKS)}, got {cfg.dropout_masks!r}")
    if cfg.precision is not None:
        from workbench.precision import PRECISIONS

        if cfg.precision not in PRECISIONS:
            _fail(s, "precision", f"must be one of {', '.join(PRECISIONS)}, got {cfg.precision!r}")
        if cfg.precision == "fp32" and cfg.cpu_bf16:
            _fail(s, "precision", "fp32 contradicts cpu_bf16: true (drop cpu_bf16; precision: bf16 replaces it)")
    if not (cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:")):
        _fail(s, "device", f"must be auto, cpu, cuda or cuda:N, got {cfg.device!r}")


def load_train_config(path_or_dict: str | Path | dict | TrainConfig, overrides: dict | None = None) -> TrainConfig:
    """A validated `TrainConfig` from a YAML file or a dict, with `overrides` on top by the
    workbench's one override rule (`workbench.coerce.apply_overrides`: dotted keys such as
    `{"corpus.max_documents": 50}` or a mapping `{"corpus": {...}}` merge into a section; None
    changes nothing). A file's name is the run's name unless the config says otherwise; an override
    of `steps` or of `tokens` replaces the other one of the file (the run's length is one of them).
    """
    if isinstance(path_or_dict, TrainConfig):
        data, source, stem = path_or_dict.to_dict(), path_or_dict.source, path_or_dict.name
    elif isinstance(path_or_dict, dict):
        data, source, stem = copy.deepcopy(path_or_dict), "<dict>", None
    else:
        path = Path(path_or_dict)
        source, stem = str(path), path.stem
        data = read_yaml(path)
    given = {k for k, v in (overrides or {}).items() if v is not None}
    data = apply_overrides(data, overrides, source)
    if "name" not in data and stem:
        data["name"] = stem
    if "steps" in data and "tokens" in data and ("steps" in given) != ("tokens" in given):
        data.pop("tokens" if "steps" in given else "steps")  # an override of one replaces the other
    cfg = build_dataclass(TrainConfig, data, source)
    cfg.source = source
    _validate(cfg)
    return cfg
