"""The driver contract, beside the probe contract (`probes.core.runner.ProbeSpec`).

A *driver* trains or changes models and writes rows: fine-tuning (`bertology finetune`), task
distillation and pretraining distillation (`bertology distill`), the compression sweep
(`bertology prune`), the PEFT sweep (`bertology peft`). Each says only what is specific to it:

    Config dataclass            its settings; a field whose value does not change the results (a
                                folder, a display name, the device, threads, progress) carries
                                `field(..., metadata=NOT_IDENTITY)`; a field that counts only in
                                some configs carries `metadata={"identity": predicate}` with
                                `predicate(config) -> bool` (fine-tuning's method options count only
                                for the method that reads them)
    load(source, overrides)     `load_config` + its own validation, before any work
    run(config, store, executor=ExecutorOptions)   its independent units through `workbench.drivers.executor`
    DRIVER = DriverSpec(...)    registered in `DRIVERS` below

The run's identity is computed generically (`identity`, `identity_hash`): every identity field,
as plain JSON values, hashed by `workbench.coerce.settings_hash` (sha256 of the sorted JSON). The
hand-kept "not part of the key" lists the drivers had are these metadata now; the hashes and keys
they gave are unchanged (tests/test_drivers.py compares them with the ones the old code gave for
every example config under experiments/).

One YAML loader with one override rule for every config of the workbench (`workbench.coerce.
load_config` and `apply_overrides`, used by the drivers here, by pretraining's `TrainConfig` and by
the probes' settings): the file (or a mapping, or a config object) is read, overrides go on top
(None changes nothing; `section.key` sets a key inside a section, e.g. `finetune.checkpoint` = the
prune and PEFT sweeps' --checkpoint; a mapping given for a mapping merges into it), then the
mapping is coerced field by field (unknown keys and bad values are one ConfigError naming the file
and the key).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from workbench.coerce import settings_hash
from workbench.errors import ConfigError

IDENTITY = "identity"
NOT_IDENTITY = {IDENTITY: False}  # field metadata: this field does not change the results


# ------------------------------------------------------------------------------------- identity

def identity_fields(config) -> list[str]:
    """The names of the config's fields that count for its identity (their metadata, the config's values)."""
    names = []
    for f in dataclasses.fields(config):
        rule = f.metadata.get(IDENTITY, True)
        if rule is False or (callable(rule) and not rule(config)):
            continue
        names.append(f.name)
    return names


def identity(config, **derived: Any) -> dict[str, Any]:
    """The config's identity: its identity fields as plain values (`dataclasses.asdict`'s). `derived`
    gives a field's value by what stands for it (the prune sweep's `finetune` mapping is replaced by
    the fine-tuning's own identity: its training hash, checkpoint and seeds)."""
    values = dataclasses.asdict(config)
    return {name: (derived[name] if name in derived else copy.deepcopy(values[name]))
            for name in identity_fields(config)}


def identity_hash(config, **derived: Any) -> str:
    """`settings_hash` of `identity(config, **derived)`: equal settings, equal hash (run folders,
    resume keys)."""
    return settings_hash(identity(config, **derived))


# ------------------------------------------------------------------------------------- registry

