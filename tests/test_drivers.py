"""The driver contract (workbench/drivers/spec.py) and its executor units.

- Identity: every driver's run hash / sweep key is now computed generically from field metadata;
  for every example config under experiments/ (and every fine-tuning method) it equals what the
  hand-kept "not part of the identity" lists gave before (their formulas are copied below as they
  were; the hashes of every fine-tuning method are also pinned in tests/fixtures/driver_identities.json,
  computed by the code before the change), so existing run folders resume and existing keys hold.
- One override rule for every loader: None changes nothing, `section.key` sets a key of a mapping.
- The registry names every driver; `bertology prune|peft|finetune|distill` take --executor/--jobs.
- A prune sweep and a PEFT sweep run as submitit jobs (`--executor submitit-local --jobs 4`)
  write the same rows, value for value, as the same sweep in this process (one torch thread in
  both: float sums over one thread are what the workers compute).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from workbench.coerce import build_dataclass, settings_hash
from tests.slurm_cluster import SUBMITIT_EXECUTORS, executor_flags
from workbench.drivers.spec import DRIVERS, get_driver, identity, identity_fields, identity_hash
from workbench.coerce import apply_overrides
from workbench.errors import ConfigError
from workbench.io import read_yaml

ROOT = Path(__file__).resolve().parents[1]
PINS = json.loads((Path(__file__).parent / "fixtures" / "driver_identities.json").read_text())


def _configs(folder: str, pattern: str, cls):
    """The example configs of a driver (files of another kind in the folder are skipped)."""
    out = {}
    for path in sorted((ROOT / folder).glob(pattern)):
        try:
            out[path] = build_dataclass(cls, read_yaml(path), str(path))
        except ConfigError:
            continue
    assert out, f"no {cls.__name__} example under {folder}"
    return out


# --------------------------------------------------------------------- the old formulas, verbatim
def _old_training_hash(cfg) -> str:
    from workbench.drivers.finetune import METHOD_OPTIONS, method_record

    d = cfg.to_dict()
    for k in ("seeds", "name", "output_dir", "progress", "threads", "baselines", "save_every", "device"):
        d.pop(k)
    read = method_record(cfg)
    for k in ("method",) + METHOD_OPTIONS:
        if k not in read or cfg.method == "full":
            d.pop(k)
    return settings_hash(d)


def _old_distill_key(cfg) -> str:
    d = cfg.to_dict()
    for k in ("name", "output_dir", "progress", "threads", "device"):
        d.pop(k)
    return settings_hash(d)


def _old_prune_key(cfg, ft) -> dict:
    key = {k: v for k, v in cfg.to_dict().items() if k not in ("progress", "output_dir", "keep_checkpoints")}
    if not key["mlm"]:
        del key["mlm"]
    key["finetune"] = {"training_hash": ft.training_hash(), "checkpoint": ft.checkpoint, "seeds": ft.seeds}
    return json.loads(json.dumps(key))


def test_finetune_hashes_of_the_examples_and_of_every_method_are_unchanged():
    from workbench.drivers.finetune import FinetuneConfig, load_finetune_config

    for path, cfg in _configs("experiments", "finetune_*.yaml", FinetuneConfig).items():
        assert cfg.training_hash() == _old_training_hash(cfg), path
    for text, pinned in PINS["finetune_methods"].items():  # every method, with and without its options set
        cfg = load_finetune_config(json.loads(text))
        assert cfg.training_hash() == _old_training_hash(cfg) == pinned, text
        assert get_driver("finetune").run_identity(cfg) == pinned


def test_distill_keys_of_the_examples_are_unchanged():
    from workbench.drivers.distill import DistillConfig

    for path, cfg in _configs("experiments/distill", "polarity*.yaml", DistillConfig).items():
        assert cfg.key() == _old_distill_key(cfg), path
        for changed in ({"device": "cpu", "threads": 3, "name": "x", "output_dir": "y", "progress": False},
                        {"epochs": cfg.epochs + 1}):  # what must not, and what must, change the key
            other = build_dataclass(DistillConfig, {**cfg.to_dict(), **changed}, "test")
            assert (other.key() == cfg.key()) == ("epochs" not in changed)
            assert other.key() == _old_distill_key(other)


def test_prune_keys_of_the_examples_are_unchanged():
    from workbench.drivers.prune_sweep import PruneConfig
    from workbench.drivers.finetune import load_finetune_config

    for path, cfg in _configs("experiments/prune", "*.yaml", PruneConfig).items():
        ft = load_finetune_config({"progress": cfg.progress, **cfg.finetune})
        assert cfg.key(ft) == _old_prune_key(cfg, ft), path
        assert get_driver("prune").run_identity((cfg, ft)) == cfg.key(ft)
        with_mlm = build_dataclass(PruneConfig, {**cfg.to_dict(), "mlm": {"steps": 5}}, "test")
        assert with_mlm.key(ft)["mlm"] == {"steps": 5} and with_mlm.key(ft) == _old_prune_key(with_mlm, ft)


def test_peft_method_runs_keep_their_hashes():
    from workbench.drivers.peft_sweep import PeftSweepConfig, method_config

    for path, cfg in _configs("experiments/peft", "*.yaml", PeftSweepConfig).items():
        for m in cfg.methods:
            assert method_config(cfg, m).training_hash() == _old_training_hash(method_config(cfg, m)), (path, m)
        assert "name" not in identity_fields(cfg)


def test_identity_reads_the_field_metadata():
    """The generic rule itself: NOT_IDENTITY fields drop out, a predicate decides per config, a
    derived value replaces a field's."""
    from dataclasses import dataclass, field

    from workbench.drivers.spec import IDENTITY, NOT_IDENTITY

    @dataclass
    class Toy:
        lr: float = 0.1
        device: str = field(default="cpu", metadata=NOT_IDENTITY)
        extra: dict = field(default_factory=dict, metadata={IDENTITY: lambda c: bool(c.extra)})

    assert identity(Toy()) == {"lr": 0.1}
    assert identity(Toy(extra={"a": 1}), lr=7) == {"lr": 7, "extra": {"a": 1}}
    assert identity_hash(Toy(device="cuda")) == identity_hash(Toy()) != identity_hash(Toy(lr=0.2))


