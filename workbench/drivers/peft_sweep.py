"""What each fine-tuning method changes, layer by layer: a sweep over `bertology finetune --method`.

`bertology peft CONFIG.yaml` (experiments/peft/*.yaml) fine-tunes one checkpoint with every
method of `workbench.running.peft_methods.METHODS` it lists, each through the ordinary fine-tuning runner
(its own run folder `finetune/<name>-<method>/`, resumable, its own results-store run), then
compares every seed's best checkpoint with the starting checkpoint on the same sentences (UD EWT
dev by default): the linear CKA (Kornblith et al. 2019; `workbench.geometry.linear_cka`) of
each layer's word vectors (first subword) in the fine-tuned model against the same layer of the
start. CKA 1 means the layer's representation geometry is unchanged up to rotation and scale;
Merchant et al. (2020) found full fine-tuning changes mostly the top layers of BERT.

Rows of one results-store run (probe "peft", model = the starting checkpoint, extra.method):
per method and seed, `accuracy` on dev and test (extra.trainable, extra.total_parameters) and
`trainable_parameters`; per method, seed and layer, `cka_to_start` (layer 0 = embeddings).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from workbench.drivers.spec import NOT_IDENTITY, DriverSpec, split_section
from workbench.coerce import load_config
from workbench.errors import ConfigError
from workbench.progress import get_logger
from workbench.store.rowschema import RowSchema

PROBE = "peft"
# The `extra` of the sweep's rows (checked by the results store, `workbench.store.rowschema`).
EXTRA_SCHEMAS = (
    RowSchema(PROBE, "per seed", required={"method": str, "lr": float, "trainable": int | None,
                                           "total_parameters": int | None, "checkpoint": str, "finetune_run": str},
              optional={"treebank": str}),
)


@dataclass
class PeftSweepConfig:
    """One sweep: the fine-tuning config every method shares, the methods, per-method learning
    rates (the methods train very different numbers of values: their usual rates differ by orders
    of magnitude), and the sentences the layers are compared on."""

    finetune: dict                                  # a FinetuneConfig (method and lr are set per method)
    methods: list[str] = field(default_factory=lambda: ["full", "head", "bitfit", "adapter", "prompt", "lora"])
    lr: dict = field(default_factory=dict)          # method -> learning rate (default: finetune.lr)
    cka_treebank: str = "en_ewt"
    cka_split: str = "dev"
    cka_sentences: int = 500                         # the first N sentences of the split
    name: str | None = field(default=None, metadata=NOT_IDENTITY)  # results-store run name

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def load_sweep_config(source, overrides: dict | None = None, methods: list[str] | None = None) -> PeftSweepConfig:
    """A validated sweep config from YAML or a dict; `overrides` replace keys of `finetune`, `methods`
    the method list (`workbench.coerce.load_config`'s rule: None values ignored, `finetune.KEY` for
    a key of the fine-tuning). Every method's fine-tuning config is validated here, before any work."""
    from workbench.running.peft_methods import METHODS

    cfg, where = load_config(PeftSweepConfig, source, {"methods": methods, **{
        f"finetune.{k}": v for k, v in (overrides or {}).items()}}, label="peft config")
    if not cfg.methods:
        raise ConfigError(f"{where}: methods: list at least one of {', '.join(METHODS)}")
    for m in list(cfg.methods) + list(cfg.lr):
        if m not in METHODS:
            raise ConfigError(f"{where}: methods: unknown method {m!r} (known: {', '.join(METHODS)})")
    if len(set(cfg.methods)) != len(cfg.methods):
        raise ConfigError(f"{where}: methods: {cfg.methods} repeats a method")
    for m, v in cfg.lr.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ConfigError(f"{where}: lr: {m}: must be a number > 0, got {v!r}")
    if cfg.cka_sentences < 2:
        raise ConfigError(f"{where}: cka_sentences: must be >= 2, got {cfg.cka_sentences}")
    if "method" in cfg.finetune:
        raise ConfigError(f"{where}: finetune: method: set by the sweep (list them under methods)")
    for m in cfg.methods:
        method_config(cfg, m, f"{where}: finetune ({m})")
    return cfg