@dataclass(frozen=True)
class DriverSpec:
    """A registered driver (module docstring). `load(source, overrides)` takes overrides keyed like
    its YAML (`section.key` inside a mapping section, the rule of `load_config`); `report(result)`
    is what its command prints. Its one-line description is its `Registration`'s (read without
    importing the driver).

    `units(config, store)` -> `workbench.drivers.executor.UnitPlan` and `collect(config, store, plan,
    results)` -> the result split a driver into its independent units and what is made of their
    results; the executor (`run_plan`) owns what lies between: the job folder's default and whether
    the units run in this process or in workers. A driver given them needs no `run` of its own
    (`run` is then `execute`: units, the executor, collect)."""

    name: str
    config: type
    load: Callable[..., Any]          # (source, overrides=None) -> a validated config
    run: Callable[..., Any] | None    # (config, store=None, executor=ExecutorOptions | None) -> its result
    report: Callable[[Any], str]      # result -> the command's printed table and run line
    identity: Callable[[Any], Any] | None = None  # the run's identity when it is not `identity_hash(config)`
    units: Callable[..., Any] | None = None    # (config, store) -> UnitPlan
    collect: Callable[..., Any] | None = None  # (config, store, plan, results) -> the result

    def __post_init__(self):
        if (self.units is None) != (self.collect is None):
            raise ValueError(f"driver {self.name}: units and collect go together")
        if self.run is None:
            if self.units is None:
                raise ValueError(f"driver {self.name}: needs run, or units and collect")
            object.__setattr__(self, "run", self.execute)

    def execute(self, config, store=None, executor=None) -> Any:
        """units -> the executor -> collect (`units` and `collect` given)."""
        from workbench.drivers.executor import run_plan

        plan = self.units(config, store)
        return self.collect(config, store, plan, run_plan(plan, executor))

    def run_identity(self, config) -> Any:
        return (self.identity or identity_hash)(config)


# ------------------------------------------------------------------------------------- commands

FLAG_PARSES = ("text", "int", "float", "ints", "int_list", "names", "switch", "set")


@dataclass(frozen=True)
class Flag:
    """One flag of a driver's subcommand: `--name VALUE` sets the override `key` (default: the name
    with "_" for "-"; `section.key` sets a key inside a section). `parse` turns the text into the
    override (`parse_flag`; a bad value is one ConfigError naming the flag, before any work);
    `argtype` is argparse's own conversion instead (a usage error, exit 2), with `nargs` and
    `choices` as argparse's. `parse="set"` is the repeatable `--set KEY=VALUE` (`parse_set`): each a
    key of the config, dotted into sections, its value read as YAML."""

    name: str
    help: str | None = None
    key: str | None = None
    parse: str = "text"
    argtype: Callable[[str], Any] | None = None
    nargs: str | None = None
    choices: tuple | None = None
    metavar: str | None = None

    def __post_init__(self):
        if self.parse not in FLAG_PARSES:  # a typo would otherwise parse as "ints" or fail mid-command
            raise ValueError(f"flag {self.name}: parse must be one of {', '.join(FLAG_PARSES)}, got {self.parse!r}")

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")

    @property
    def override_key(self) -> str:
        return self.key or self.dest


@dataclass(frozen=True)
class DriverCommand:
    """How `bertology <driver>` reads its arguments: the config positional, the flags (each an
    override of the config), the executor flags' wording (`units`). `variants`: the YAML's `kind:`
    value -> the registered driver that runs such a file (`bertology distill` runs DistilBERT-style
    pretraining distillation for `kind: pretraining`), with the flags that driver takes."""

    config_help: str
    flags: tuple[Flag, ...]
    units: str
    config_optional: bool = False
    needs_without_config: str | None = None  # flag required when no config is given, and the message
    variants: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (kind, driver name, flags it takes)
    needs_message: str | None = None  # the error when needs_without_config is missing (default: names the flag)


@dataclass(frozen=True)
class Registration:
    """A driver in the registry: the module defining its `DRIVER`, imported only when used (drivers
    pull in torch), its one-line description and, for those with a subcommand, the command."""

    module: str
    description: str
    command: DriverCommand | None = None


