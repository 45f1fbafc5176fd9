"""`bertology finetune|distill|peft|prune` are built from the driver registry
(`workbench.drivers.spec.DRIVERS`, app/cli.py `_add_driver_commands`): same names, flags, helps and
types as the hand-written parsers they replaced (tests/fixtures/driver_cli_flags.json, dumped from
the old parser at commit 688f2cb), and each flag reaches the driver's load as the override of the
config key it names."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
from pathlib import Path

import pytest

from app.cli import build_parser, main
from workbench.drivers import spec
from workbench.errors import ConfigError

FIXTURE = Path(__file__).parent / "fixtures" / "driver_cli_flags.json"


def _subparsers():
    parser = build_parser()
    return [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)][0]


def _describe(sub, name):
    sp = sub.choices[name]
    return {"help": next(c.help for c in sub._choices_actions if c.dest == name),
            "actions": [{"options": a.option_strings, "dest": a.dest, "help": a.help, "nargs": a.nargs,
                         "default": None if a.default is argparse.SUPPRESS else a.default,
                         "type": getattr(a.type, "__name__", a.type), "choices": a.choices,
                         "kind": type(a).__name__} for a in sp._actions]}


# Help texts of the old parsers that named example files the repository does not hold (corrected
# 2026-11-29; the flags, defaults and types are the old ones exactly).
CORRECTED_HELP = {
    "distillation YAML (e.g. experiments/distill/polarity_minilm.yaml)":
        "distillation YAML (e.g. experiments/distill/polarity_minilm_cpu.yaml)",
    "sweep YAML (e.g. experiments/prune/minilm_polarity_small.yaml)":
        "sweep YAML (e.g. experiments/prune/minilm_polarity_cpu.yaml)",
}


# Flags every driver gained on purpose after the old parsers (the executor's, issue 51).
ADDED_SINCE = {"--slurm-param"}
# Drivers that came onto the contract after the fixture (issue 51): `bertology train` had its own
# parser (its flags are checked below against that parser's), `shadows` was `python -m` only.
COMMANDS_SINCE = ("train", "shadows")


def test_driver_subcommands_keep_the_old_parsers_flags_exactly():
    before = json.loads(FIXTURE.read_text())
    sub = _subparsers()
    assert [c for c in spec.commands() if c not in COMMANDS_SINCE] == list(before)
    for name, old in before.items():
        for action in old["actions"]:
            action["help"] = CORRECTED_HELP.get(action["help"], action["help"])
        now = json.loads(json.dumps(_describe(sub, name)))
        added = [a for a in now["actions"] if set(a["options"]) & ADDED_SINCE]
        assert sorted(o for a in added for o in a["options"]) == sorted(ADDED_SINCE), name
        now["actions"] = [a for a in now["actions"] if a not in added]
        assert now == old, name


def test_every_example_file_a_driver_help_names_exists():
    import re

    root = Path(__file__).resolve().parents[1]
    sub = _subparsers()
    named = [m for name in spec.commands() for a in sub.choices[name]._actions
             for m in re.findall(r"experiments/[\w/.-]+\.yaml", a.help or "")]
    assert len(named) >= 4 and all((root / m).is_file() for m in named), named


@pytest.mark.parametrize("flag,text,expected", [
    (spec.Flag("--epochs", parse="int"), "3", 3),
    (spec.Flag("--lr", parse="float"), "1e-3", 1e-3),
    (spec.Flag("--seeds", parse="int_list"), "0,1,2", [0, 1, 2]),
    (spec.Flag("--depths", parse="ints"), "2,4", [2, 4]),
    (spec.Flag("--methods", parse="names"), "full, lora", ["full", "lora"]),
    (spec.Flag("--keep", parse="switch"), False, None),
    (spec.Flag("--keep", parse="switch"), True, True),
    (spec.Flag("--seeds"), "0,1", "0,1"),
    (spec.Flag("--epochs", parse="int"), None, None),
])
def test_parse_flag_values(flag, text, expected):
    assert spec.parse_flag(flag, text) == expected


@pytest.mark.parametrize("flag,text,message", [
    (spec.Flag("--epochs", parse="int"), "three", "--epochs: expected an integer, got 'three'"),
    (spec.Flag("--lr", parse="float"), "fast", "--lr: expected a number, got 'fast'"),
    (spec.Flag("--seeds", parse="int_list"), "0,x", "--seeds: expected an integer, got 'x'"),
    (spec.Flag("--depths", parse="ints"), "2,four", "--depths: expected comma-separated integers, got '2,four'"),
])
def test_parse_flag_errors_name_the_flag(flag, text, message):
    with pytest.raises(ConfigError) as err:
        spec.parse_flag(flag, text)
    assert str(err.value) == message


def test_split_section_takes_a_sections_keys_apart():
    outer, inner = spec.split_section({"name": "a", "finetune.seeds": "0,1", "finetune.device": None}, "finetune")
    assert outer == {"name": "a"} and inner == {"seeds": "0,1", "device": None}


def _capture_load(monkeypatch, driver):
    """Replace a driver's load with one that records (source, overrides) and stops before any work."""
    seen = {}

    class Stop(Exception):
        pass

    module = importlib.import_module(spec.DRIVERS[driver].module)

    def load(source, overrides):
        seen.update(source=source, overrides=overrides)
        raise Stop

    monkeypatch.setattr(module, "DRIVER", dataclasses.replace(module.DRIVER, load=load))
    return seen, Stop


