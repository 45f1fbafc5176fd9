"""`precision: auto | fp32 | bf16` (workbench/precision.py): the CPU-flag rule on fake flag sets,
the resolved choice in the training hash and in run.json / the manifest, old configs unchanged, the
CLI switches, and a real (tiny) training whose weights follow the resolved format."""

from __future__ import annotations

import json

import pytest
import torch

from workbench.config import load_train_config
from workbench.errors import ConfigError
from workbench.precision import native_bf16_flag, resolve_precision

AMX = {"fpu", "avx512f", "amx_tile", "amx_bf16", "avx512_bf16"}
ZEN4 = {"fpu", "avx2", "avx512f", "avx512_bf16"}
PLAIN = {"fpu", "avx2", "avx512f"}
BASE = {"family": "gpt", "steps": 5}


def test_native_bf16_flag_reads_the_flag_sets():
    assert native_bf16_flag(AMX) == "amx_bf16"
    assert native_bf16_flag(ZEN4) == "avx512_bf16"
    assert native_bf16_flag(PLAIN) is None
    assert native_bf16_flag(set()) is None


def test_resolve_precision_rule():
    assert resolve_precision("auto", "cpu", flags=AMX) == ("bf16", "auto: amx_bf16 present")
    assert resolve_precision("auto", "cpu", flags=ZEN4) == ("bf16", "auto: avx512_bf16 present")
    assert resolve_precision("auto", "cpu", flags=PLAIN)[0] == "fp32"
    # forced: the flags do not matter
    assert resolve_precision("fp32", "cpu", flags=AMX) == ("fp32", "precision: fp32")
    assert resolve_precision("bf16", "cpu", flags=PLAIN) == ("bf16", "precision: bf16")
    # CUDA keeps today's rule: the `bf16` key (default true)
    assert resolve_precision("auto", "cuda:1", cuda_bf16=True, flags=PLAIN)[0] == "bf16"
    assert resolve_precision("auto", "cuda", cuda_bf16=False, flags=AMX)[0] == "fp32"
    assert resolve_precision("fp32", "cuda")[0] == "fp32"
    # unset: the older keys, exactly as before the setting existed
    assert resolve_precision(None, "cpu", cpu_bf16=False, flags=AMX)[0] == "fp32"
    assert resolve_precision(None, "cpu", cpu_bf16=True, flags=PLAIN)[0] == "bf16"
    assert resolve_precision(None, "cuda", cuda_bf16=True)[0] == "bf16"
    with pytest.raises(ValueError, match="precision"):
        resolve_precision("fp16", "cpu")


def test_one_resolve_device_maps_cuda_to_the_rank_under_torchrun(monkeypatch):
    """The training loop's device is `resolve_device` with the torchrun rank (`Dist.device`): a bare
    "cuda" or "auto" on CUDA becomes `cuda:<local_rank>` when world > 1, an indexed one stays, a
    single process keeps "cuda"; the CPU never moves (issue 51: one `resolve_device`)."""
    from workbench.drivers.train import Dist
    from workbench.precision import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ddp, single = Dist(rank=3, world=4, local_rank=1), Dist()
    assert ddp.device("cuda") == torch.device("cuda", 1)
    assert ddp.device("auto") == torch.device("cuda", 1)
    assert ddp.device("cuda:0") == torch.device("cuda", 0)
    assert ddp.device("cpu") == torch.device("cpu")
    assert single.device("cuda") == torch.device("cuda") and single.device("auto") == torch.device("cuda")
    assert resolve_device("cuda", local_rank=2) == torch.device("cuda", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ddp.device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="no CUDA"):
        ddp.device("cuda")


def test_resolved_precision_changes_the_training_hash(monkeypatch):
    """Same config, auto resolved to bf16 (AMX flags) vs fp32 (no native bf16): different hashes; the
    bf16 one equals the older `cpu_bf16: true` config's and `precision: bf16`'s (same weights), the
    fp32 one equals a config without the key (so no run trained before the key changes hash)."""
    import workbench.precision as precision

    cfg = load_train_config({**BASE, "precision": "auto"})
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(AMX))
    on_amx = cfg.training_hash("cpu")
    assert cfg.resolved_precision("cpu") == ("bf16", "auto: amx_bf16 present")
    monkeypatch.setattr(precision, "cpu_flags", lambda: frozenset(PLAIN))
    plain = cfg.training_hash("cpu")
    assert cfg.resolved_precision("cpu")[0] == "fp32"
    assert on_amx != plain
    assert plain == load_train_config(BASE).training_hash("cpu") == load_train_config({**BASE, "precision": "fp32"}).training_hash("cpu")
    assert on_amx == load_train_config({**BASE, "cpu_bf16": True}).training_hash("cpu")
    assert on_amx == load_train_config({**BASE, "precision": "bf16"}).training_hash("cpu")
    # on CUDA `auto` keeps bf16 (the `bf16` key), forcing fp32 there changes the hash
    assert load_train_config({**BASE, "precision": "auto"}).training_hash("cuda") == load_train_config(BASE).training_hash("cuda")
    assert load_train_config({**BASE, "precision": "fp32"}).training_hash("cuda") != load_train_config(BASE).training_hash("cuda")