def test_one_override_rule():
    data = {"a": 1, "finetune": {"checkpoint": "x", "lr": 0.1}}
    out = apply_overrides(data, {"a": None, "b": 2, "finetune.checkpoint": "y", "finetune.seeds": None})
    assert out == {"a": 1, "b": 2, "finetune": {"checkpoint": "y", "lr": 0.1}}
    assert data["finetune"]["checkpoint"] == "x"  # the source is not changed
    with pytest.raises(ConfigError, match="f.yaml: a: expected a mapping"):
        apply_overrides(data, {"a.b": 1}, "f.yaml")


def test_loaders_apply_the_rule_and_name_the_file(tmp_path):
    from workbench.drivers.peft_sweep import load_sweep_config
    from workbench.drivers.finetune import load_finetune_config

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"finetune": {"checkpoint": "a", "lr": 0.01}, "methods": ["head", "lora"]}))
    cfg = load_sweep_config(path, {"checkpoint": "b", "device": None}, methods=["lora"])
    assert cfg.finetune == {"checkpoint": "b", "lr": 0.01} and cfg.methods == ["lora"]
    path.write_text(yaml.safe_dump({"checkpoint": "a", "epoch": 2}))
    with pytest.raises(ConfigError, match=rf"{path}: unknown key\(s\) \['epoch'\] \(did you mean 'epochs'\?\)"):
        load_finetune_config(path)


def test_the_registry_names_every_driver_and_its_config():
    from workbench.drivers.peft_sweep import PeftSweepConfig
    from workbench.drivers.prune_sweep import PruneConfig
    from workbench.drivers.distill import DistillConfig
    from workbench.drivers.distill_pretraining import PretrainDistillConfig
    from workbench.drivers.finetune import FinetuneConfig
    from workbench.config import TrainConfig
    from workbench.drivers.shadows import ShadowsConfig

    want = {"train": TrainConfig, "finetune": FinetuneConfig, "distill": DistillConfig,
            "distill_pretraining": PretrainDistillConfig, "peft": PeftSweepConfig, "prune": PruneConfig,
            "shadows": ShadowsConfig}
    assert {name: get_driver(name).config for name in DRIVERS} == want
    with pytest.raises(ConfigError, match="unknown driver 'nope'"):
        get_driver("nope")


@pytest.mark.parametrize("command", ["train", "finetune", "distill", "peft", "prune", "shadows", "run"])
def test_every_driver_command_takes_the_executor_flags(command, capsys):
    from app.cli import main

    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("--executor", "--jobs", "--slurm-partition", "--timeout-min"))