DEVICE_HELP = "auto (default: cuda when available) | cpu | cuda | cuda:N"
_FINETUNE_FLAGS = (
    Flag("--checkpoint", "checkpoint folder, training folder (last step) or Hub model name"),
    Flag("--task", "sentence_polarity | subjectivity | upos | conll2002_es | conll2002_nl"),
    Flag("--seeds", "comma-separated, e.g. 0,1,2", parse="int_list"),
    *(Flag(f"--{f}", parse=kind) for f, kind in (("epochs", "int"), ("lr", "float"), ("batch-size", "int"),
                                                 ("max-train-examples", "int"), ("max-eval-examples", "int"),
                                                 ("patience", "int"), ("max-len", "int"))),
    Flag("--pooling", "auto | first | last | decoder_last | encoder_mean | scalar_mix"),
    Flag("--name", "run folder name under <runs root>/finetune/"),
    Flag("--output-dir", "run folder (default <runs root>/finetune/<name>)"),
    Flag("--threads", "torch CPU threads", argtype=int),
    Flag("--device", DEVICE_HELP),
    Flag("--keep-epoch-checkpoints", "save a checkpoint at every epoch end", parse="switch"),
    Flag("--method", "what trains: full (default) | head | bitfit | adapter | prompt | lora (docs/peft.md)"),
    *(Flag(f"--{f}", parse=kind) for f, kind in (("lora-r", "int"), ("lora-alpha", "float"), ("adapter-size", "int"),
                                                 ("prompt-tokens", "int"))),
    Flag("--lora-targets", "lora: qv (default, Hu et al.) | qkv"),
    Flag("--adapter-norms", "adapter: train (default, Houlsby et al.) | frozen"),
    Flag("--pooler", "BERT's pooler under a PEFT method: auto (default: trains when not pretrained) | train | frozen"),
)
_DISTILL_FLAGS = (
    Flag("--teacher", "fine-tuned classifier folder (overrides the config's teacher)"),
    Flag("--depths", "student depths, comma-separated (overrides the config's)", parse="ints"),
    Flag("--inits", "teacher,random or one of them (overrides the config's)", parse="names"),
    Flag("--seeds", "comma-separated, e.g. 0,1,2 (overrides the config's)", parse="ints"),
    Flag("--name", "sweep folder name under <runs root>/distill/"),
    Flag("--output-dir", "sweep folder (default <runs root>/distill/<name>)"),
    Flag("--device", DEVICE_HELP),
    Flag("--threads", "torch CPU threads", argtype=int),
)

_TRAIN_FLAGS = (
    Flag("--family", "family name (shortcut without a config file)"),
    Flag("--preset", "model size preset", choices=("tiny", "small", "base")),
    Flag("--steps", argtype=int),
    Flag("--tokens", argtype=int),
    Flag("--seeds", argtype=int, nargs="+"),
    Flag("--name"),
    Flag("--output-dir"),
    Flag("--device"),
    Flag("--precision", "forward number format: auto = bf16 on CUDA and on CPUs with amx_bf16/avx512_bf16 "
                        "(config key `precision`)", choices=("auto", "fp32", "bf16")),  # workbench.precision.PRECISIONS
    Flag("--set", "override a config key", parse="set", metavar="KEY=VALUE"),
)

