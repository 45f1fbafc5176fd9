"""`bertology run EXPERIMENT.yaml`: train -> probe -> table, through the real pieces, tiny sizes."""

import pytest
import yaml

from app.experiments import load_experiment, run_experiment
from workbench.errors import ConfigError
from workbench.paths import REPO_ROOT
from workbench.store.results import ResultsStore


def test_main_experiment_yaml_is_valid():
    spec = load_experiment(REPO_ROOT / "experiments" / "main.yaml")
    assert (spec["_dir"] / spec["train"]).is_file()
    assert set(spec["probe"]["syntax"]["tasks"]) == {"upos", "xpos", "deprel", "arc", "structural-distance",
                                                     "structural-depth"}


@pytest.mark.slow
def test_train_then_probe_prints_layer_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    experiment = {
        "name": "runner-test",
        "train": {"family": "bert", "preset": "tiny", "steps": 4, "max_len": 64, "batch_size": 8,
                  "tokenizer": {"vocab_size": 1000}, "progress": False,
                  "corpus": {"sources": ["inaugural"], "max_documents": 20, "heldout_fraction": 0.2}},
        "probe": {"syntax": {"checkpoints": "all", "tasks": ["upos", "structural-distance"],
                             "max_train_sentences": 120, "max_eval_sentences": 50, "mdl_tasks": [],
                             "scalar_mix_tasks": [], "n_boot": 50, "structural": {"epochs": 2},
                             "progress": False}},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(experiment))
    assert run_experiment(path) == 0
    out = capsys.readouterr().out
    assert "UPOS acc" in out and "UUAS" in out
    store = ResultsStore(tmp_path / "runs")
    (run_id,) = store.runs()["run_id"].tolist()
    rows = store.read(run_id)
    # checkpoints "all": every saved step of the run (0, 1, 2, 4) plus their random-init twins
    steps = sorted(set(rows.loc[rows["extra"].str.contains("random_init") == False, "step"].dropna()))  # noqa: E712
    assert steps == [0, 1, 2, 4]
    acc = rows[(rows["task"] == "upos") & (rows["metric"] == "accuracy")]
    assert len(acc) == 4 * 2 * 3  # 4 checkpoints x (model + twin) x 3 layers
    assert acc["value"].between(0, 1).all()


def test_bad_experiment_keys_are_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"train": "x.yaml", "probe": {"sintax": {}}}))
    with pytest.raises(ConfigError, match="probe.sintax"):
        load_experiment(path)
    path.write_text(yaml.safe_dump({"checkpoints": [str(tmp_path)], "probe": {"syntax": {"taks": ["upos"]}}}))
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['taks'\]"):
        run_experiment(path)