@pytest.mark.parametrize("command", [["prune", "x.yaml"], ["peft", "x.yaml"], ["finetune", "--checkpoint", "x"]])
def test_bad_jobs_is_one_line_and_exit_2_before_any_work(command, capsys, tmp_path, monkeypatch):
    from app.cli import main

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    assert main([*command, "--jobs", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--jobs must be >= 1, got 0" in err
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------ parallel = in-process
@pytest.fixture
def one_thread():
    """Both runs with one torch thread (the workers' count); the test process's count restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def same_rows(a: pd.DataFrame, b: pd.DataFrame, drop_extra: tuple[str, ...]) -> None:
    """Row for row equal values; `extra` compared without the keys that name a folder or a run."""
    def norm(df):
        df = df.drop(columns=["run_id"], errors="ignore").reset_index(drop=True)
        return df.assign(extra=df["extra"].map(lambda e: json.dumps(
            {k: v for k, v in (e if isinstance(e, dict) else json.loads(e)).items() if k not in drop_extra},
            sort_keys=True)))

    pd.testing.assert_frame_equal(norm(a), norm(b), check_exact=True)


@pytest.mark.slow
@pytest.mark.parametrize("executor", SUBMITIT_EXECUTORS)
def test_a_prune_sweep_as_submitit_jobs_writes_the_rows_of_the_in_process_sweep(executor, request, tiny_checkpoint,
                                                                                 tmp_path, monkeypatch, one_thread):
    """IMP (one round), one-shot, reinit (IMP's mask) and 8-bit quantization: the three stages of
    units (the full model; IMP and one-shot; reinit) as submitit jobs, up to four in flight (the
    seeds' own parallel path: the fine-tuning test below), on this machine or on a real Slurm cluster."""
    from app.cli import main
    from workbench.drivers.prune_sweep import load_prune_config, run_prune
    from workbench.store.results import ResultsStore

    config = {"finetune": {"checkpoint": str(tiny_checkpoint), "task": "sentence_polarity", "seeds": [1],
                           "epochs": 1, "lr": 1e-3, "max_train_examples": 48, "max_eval_examples": 32,
                           "batch_size": 16, "baselines": False, "device": "cpu", "threads": 1},
              "methods": ["imp", "oneshot", "reinit", "quantize"], "sparsities": [0.1], "bits": [8],
              "name": "tiny", "progress": False}
    cfg, ft = load_prune_config({**config, "output_dir": str(tmp_path / "seq")})
    seq = run_prune(cfg, ft, store=ResultsStore(tmp_path / "store-seq"))
    path = tmp_path / "prune.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    assert main(["prune", str(path), "--output-dir", str(tmp_path / "par"), *executor_flags(executor, request),
                 "--jobs", "4"]) == 0
    assert len(list((tmp_path / "par" / "submitit").glob("*_result.pkl"))) == 1 + 2 + 1  # every training ran there
    store = ResultsStore(tmp_path / "runs")
    par = store.read(store.runs(name="tiny")["run_id"].iloc[-1])
    assert len(par) == len(seq.rows) > 0
    assert set(par["model"]) == {"full", "imp", "oneshot", "reinit", "quantize"}
    same_rows(par, ResultsStore(tmp_path / "store-seq").read(seq.run_id), drop_extra=("checkpoint",))


@pytest.mark.slow
@pytest.mark.parametrize("executor", SUBMITIT_EXECUTORS)
def test_a_peft_sweep_as_submitit_jobs_writes_the_rows_of_the_in_process_sweep(executor, request, tiny_checkpoint,
                                                                                tmp_path, monkeypatch, one_thread):
    """Head-only and LoRA, one seed, CKA on 20 sentences: each method a submitit job (here or on Slurm)."""
    from app.cli import main
    from workbench.drivers.peft_sweep import load_sweep_config, run_sweep
    from workbench.store.results import ResultsStore

    config = {"finetune": {"checkpoint": str(tiny_checkpoint), "seeds": [0], "epochs": 1, "max_train_examples": 48,
                           "max_eval_examples": 32, "batch_size": 16, "baselines": False, "progress": False,
                           "device": "cpu", "threads": 1, "name": "tiny"},
              "methods": ["head", "lora"], "cka_sentences": 20, "lr": {"head": 1e-2, "lora": 1e-2}, "name": "tiny-peft"}
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs-seq"))  # the fine-tuning folders of each sweep
    seq_id, _ = run_sweep(load_sweep_config(config), store=ResultsStore(tmp_path / "runs-seq"), progress=False)
    path = tmp_path / "peft.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs-par"))
    assert main(["peft", str(path), *executor_flags(executor, request), "--jobs", "4"]) == 0
    par_store = ResultsStore(tmp_path / "runs-par")
    assert len(list((par_store.root / "submitit" / "tiny-peft").glob("*_result.pkl"))) == 2
    par = par_store.read(par_store.runs(name="tiny-peft")["run_id"].iloc[-1])
    seq = ResultsStore(tmp_path / "runs-seq").read(seq_id)
    assert set(par["metric"]) == {"accuracy", "trainable_parameters", "cka_to_start"} and len(par) == len(seq)
    same_rows(par, seq, drop_extra=("checkpoint", "finetune_run"))