# name -> its registration; the subcommands `bertology finetune|distill|peft|prune` are built from
# the commands here (app/cli.py), so a new driver with a command needs no CLI code of its own.
DRIVERS: dict[str, Registration] = {
    "train": Registration("workbench.drivers.train",
                          "train a model family (bertology train CONFIG.yaml | --family F --preset P)",
                          DriverCommand("training config YAML (experiments/train/*.yaml)", _TRAIN_FLAGS, "seeds",
                                        config_optional=True, needs_without_config="--family",
                                        needs_message="give a CONFIG.yaml or --family")),
    "finetune": Registration("workbench.drivers.finetune", "fine-tune a checkpoint on a classification task over seeds",
                             DriverCommand("fine-tuning YAML (e.g. experiments/finetune_polarity.yaml); flags override it",
                                           _FINETUNE_FLAGS, "seeds", config_optional=True,
                                           needs_without_config="--checkpoint")),
    "distill": Registration("workbench.drivers.distill", "distil a fine-tuned classifier into smaller students (a sweep)",
                            DriverCommand("distillation YAML (e.g. experiments/distill/polarity_minilm_cpu.yaml)",
                                          _DISTILL_FLAGS, "grid points",
                                          variants=(("pretraining", "distill_pretraining", ("--teacher", "--name", "--device")),))),
    "distill_pretraining": Registration("workbench.drivers.distill_pretraining",
                                        "DistilBERT-style pretraining distillation (bertology distill, kind: pretraining)"),
    "peft": Registration("workbench.drivers.peft_sweep",
                         "fine-tune with every method (full, head, bitfit, adapter, prompt, lora); CKA per layer",
                         DriverCommand("sweep YAML (e.g. experiments/peft/minilm_polarity_cpu.yaml)", (
                             Flag("--checkpoint", "the starting checkpoint (overrides finetune.checkpoint)",
                                  key="finetune.checkpoint"),
                             Flag("--device", DEVICE_HELP, key="finetune.device"),
                             Flag("--methods", "comma-separated subset of the config's methods, e.g. full,lora",
                                  parse="names"),
                         ), "methods")),
    "prune": Registration("workbench.drivers.prune_sweep",
                          "compression sweep: lottery tickets, quantization, low rank (bertology prune CONFIG.yaml)",
                          DriverCommand("sweep YAML (e.g. experiments/prune/minilm_polarity_cpu.yaml)", (
                              Flag("--name", "sweep folder name under <runs root>/prune/"),
                              Flag("--output-dir", "sweep folder (default <runs root>/prune/<name>)"),
                              Flag("--checkpoint", "the pretrained checkpoint (replaces finetune.checkpoint)",
                                   key="finetune.checkpoint"),
                              Flag("--device", "auto | cpu | cuda | cuda:N (replaces finetune.device)",
                                   key="finetune.device"),
                              Flag("--seeds", "comma-separated seeds (replaces finetune.seeds)", key="finetune.seeds"),
                          ), "fine-tunings (full models, IMP rounds, retrained points)")),
    "shadows": Registration("workbench.drivers.shadows",
                            "train a LiRA shadow set: models on balanced random halves of a pool (docs/membership.md)",
                            DriverCommand("shadow-set YAML (e.g. experiments/shadows/membership_shadows_tiny.yaml)", (
                                Flag("--out", "set folder (default: the config's shadows.out or "
                                              "<runs root>/shadows/<config file name>)"),
                            ), "models")),
}


def parse_set(items: list[str] | None, flag: str = "--set") -> dict[str, Any]:
    """`--set KEY=VALUE` items as overrides by the one rule (`workbench.coerce.apply_overrides`): the
    key as written (dotted into sections), the value read as YAML; a null in it (`null`, `~`,
    nothing), also inside a mapping, sets its key to None (`workbench.coerce.explicit_nulls`), where
    a None override would change nothing. A malformed item is one ConfigError, before any work."""
    import yaml

    from workbench.coerce import explicit_nulls
    from workbench.errors import yaml_problem

    overrides: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            raise ConfigError(f"{flag} expects KEY=VALUE, got {item!r}")
        key, text = (x for x in item.split("=", 1))
        key = key.strip()
        try:
            overrides[key] = explicit_nulls(yaml.safe_load(text))
        except yaml.YAMLError as err:
            raise ConfigError(f"{flag} {key}={text}: not a YAML value ({yaml_problem(err)})") from None
    return overrides


def parse_flag(flag: Flag, text: Any) -> Any:
    """The override a flag's value gives (None when the flag was not given); a `set` flag's is a
    mapping of overrides (`parse_set`)."""
    if flag.parse == "set":
        return parse_set(text, flag.name)
    if text is None or flag.parse in ("text",) or flag.argtype is not None:
        return text
    if flag.parse == "switch":
        return True if text else None
    if flag.parse == "names":
        return [x.strip() for x in text.split(",")]
    if flag.parse == "int_list":  # each element its own message, as for one integer
        return [parse_flag(replace(flag, parse="int"), x) for x in text.split(",")]
    try:
        if flag.parse == "int":
            return int(text)
        if flag.parse == "float":
            return float(text)
        return [int(x) for x in text.split(",")]
    except ValueError:
        expected = {"int": "an integer", "float": "a number", "ints": "comma-separated integers"}[flag.parse]
        raise ConfigError(f"{flag.name}: expected {expected}, got {text!r}") from None