def test_old_configs_hash_as_before():
    """The shipped main-job configs keep their hashes when they train as before the keys (runs on disk
    stay resumable); the pcg16 dropout masks (the default since) give another hash."""
    old = {"dropout_masks": "bernoulli"}
    assert load_train_config("experiments/train/deberta_small.yaml", old).training_hash("cpu") == "2c2bea118852b470"
    assert load_train_config("experiments/train/deberta_small.yaml").training_hash("cpu") == "f9d647f588ab03bb"
    old_bf16 = load_train_config("experiments/train/deberta_small_bf16.yaml")
    assert old_bf16.resolved_precision("cpu") == ("bf16", "precision unset: cpu_bf16: true")
    assert old_bf16.training_hash("cpu") == load_train_config("experiments/train/deberta_small.yaml",
                                                        {"precision": "bf16"}).training_hash("cpu")


@pytest.mark.parametrize("value, message", [("fp16", "precision: must be one of auto, fp32, bf16, got 'fp16'"),
                                            (True, "precision: expected a string, got True")])
def test_bad_precision_is_a_config_error_naming_the_key(value, message):
    with pytest.raises(ConfigError, match=message):
        load_train_config({**BASE, "precision": value})


def test_fp32_with_cpu_bf16_is_refused():
    with pytest.raises(ConfigError, match="precision: fp32 contradicts cpu_bf16"):
        load_train_config({**BASE, "precision": "fp32", "cpu_bf16": True})


def test_cli_switches_reach_the_config(monkeypatch):
    """`bertology train --precision` overrides the file (even its `cpu_bf16: true`), and `bertology run
    --precision` trains the experiment's model under it in a run folder named after it."""
    import app.experiments as experiments
    import workbench.drivers.train as train_mod
    from app.cli import build_parser

    seen = []
    monkeypatch.setattr(train_mod, "train_from_config", lambda source, overrides, **kw: seen.append(load_train_config(source, overrides)) or [])
    train_mod.train_cli_main(["experiments/train/deberta_small_bf16.yaml", "--precision", "fp32"])
    assert seen[-1].resolved_precision("cpu") == ("fp32", "precision: fp32")
    with pytest.raises(SystemExit):
        train_mod.train_cli_main(["experiments/train/deberta_small.yaml", "--precision", "fp16"])

    args = build_parser().parse_args(["run", "experiments/main.yaml", "--precision", "bf16"])
    assert args.precision == "bf16"
    spec = experiments.load_experiment("experiments/main.yaml")
    spec["_precision"] = "bf16"
    experiments._checkpoints_from_training(spec, False, "last")
    assert seen[-1].name == "deberta_small_bf16" and seen[-1].resolved_precision("cpu")[0] == "bf16"
    with pytest.raises(ConfigError, match="--precision must be one of"):
        experiments.run_experiment("experiments/main.yaml", precision="fp16")


@pytest.mark.slow
def test_auto_on_a_bf16_cpu_trains_in_bf16_and_records_why(tmp_path, monkeypatch):
    """A tiny GPT with `precision: auto`, the CPU flags faked to AMX and to none: the first run's
    weights equal a `precision: bf16` run's and differ from the second's, which equal plain fp32's;
    run.json and the manifest say which and why, and the two run.json hashes differ."""
    import workbench.precision as precision
    from tests.training_helpers import run_tiny_training
    from workbench.store.identity import weights_hash

    monkeypatch.setenv("BERTOLOGY_CACHE", str(tmp_path / "cache"))
    torch.set_num_threads(1)
    runs = {}
    for name, flags, setting in [("auto_amx", AMX, "auto"), ("auto_plain", PLAIN, "auto"),
                                 ("bf16", PLAIN, "bf16"), ("fp32", AMX, None)]:
        monkeypatch.setattr(precision, "cpu_flags", lambda flags=flags: frozenset(flags))
        extra = {"precision": setting} if setting else {}
        runs[name] = run_tiny_training("gpt", 3, tmp_path / name, device="cpu", **extra)
    manifest = json.loads((runs["auto_amx"].checkpoint / "manifest.json").read_text())
    assert manifest["precision"] == {"resolved": "bf16", "why": "auto: amx_bf16 present"}
    manifest = json.loads((runs["auto_plain"].checkpoint / "manifest.json").read_text())
    assert manifest["precision"]["resolved"] == "fp32"
    run_json = {k: json.loads((r.run_folder / "run.json").read_text()) for k, r in runs.items()}
    assert run_json["auto_amx"]["precision"]["why"] == "auto: amx_bf16 present"
    assert run_json["auto_amx"]["training_hash"] != run_json["auto_plain"]["training_hash"]
    assert run_json["auto_plain"]["training_hash"] == run_json["fp32"]["training_hash"]
    w = {k: weights_hash(r.checkpoint) for k, r in runs.items()}
    assert w["auto_amx"] == w["bf16"] != w["auto_plain"] == w["fp32"]