def tiny_finetune_sweep(checkpoint, tmp_path, seeds: list[int], name: str):
    """A fine-tuning config of tiny sizes written to `tmp_path/ft.yaml`, and its in-process run (one
    thread, its own store under `tmp_path/store-seq`): the rows a parallel run must equal."""
    from workbench.drivers.finetune import load_finetune_config, run_finetune
    from workbench.store.results import ResultsStore

    config = {"checkpoint": str(checkpoint), "task": "sentence_polarity", "seeds": seeds, "epochs": 2,
              "lr": 1e-3, "max_train_examples": 48, "max_eval_examples": 32, "batch_size": 16, "baselines": False,
              "device": "cpu", "threads": 1, "progress": False, "name": name}
    seq = run_finetune(load_finetune_config({**config, "output_dir": str(tmp_path / "seq")}),
                       store=ResultsStore(tmp_path / "store-seq"))
    path = tmp_path / "ft.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, seq


@pytest.mark.slow
@pytest.mark.parametrize("executor", [pytest.param("local"), pytest.param("slurm", marks=pytest.mark.slurm)])
def test_finetune_seeds_in_two_local_processes_write_the_rows_of_the_in_process_run(executor, request,
                                                                                    tiny_checkpoint, tmp_path,
                                                                                    monkeypatch, one_thread):
    """`bertology finetune --jobs 2`: the two seeds in two spawned processes (the executor's local
    path, beside the submitit one above) or two Slurm jobs give the per-seed and per-epoch rows of the
    in-process run, value for value (the parent's own `train_seed` is replaced by one that fails)."""
    from app.cli import main
    from workbench.store.results import ResultsStore

    path, seq = tiny_finetune_sweep(tiny_checkpoint, tmp_path, [0, 1], "tiny-ft")
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))

    def not_here(*a, **k):
        raise AssertionError("a seed was trained in this process, not in a worker")

    monkeypatch.setattr("workbench.drivers.finetune.train_seed", not_here)  # the spawned workers import their own
    assert main(["finetune", str(path), "--output-dir", str(tmp_path / "par"), *executor_flags(executor, request),
                 "--jobs", "2"]) == 0
    store = ResultsStore(tmp_path / "runs")
    par = store.read(store.runs(name="tiny-ft")["run_id"].iloc[-1])
    assert sorted(set(par["seed"].dropna())) == [0, 1]
    for seed in (0, 1):
        assert (tmp_path / "par" / f"seed-{seed}" / "result.json").is_file()
    same_rows(par, ResultsStore(tmp_path / "store-seq").read(seq.run_id), drop_extra=("checkpoint",))


@pytest.mark.slow
@pytest.mark.parametrize("executor", [pytest.param("local"), pytest.param("slurm", marks=pytest.mark.slurm)])
def test_train_seeds_as_units_give_the_weights_of_the_in_process_run(executor, request, tmp_path, one_thread):
    """`bertology train CONFIG --seeds 0 1 --jobs 2` (two local processes) or `--executor slurm` (two
    Slurm jobs): each seed's final checkpoint has the weights, bit for bit, and the log of the same
    seed trained in this process (one torch thread in both); a rerun finds them finished."""
    from app.cli import main
    from tests.training_helpers import tiny_config
    from tests.weight_pins import log_hash, state_hash
    from workbench.drivers.train import read_log, train_from_config
    from workbench.running.model_loading import load_tensors

    seq = train_from_config(tiny_config("bert", 6, tmp_path / "seq", seeds=[0, 1]))
    config = tiny_config("bert", 6, tmp_path / "par", seeds=[0, 1]).to_dict()
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(config))
    flags = executor_flags(executor, request) if executor == "slurm" else []
    assert main(["train", str(path), "--jobs", "2", *flags]) == 0
    for seed, final in zip((0, 1), seq):
        par = tmp_path / "par" / f"seed-{seed}" / final.name
        assert state_hash(load_tensors(par / "model.safetensors")) == state_hash(load_tensors(final / "model.safetensors"))
        assert log_hash(read_log(par.parent)) == log_hash(read_log(final.parent))
    if executor == "slurm":
        assert len(list((tmp_path / "par" / "submitit").glob("*_result.pkl"))) == 2
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "par").glob("seed-*/step-*/model.safetensors")}
    assert main(["train", str(path), "--jobs", "2", *flags]) == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # finished seeds are found, not retrained