def test_flags_become_overrides_of_their_config_keys(monkeypatch, tmp_path):
    seen, stop = _capture_load(monkeypatch, "prune")
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text("methods: [imp]\n")
    with pytest.raises(stop):
        main(["prune", str(cfg), "--checkpoint", "ck", "--seeds", "0,1", "--name", "n"])
    assert seen["source"] == str(cfg)
    assert seen["overrides"] == {"name": "n", "output_dir": None, "finetune.checkpoint": "ck",
                                 "finetune.device": None, "finetune.seeds": "0,1"}

    seen, stop = _capture_load(monkeypatch, "finetune")
    with pytest.raises(stop):
        main(["finetune", "--checkpoint", "ck", "--epochs", "2", "--seeds", "0,3", "--keep-epoch-checkpoints"])
    assert seen["source"] == {}
    o = seen["overrides"]
    assert (o["checkpoint"], o["epochs"], o["seeds"], o["keep_epoch_checkpoints"], o["lr"]) == ("ck", 2, [0, 3], True, None)


def test_finetune_without_config_or_checkpoint_is_one_line(capsys):
    assert main(["finetune", "--task", "upos"]) == 2
    assert "give --checkpoint PATH_OR_HUB_NAME (or a config YAML)" in capsys.readouterr().err


def test_a_pretraining_distill_config_routes_to_its_driver_and_refuses_task_flags(monkeypatch, tmp_path, capsys):
    cfg = tmp_path / "d.yaml"
    cfg.write_text("kind: pretraining\nteacher: t\n")
    assert main(["distill", str(cfg), "--depths", "2", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert "--depths, --seeds do not apply to a config of kind 'pretraining'" in err
    seen, stop = _capture_load(monkeypatch, "distill_pretraining")
    with pytest.raises(stop):
        main(["distill", str(cfg), "--teacher", "t2"])
    assert seen["overrides"] == {"teacher": "t2", "name": None, "device": None}


def test_every_registered_driver_reports_and_loads_by_the_contract():
    for name in spec.DRIVERS:
        driver = spec.get_driver(name)
        assert driver.name == name and callable(driver.load) and callable(driver.run) and callable(driver.report)


def test_a_flag_with_an_unknown_parse_is_refused_where_it_is_declared():
    with pytest.raises(ValueError, match="parse must be one of"):
        spec.Flag("--seeds", parse="intt")


# `bertology train`'s own parser before it came onto the contract (issue 51): option, nargs, type, choices.
TRAIN_BEFORE = {"--family": (None, None, None), "--preset": (None, None, ("tiny", "small", "base")),
                "--steps": (None, "int", None), "--tokens": (None, "int", None), "--seeds": ("+", "int", None),
                "--name": (None, None, None), "--output-dir": (None, None, None), "--device": (None, None, None),
                "--precision": (None, None, ("auto", "fp32", "bf16")), "--set": (None, None, None),
                "--jobs": (None, "int", None), "--executor": (None, None, ("local", "submitit-local", "slurm")),
                "--slurm-partition": (None, None, None), "--timeout-min": (None, "int", None),
                "--slurm-param": (None, None, None)}


def test_train_command_keeps_its_flags_on_the_contract():
    from workbench.precision import PRECISIONS

    now = {a["options"][0]: (a["nargs"], a["type"], tuple(a["choices"]) if a["choices"] else None)
           for a in _describe(_subparsers(), "train")["actions"] if a["options"] and a["options"][0] not in ("-h", "--quiet")}
    assert now == TRAIN_BEFORE
    assert TRAIN_BEFORE["--precision"][2] == tuple(PRECISIONS)


@pytest.mark.parametrize("argv,message", [
    (["train"], "give a CONFIG.yaml or --family"),
    (["train", "--family", "gpt", "--set", "lr"], "--set expects KEY=VALUE, got 'lr'"),
    (["train", "--family", "gpt", "--set", "lr=[1"], "--set lr=[1: not a YAML value"),
    (["train", "--family", "gpt", "--set", "corpus.bogus=1"], "unknown key(s) ['corpus.bogus']"),
    (["shadows", "nope.yaml"], "nope.yaml"),
])
def test_train_and_shadows_bad_values_are_one_line_and_exit_2(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "runs").exists()