def method_config(cfg: PeftSweepConfig, method: str, where: str = "peft config"):
    """The fine-tuning config of one method of the sweep (its own run folder name)."""
    from workbench.drivers.finetune import load_finetune_config

    ft = {**cfg.finetune, "method": method}
    if method in cfg.lr:
        ft["lr"] = float(cfg.lr[method])
    if ft.get("name"):
        ft["name"] = f"{ft['name']}-{method}"
    try:
        return load_finetune_config(ft)
    except ConfigError as e:
        raise ConfigError(f"{where}: {str(e).removeprefix('finetune config: ')}") from None


def layer_states(handle, sentences: list[list[str]]) -> np.ndarray:
    """[L+1, n_words, H] first-subword vectors of every layer over all `sentences`."""
    return np.concatenate([s.copy() for s in handle.word_states(sentences, pooling="first")], axis=1)


def cka_to_start(start: np.ndarray, tuned: np.ndarray) -> list[float]:
    """Linear CKA of each layer of `tuned` against the same layer of `start` ([L+1, n, H] each)."""
    from workbench.geometry import linear_cka

    if start.shape[:2] != tuned.shape[:2]:
        raise ConfigError(f"CKA to start: the models give {start.shape[:2]} and {tuned.shape[:2]} (layers, words)")
    return [linear_cka(start[layer], tuned[layer]) for layer in range(start.shape[0])]


def cka_sentences(cfg: PeftSweepConfig) -> list[list[str]]:
    """The sentences (lists of words) the layers are compared on: the first `cka_sentences` of the split."""
    from workbench.data.conllu import load_treebank

    return [list(s.words) for s in load_treebank(cfg.cka_treebank, cfg.cka_split)[: cfg.cka_sentences]]


def method_rows(cfg: PeftSweepConfig, method: str, ft_cfg, store, start: np.ndarray | None = None,
                progress: bool = True) -> tuple[str, list[dict]]:
    """One method of the sweep, an executor unit (this process, a local process or a submitit job):
    its fine-tuning run (`run_finetune`, its own results-store run in `store`, a store or its root),
    then its seeds' rows (module docstring). `start`: the starting checkpoint's layer states,
    computed here when not given (a worker computes them itself rather than receive them pickled).
    Returns (the fine-tuning run id, the rows)."""
    from workbench.store.checkpoints import single_checkpoint
    from workbench.drivers.finetune import run_finetune
    from workbench.running.models import ModelHandle
    from workbench.store.results import ResultsStore

    if isinstance(store, (str, Path)):
        store = ResultsStore(store)
    sentences = cka_sentences(cfg)
    if start is None:
        start = layer_states(ModelHandle.load(single_checkpoint(ft_cfg.checkpoint), device=_device(ft_cfg)), sentences)
    if progress:
        get_logger(__name__).info(f"== method {method} (lr {ft_cfg.lr:g})")
    result = run_finetune(ft_cfg, store=store)
    base = {"model": ft_cfg.checkpoint, "probe": PROBE, "task": ft_cfg.task}
    rows = []
    for seed_result in result.seeds:
        trainable = seed_result.trainable or {}
        extra = {"method": method, "lr": ft_cfg.lr, "trainable": trainable.get("parameters"),
                 "total_parameters": trainable.get("total"), "checkpoint": seed_result.checkpoint,
                 "finetune_run": result.run_id}
        common = {**base, "seed": seed_result.seed, "step": seed_result.best_step}
        for split in ("dev", "test"):
            part = getattr(seed_result, split)
            rows.append({**common, "split": split, "metric": "accuracy", "value": part["accuracy"],
                         "n": part["n"], "extra": extra})
        rows.append({**common, "metric": "trainable_parameters", "value": float(trainable.get("parameters", np.nan)),
                     "extra": extra})
        tuned = layer_states(ModelHandle.load(seed_result.checkpoint, device=_device(ft_cfg)), sentences)
        for layer, value in enumerate(cka_to_start(start, tuned)):
            rows.append({**common, "split": cfg.cka_split, "layer": layer, "metric": "cka_to_start",
                         "value": value, "n": int(start.shape[1]), "extra": {**extra, "treebank": cfg.cka_treebank}})
    return result.run_id, rows


