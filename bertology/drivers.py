"""Training, the drivers and the reproductions from Python (`train`, `finetune`, `prune`, `distill`, `peft`, `reproduce`), the commands without their parsing.

Each is the command of the same name without its argument parsing: `train` is
`workbench.drivers.train.train_from_config` (what `bertology train` runs); the others are the
registered driver's `load` (the config file or mapping, keyword arguments as overrides, validated
before any work: a bad value is the CLI's one-line `ConfigError`) then its `run`
(`workbench.drivers.spec.DRIVERS`, what `bertology finetune|prune|distill|peft` run). Each returns
what its driver returns: the checkpoints (`train`) or the result with its run id, rows and the
checkpoints it wrote. `reproduce` is `bertology reproduce` (`app.reproduce.report`), its table as
a DataFrame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping


def train(config: str | Path | Mapping[str, Any], **overrides: Any) -> list[Path]:
    """Pretrain every seed of a training config (`experiments/train/*.yaml`, or a mapping); keyword
    arguments override its keys (a mapping merges into a section). Returns each seed's final
    checkpoint; a rerun resumes, a finished run returns at once.

    >>> finals = bertology.train("experiments/train/deberta_small.yaml", steps=200)   # doctest: +SKIP
    >>> bertology.load(finals[0].parent)        # the training folder: every saved step  # doctest: +SKIP
    """
    from workbench.drivers.train import train_from_config

    return train_from_config(config if isinstance(config, Mapping) else str(config), dict(overrides))


def _run_driver(name: str, config: str | Path | Mapping[str, Any] | None, overrides: Mapping[str, Any],
                executor: str = "local", jobs: int | None = None):
    """A registered driver's load then run (what `bertology <name>` does after parsing flags). A
    config whose `kind:` another driver runs goes to it (`DriverCommand.variants`: `distill` of a
    `kind: pretraining` file is pretraining distillation)."""
    from workbench.drivers.executor import resolve_options
    from workbench.drivers.spec import DRIVERS, get_driver
    from workbench.io import read_yaml

    options = resolve_options(executor, jobs)  # a bad executor: one line, before any work
    command = DRIVERS[name].command
    if command is not None and command.variants and config is not None:
        kind = (config if isinstance(config, Mapping) else read_yaml(Path(config))).get("kind")
        name = next((variant for k, variant, _ in command.variants if k == kind), name)
    spec = get_driver(name)
    loaded = spec.load(dict(config) if isinstance(config, Mapping) else (str(config) if config is not None else {}),
                       {k: v for k, v in overrides.items()})
    return spec.run(loaded, executor=options)


def finetune(config: str | Path | Mapping[str, Any] | None = None, *, executor: str = "local", jobs: int | None = None,
             **overrides: Any):
    """Fine-tune a checkpoint over seeds (`bertology finetune`): a config file or mapping and/or
    keyword overrides (`checkpoint=`, `task=`, `seeds=`, `epochs=`, `method=`, ...). Returns the
    `FinetuneResult`: `.run_id`, `.rows`, `.seeds[i].checkpoint` (each seed's best model), `.folder`.

    >>> ft = bertology.finetune(checkpoint="sentence-transformers/all-MiniLM-L6-v2", task="sentence_polarity", seeds=[0])  # doctest: +SKIP
    >>> bertology.load(ft.seeds[0].checkpoint)                                                                             # doctest: +SKIP
    """
    return _run_driver("finetune", config, overrides, executor, jobs)


def prune(config: str | Path | Mapping[str, Any], *, executor: str = "local", jobs: int | None = None,
          **overrides: Any):
    """The compression sweep (`bertology prune`): lottery tickets, quantization, low rank, heads of a
    fine-tuned model. Returns the `PruneResult`: `.run_id`, `.rows`, `.points` (each with its
    `checkpoint` when the config keeps them), `.folder`.

    >>> sweep = bertology.prune("experiments/prune/minilm_polarity_cpu.yaml")                # doctest: +SKIP
    >>> tickets = [p["checkpoint"] for p in sweep.points if p["method"] == "imp"]           # doctest: +SKIP
    """
    return _run_driver("prune", config, overrides, executor, jobs)


def distill(config: str | Path | Mapping[str, Any], *, executor: str = "local", jobs: int | None = None,
            **overrides: Any):
    """Distil a fine-tuned teacher into students (`bertology distill`; a `kind: pretraining` config
    is DistilBERT-style pretraining distillation). Returns the driver's result (`.run_id`, `.rows`,
    `.folder`).

    >>> bertology.distill("experiments/distill/polarity_minilm_cpu.yaml", seeds=[0])   # doctest: +SKIP
    """
    return _run_driver("distill", config, overrides, executor, jobs)


def peft(config: str | Path | Mapping[str, Any], *, executor: str = "local", jobs: int | None = None,
         **overrides: Any):
    """Fine-tune with every parameter-efficient method of a sweep config (`bertology peft`). Returns
    (run id, rows).

    >>> run_id, rows = bertology.peft("experiments/peft/minilm_polarity_cpu.yaml", methods=["full", "lora"])   # doctest: +SKIP
    """
    return _run_driver("peft", config, overrides, executor, jobs)


def reproduce(rows: list[str] | str | None = None, *, full: bool = False, quick: bool = False, strict: bool = False,
              threads: int | None = None, executor: str = "local", jobs: int | None = None):
    """The literature's headline findings beside ours (`bertology reproduce`, docs/reproduce.md):
    run the reproduction rows (default: every default row; `full` adds the long ones; `quick` runs
    every row's code path on tiny models trained here) and return the table `bertology reproduce`
    prints, as a DataFrame (paper value, ours with its CI, the test, the verdict). An unknown row, a
    model not in the local cache or `strict` with an unverified paper number is the CLI's one-line
    `ConfigError`, before any work. Like the command, it leaves the table in the runs root's
    `reproduce/latest` (`reproduce/quick`) for the app's Reproductions page.

    >>> bertology.reproduce(rows=["tenney2019"])[["row", "paper_value", "ours", "verdict"]]   # doctest: +SKIP
    """
    from app.reproduce.report import latest_folder, table, write
    from app.reproduce.report import reproduce as run_rows
    from workbench.drivers.executor import resolve_options
    from workbench.store.results import ResultsStore

    keys = [rows] if isinstance(rows, str) else rows
    options = resolve_options(executor, jobs)
    outcomes = run_rows(keys, full=full, quick=quick, strict=strict, threads=threads, executor=options)
    call = f"bertology.reproduce(rows={keys!r}, full={full}, quick={quick}, strict={strict})"
    write(outcomes, latest_folder(ResultsStore().root, quick), call, quick, png=False)
    return table(outcomes)
