"""The example notebooks (examples/*.ipynb, issue 52) run top to bottom in a real Jupyter kernel
(nbclient), on tiny models: their first cell reads `BERTOLOGY_EXAMPLE_*` environment variables,
set here, so a notebook that breaks fails the suite while the notebook as shipped names the real
model. The repository keeps them without outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))
QUICK_PROBE = {"max_train_sentences": 60, "max_eval_sentences": 30, "n_boot": 20, "mdl_tasks": [],
               "scalar_mix_tasks": [], "structural_max_train_sentences": 60, "progress": False}


def execute(path: Path, env: dict[str, str], monkeypatch) -> "object":
    """Run every cell in a fresh kernel (the kernel inherits this process's environment); an error
    in any cell raises `nbclient.exceptions.CellExecutionError` naming the cell."""
    import nbformat
    from nbclient import NotebookClient

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}}).execute()
    return nb


def outputs(nb, cell: int) -> str:
    """The text and HTML a code cell showed, joined."""
    out = []
    for o in nb.cells[cell].get("outputs", []):
        data = o.get("data", {})
        out += [o.get("text", ""), data.get("text/plain", ""), data.get("text/html", "")]
    return "\n".join(out)


def code_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]


def test_three_notebooks_are_shipped_without_outputs():
    import nbformat

    assert [p.name for p in NOTEBOOKS] == ["01_probe_a_hub_model.ipynb", "02_watch_upos_emerge.ipynb",
                                          "03_prune_and_probe_tickets.ipynb"]
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for cell in nb.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip its outputs"
        first = nb.cells[code_cells(nb)[0]].source
        assert "BERTOLOGY_EXAMPLE_" in first, f"{path.name}: its first code cell reads the parameters"


@pytest.fixture
def runs_env(tmp_path) -> dict[str, str]:
    return {"BERTOLOGY_RUNS": str(tmp_path / "runs"), "BERTOLOGY_QUIET": "1",
            "BERTOLOGY_EXAMPLE_PROBE": json.dumps(QUICK_PROBE)}


@pytest.mark.slow
def test_probe_a_hub_model_notebook(tiny_checkpoint, runs_env, monkeypatch):
    from workbench.store.results import ResultsStore

    nb = execute(EXAMPLES / "01_probe_a_hub_model.ipynb",
                 {**runs_env, "BERTOLOGY_EXAMPLE_MODEL": str(tiny_checkpoint)}, monkeypatch)
    cells = code_cells(nb)
    assert "tiny-bert" in outputs(nb, cells[1])  # the model's HTML table
    assert "blocks.0.resid_post" in outputs(nb, cells[2])
    runs = ResultsStore(runs_env["BERTOLOGY_RUNS"]).runs(probe="syntax")
    assert len(runs) == 1 and runs["run_id"].iloc[0] in outputs(nb, cells[3])
    assert "gain_over_twin" in outputs(nb, cells[4])
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in nb.cells[cells[5]].outputs)


@pytest.mark.slow
def test_watch_upos_emerge_notebook(runs_env, tmp_path, monkeypatch):
    from workbench.store.results import ResultsStore

    train = {"name": "nb-quick", "preset": "tiny", "steps": 4, "corpus": {"max_documents": 20},
             "tokenizer": {"vocab_size": 500}, "max_len": 64, "batch_size": 8, "output_dir": str(tmp_path / "train"),
             "progress": False}
    nb = execute(EXAMPLES / "02_watch_upos_emerge.ipynb", {**runs_env, "BERTOLOGY_EXAMPLE_TRAIN": json.dumps(train)},
                 monkeypatch)
    cells = code_cells(nb)
    assert "[0, 1, 2, 4]" in outputs(nb, cells[1])  # log-spaced steps
    rows = ResultsStore(runs_env["BERTOLOGY_RUNS"]).query(probe="syntax", metric="accuracy")
    assert sorted(set(rows["step"].dropna())) == [0, 1, 2, 4]
    assert any("application/vnd.plotly.v1+json" in o.get("data", {}) for o in nb.cells[cells[3]].outputs)


@pytest.mark.slow
def test_prune_and_probe_tickets_notebook(tiny_checkpoint, runs_env, tmp_path, monkeypatch):
    from workbench.store.results import ResultsStore

    prune = {"finetune": {"checkpoint": str(tiny_checkpoint), "task": "sentence_polarity", "seeds": [0], "epochs": 1,
                          "lr": 1e-3, "max_train_examples": 64, "max_eval_examples": 32, "batch_size": 16,
                          "max_len": 32, "baselines": False, "device": "cpu"},
             "methods": ["imp", "random"], "sparsities": [0.2], "bits": [], "ranks": [],
             "output_dir": str(tmp_path / "prune"), "progress": False}
    probe = {**QUICK_PROBE, "baselines": []}  # the tickets only, no twins: a third of the time
    nb = execute(EXAMPLES / "03_prune_and_probe_tickets.ipynb",
                 {**runs_env, "BERTOLOGY_EXAMPLE_PRUNE": json.dumps(prune), "BERTOLOGY_EXAMPLE_PROBE": json.dumps(probe)},
                 monkeypatch)
    cells = code_cells(nb)
    assert "imp" in outputs(nb, cells[1]) and "random" in outputs(nb, cells[1])
    store = ResultsStore(runs_env["BERTOLOGY_RUNS"])
    probed = store.runs(probe="syntax")
    assert len(probed) == 1
    rows = store.read(probed["run_id"].iloc[0])
    assert set(rows["model"]) == {"full-0-seed0", "imp-0.1-seed0", "imp-0.2-seed0"}  # the model and its IMP rounds
    assert "imp-0.2-seed0" in outputs(nb, cells[2])  # the per-layer table of each ticket