def test_train_refuses_an_executor_with_hooks(tmp_path):
    """Hooks are functions of this process: seeds in other processes would train without them."""
    from tests.training_helpers import tiny_config
    from workbench.drivers.executor import ExecutorOptions
    from workbench.drivers.train import train_from_config
    from workbench.loop import TrainingHooks

    cfg = tiny_config("bert", 2, tmp_path / "x", seeds=[0, 1])
    hooks = TrainingHooks(after_step=lambda model, step: None)
    with pytest.raises(ConfigError, match="training hooks run in this process only"):
        train_from_config(cfg, hooks=hooks, executor=ExecutorOptions(jobs=2))
    assert not (tmp_path / "x").exists()


TINY_SHADOWS = {"n_models": 2, "seed": 0, "shared_tokenizer": True,
                "pool": {"sources": ["sentence_polarity"], "max_documents": 24, "seed": 0},
                "train": {"name": "mia-units", "family": "gpt", "preset": "tiny", "tokenizer": {"vocab_size": 300},
                          "max_len": 32, "batch_size": 4, "lr": 2e-2, "steps": 4, "eval": {"batches": 0},
                          "checkpoints": {"log_spaced": False}, "progress": False}}


@pytest.mark.slow
@pytest.mark.parametrize("executor", [pytest.param("local"), pytest.param("slurm", marks=pytest.mark.slurm)])
def test_shadow_models_as_units_give_the_set_trained_in_this_process(executor, request, tmp_path, monkeypatch,
                                                                    one_thread):
    """`bertology shadows CONFIG --jobs 2` (two local processes) or `--executor slurm` (two Slurm jobs):
    each model's weights, bit for bit, and the set's shadows.json equal the set trained in this process
    (`train_shadow_set`, one torch thread in both); a rerun finds the models finished."""
    from app.cli import main
    from tests.weight_pins import state_hash
    from workbench.drivers.shadows import SET_FILE, train_shadow_set
    from workbench.running.model_loading import load_tensors

    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    seq = train_shadow_set(TINY_SHADOWS["train"], TINY_SHADOWS["pool"], 2, tmp_path / "seq", seed=0, progress=False)
    path = tmp_path / "shadows.yaml"
    path.write_text(yaml.safe_dump({"shadows": TINY_SHADOWS}))
    flags = executor_flags(executor, request) if executor == "slurm" else []

    def not_here(*a, **k):
        raise AssertionError("a model was trained in this process, not in a worker")

    monkeypatch.setattr("workbench.drivers.train.train_seed", not_here)  # the workers import their own
    assert main(["shadows", str(path), "--out", str(tmp_path / "par"), "--jobs", "2", *flags]) == 0
    seq_record = json.loads((tmp_path / "seq" / SET_FILE).read_text())
    assert json.loads((tmp_path / "par" / SET_FILE).read_text()) == seq_record
    for m, final in enumerate(seq.checkpoints):
        par = tmp_path / "par" / seq_record["models"][m]["checkpoint"]
        assert state_hash(load_tensors(par / "model.safetensors")) == state_hash(load_tensors(final / "model.safetensors"))
    if executor == "slurm":
        assert len(list((tmp_path / "par" / "submitit").glob("*_result.pkl"))) == 2
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "par").glob("model-*/seed-*/step-*/model.safetensors")}
    assert main(["shadows", str(path), "--out", str(tmp_path / "par"), "--jobs", "2", *flags]) == 0
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps  # finished models are found, not retrained


def test_shadows_config_is_read_by_the_one_rule(tmp_path):
    """The shadows: mapping of a file (its stem names the set), --out by the override rule, bad values
    one ConfigError naming the file before any work."""
    from workbench.drivers.shadows import load_shadows_config

    path = tmp_path / "my_set.yaml"
    path.write_text(yaml.safe_dump({"shadows": TINY_SHADOWS}))
    cfg = load_shadows_config(path)
    assert (cfg.name, cfg.kind, cfg.n_models, cfg.out) == ("my_set", "pretrain", 2, None)
    assert str(load_shadows_config(path, {"out": "x"}).folder()) == "x"
    with pytest.raises(ConfigError, match=r"my_set\.yaml: n_models: expected an integer"):
        load_shadows_config(path, {"n_models": "two"})
    with pytest.raises(ConfigError, match="at least 2 models"):
        load_shadows_config(path, {"n_models": 1})
    path.write_text(yaml.safe_dump({"other": {}}))
    with pytest.raises(ConfigError, match="needs a shadows: mapping"):
        load_shadows_config(path)