def run_sweep(cfg: PeftSweepConfig, store=None, progress: bool = True, executor=None) -> tuple[str, "object"]:
    """Every method's fine-tuning run, then the per-layer CKA of each seed's best checkpoint against
    the start; one results-store run of rows (module docstring). Returns (run id, rows). The methods
    are the executor's units (`executor`: `workbench.drivers.executor.ExecutorOptions`, default this process;
    `method_rows`), their rows joined in the config's method order."""
    import pandas as pd

    from workbench.store.checkpoints import single_checkpoint
    from workbench.data.conllu import treebank_path
    from workbench.drivers.executor import ExecutorOptions, Unit, replace_threads, run_driver_units
    from workbench.running.models import ModelHandle
    from workbench.store.results import ResultsStore

    options = (executor or ExecutorOptions()).validate()
    store = store or ResultsStore()
    configs = {m: method_config(cfg, m) for m in cfg.methods}
    # the baselines (majority, bag of words) are the same for every method: computed with the first only
    configs = {m: c if i == 0 else dataclasses.replace(c, baselines=False) for i, (m, c) in enumerate(configs.items())}
    first = configs[cfg.methods[0]]
    start_path = single_checkpoint(first.checkpoint)

    def units(parallel: bool) -> list:
        if not parallel:
            start = layer_states(ModelHandle.load(start_path, device=_device(first)), cka_sentences(cfg))
            return [Unit(method_rows, (cfg, m, c, store, start, progress), name=m) for m, c in configs.items()]
        return [Unit(method_rows, (cfg, m, replace_threads(c), str(store.root), None, False), name=m)
                for m, c in configs.items()]

    done = run_driver_units(units, len(configs), options, store.root, cfg.name or f"peft-{first.task}", desc="methods")
    runs = {m: run_id for m, (run_id, _) in zip(configs, done)}
    rows = [row for _, method_rows_ in done for row in method_rows_]
    with store.start_run(PROBE, cfg.to_dict(), seeds=first.seeds, data_files=[treebank_path(cfg.cka_treebank, cfg.cka_split)],
                         checkpoints=[start_path], name=cfg.name or f"peft-{first.task}") as writer:
        writer.add(rows)
        writer.note("finetune_runs", runs)
        run_id = writer.run_id
    return run_id, pd.DataFrame(rows)


def _device(ft_cfg) -> str:
    import torch

    if ft_cfg.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return ft_cfg.device


def format_summary(rows) -> str:
    """Per method: trainable parameters, test accuracy (mean over seeds) and the CKA to the start of
    the first, middle and last layer."""
    import pandas as pd

    df = pd.DataFrame(rows)
    df["method"] = [e["method"] for e in df["extra"]]
    lines = [f"{'method':<8} {'trainable':>11} {'test acc':>9} {'seeds':>5}  CKA to start, layer 0 / mid / last"]
    for method, g in df.groupby("method", sort=False):
        acc = g[(g["metric"] == "accuracy") & (g["split"] == "test")]["value"]
        n_train = g[g["metric"] == "trainable_parameters"]["value"].mean()
        cka = g[g["metric"] == "cka_to_start"].groupby("layer")["value"].mean()
        L = int(cka.index.max())
        lines.append(f"{method:<8} {n_train:>11,.0f} {acc.mean():>9.4f} {len(acc):>5}  "
                     f"{cka.loc[0]:.3f} / {cka.loc[L // 2]:.3f} / {cka.loc[L]:.3f}")
    return "\n".join(lines)


def load_driver_config(source, overrides: dict | None = None) -> PeftSweepConfig:
    """The registry's load: overrides keyed like the YAML (`methods`, `finetune.KEY`)."""
    outer, finetune = split_section(overrides, "finetune")
    unknown = set(outer) - {"methods"}
    if unknown:
        raise ConfigError(f"peft overrides: {sorted(unknown)} are not sweep keys (methods, finetune.KEY)")
    return load_sweep_config(source, finetune, methods=outer.get("methods"))


def report(result) -> str:
    """What `bertology peft` prints: the summary per method, then the run id."""
    run_id, rows = result
    return f"{format_summary(rows)}\nrun {run_id}"


DRIVER = DriverSpec("peft", PeftSweepConfig, load_driver_config, run_sweep, report)