def split_section(overrides: Mapping[str, Any] | None, section: str) -> tuple[dict, dict]:
    """(the overrides of keys outside `section`, those inside it without the `section.` prefix): for
    drivers whose loader takes a section's overrides apart (the prune sweep's `finetune:`)."""
    outer, inner = {}, {}
    for key, value in (overrides or {}).items():
        if key.startswith(section + "."):
            inner[key[len(section) + 1:]] = value
        else:
            outer[key] = value
    return outer, inner


def get_driver(name: str) -> DriverSpec:
    """The DriverSpec registered as `name` (ConfigError naming the known ones otherwise)."""
    if name not in DRIVERS:
        raise ConfigError(f"unknown driver {name!r}; available: {', '.join(DRIVERS)}")
    return importlib.import_module(DRIVERS[name].module).DRIVER


def command(name: str) -> DriverCommand:
    """The subcommand of a registered driver (ConfigError when it has none)."""
    if name not in DRIVERS or DRIVERS[name].command is None:
        raise ConfigError(f"driver {name!r} has no command; commands: {', '.join(commands())}")
    return DRIVERS[name].command


def commands() -> list[str]:
    """The drivers with a subcommand of their own, in registry order."""
    return [name for name, reg in DRIVERS.items() if reg.command is not None]


# ------------------------------------------------------------------------------------- the command line

def add_command_arguments(parser, name: str) -> None:
    """A registered driver's arguments on an argparse parser: the config positional, its flags and
    the executor's (`bertology <name>`, and `python -m workbench.drivers.train` under torchrun)."""
    from workbench.drivers.executor import add_executor_arguments

    cmd = command(name)
    parser.add_argument("config", nargs="?" if cmd.config_optional else None, help=cmd.config_help)
    for flag in cmd.flags:
        if flag.parse == "switch":
            parser.add_argument(flag.name, action="store_true", help=flag.help)
        elif flag.parse == "set":
            parser.add_argument(flag.name, action="append", default=[], metavar=flag.metavar, help=flag.help)
        else:
            extra = {k: v for k, v in (("nargs", flag.nargs), ("choices", flag.choices), ("metavar", flag.metavar))
                     if v is not None}
            parser.add_argument(flag.name, type=flag.argtype, help=flag.help, **extra)
    add_executor_arguments(parser, cmd.units)


def run_command(name: str, args) -> str:
    """What `bertology <name> [CONFIG] [flags]` does with its parsed arguments, for every driver with
    a command: each flag an override of the config (a `--set` flag's items each their own), the
    driver's load (validation before any work), its run through the executor; returns its report."""
    from pathlib import Path

    from workbench.drivers.executor import options_from_args
    from workbench.io import read_yaml

    cmd = command(name)
    flags = {f.dest: f for f in cmd.flags}
    options = options_from_args(args)  # bad --jobs / --executor: one line, before any work
    needed = cmd.needs_without_config
    if args.config is None and needed and getattr(args, next(f.dest for f in cmd.flags if f.name == needed)) is None:
        raise ConfigError(cmd.needs_message or f"give {needed} PATH_OR_HUB_NAME (or a config YAML)")
    data = read_yaml(Path(args.config)) if cmd.variants and args.config is not None else None
    for kind, variant, allowed in cmd.variants:  # another driver runs this kind of file
        if isinstance(data, dict) and data.get("kind") == kind:
            given = [f.name for f in cmd.flags if f.name not in allowed and getattr(args, f.dest) not in (None, False)]
            if given:
                raise ConfigError(f"{', '.join(given)} do not apply to a config of kind {kind!r}; set them in the YAML")
            flags = {k: f for k, f in flags.items() if f.name in allowed}
            name = variant
            break
    overrides: dict[str, Any] = {}
    for dest, f in flags.items():
        value = parse_flag(f, getattr(args, dest))
        if f.parse == "set":
            overrides.update(value)
        else:
            overrides[f.override_key] = value
    spec = get_driver(name)
    cfg = spec.load(args.config if args.config is not None else {}, overrides)
    return spec.report(spec.run(cfg, executor=options))
