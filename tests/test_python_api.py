"""The Python API (`bertology`, issue 52) against the command line it stands beside: the same rows,
summary and error lines, a finished run reused, activations equal to the handle's own forward."""

from __future__ import annotations

import inspect
import pydoc

import pandas as pd
import pytest
import torch

import bertology
from workbench.errors import CheckpointError, ConfigError
from workbench.store.results import RESULT_COLUMNS

# A syntax probe that takes seconds on a tiny model (the settings' names are the CLI's options).
QUICK = {"max_train_sentences": 60, "max_eval_sentences": 30, "n_boot": 20, "mdl_tasks": [],
         "scalar_mix_tasks": [], "progress": False}


@pytest.fixture
def runs_root(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("BERTOLOGY_CACHE", raising=False)
    return tmp_path / "runs"


def test_help_lists_every_function_with_a_runnable_example():
    text = pydoc.render_doc(bertology, renderer=pydoc.plaintext)
    for name in ("load", "probe", "runs", "rows", "figure", "train", "finetune", "prune", "distill", "peft",
                 "reproduce"):
        fn = getattr(bertology, name)
        assert f"{name}(" in text, name
        assert ">>> " in (fn.__doc__ or ""), f"{name} has no example in its docstring"
        assert f"bertology.{name}(" in fn.__doc__ or name == "load" and "bertology.load(" in fn.__doc__
    for cls in (bertology.Model, bertology.ProbeResult):
        assert cls.__name__ in text


def test_load_reads_the_manifest_and_runs_with_cache_like_forward(tiny_checkpoint):
    model = bertology.load(tiny_checkpoint)
    assert (model.family, list(model.layers), model.num_layers, model.hidden_size) == ("bert", [0, 1, 2],
                                                                                      {"encoder": 2}, 32)
    assert model.name == "tiny-bert" and [c.step for c in model.checkpoints] == [7]
    cache = model.run_with_cache(["The cat sat on the mat .", "Dogs bark"])
    words = [["The", "cat", "sat", "on", "the", "mat", "."], ["Dogs", "bark"]]
    assert torch.equal(cache["blocks.0.resid_post"], model.run_with_cache(words)["blocks.0.resid_post"])
    reference = model.handle.forward(words).hidden_states["encoder"]
    assert len(cache.layers("encoder")) == 3
    for ours, theirs in zip(cache.layers("encoder"), reference):
        torch.testing.assert_close(ours, theirs)
    assert set(model.hook_names()) <= set(cache.keys())
    pattern = cache["blocks.1.attn.pattern"]
    assert pattern.shape[:2] == (2, 2)
    torch.testing.assert_close(pattern.sum(-1)[0, :, :3], torch.ones(2, 3))  # probabilities over keys
    only = model.run_with_cache("Dogs bark", names=["embed"])
    assert list(only.keys()) == ["embed"]
    assert "<table>" in model._repr_html_() and "tiny-bert" in model._repr_html_()


def test_load_a_missing_name_is_the_cli_error(tmp_path):
    with pytest.raises(CheckpointError, match="checkpoint does not exist"):
        bertology.load(tmp_path / "nowhere")


def test_probe_gives_the_cli_rows_and_summary_and_reuses_its_run(tiny_checkpoint, runs_root, capsys):
    from app.cli import main
    from probes.syntax import format_layer_table
    from workbench.store.results import ResultsStore

    model = bertology.load(tiny_checkpoint)
    result = bertology.probe(model, "syntax", tasks=["upos"], **QUICK)
    assert not result.reused
    rows = result.rows
    assert list(rows.columns) == RESULT_COLUMNS and set(rows["run_id"]) == {result.run_id}
    assert set(rows["model"]) == {"tiny-bert", "tiny-bert (random init)"} and set(rows["step"].dropna()) == {7}

    # the command line, same settings: the same numbers
    argv = ["probe", "syntax", "--checkpoint", str(tiny_checkpoint), "--tasks", "upos", "--max-train-sentences", "60",
            "--max-eval-sentences", "30", "--n-boot", "20", "--mdl-tasks", "", "--scalar-mix-tasks", "", "--quiet"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    cli_run = printed.split()[1].rstrip(":")
    cli_rows = ResultsStore().read(cli_run)
    keys = ["model", "task", "split", "layer", "metric"]
    ours = rows.drop(columns=["run_id"]).sort_values(keys).reset_index(drop=True)
    theirs = cli_rows.drop(columns=["run_id"]).sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(ours, theirs)
    assert result.text() == format_layer_table(cli_rows) and result.text() in printed

    # the summary is the printed table's numbers
    summary = result.summary()
    acc = rows[(rows["model"] == "tiny-bert") & (rows["task"] == "upos") & (rows["metric"] == "accuracy")]
    assert summary["layer"].tolist() == [0, 1, 2]
    assert summary["UPOS acc"].tolist() == acc.sort_values("layer")["value"].tolist()
    twin = rows[(rows["model"] == "tiny-bert (random init)") & (rows["metric"] == "accuracy")]
    assert summary["rand-init UPOS"].tolist() == twin.sort_values("layer")["value"].tolist()
    assert f"{summary['UPOS acc'].iloc[0]:.3f}" in result.text()
    assert "<table" in result._repr_html_()

    # asked again (a notebook re-run): the stored run, not a new one; other settings: a new run
    again = bertology.probe(bertology.load(tiny_checkpoint), "syntax", tasks="upos", **QUICK)
    assert again.reused and again.run_id == result.run_id
    assert len(bertology.runs(probe="syntax")) == 2  # the API's run and the CLI's
    other = bertology.probe(model, "syntax", tasks=["upos"], **{**QUICK, "seed": 1})
    assert not other.reused and other.run_id != result.run_id
    assert bertology.runs(name=f"syntax:{result.run_id}").empty  # runs are named <name>:<key>, not by id
    assert set(bertology.runs(probe="syntax")["run_id"]) == {result.run_id, cli_run, other.run_id}

    # the store's rows and the plot of the same run
    pd.testing.assert_frame_equal(bertology.rows(result.run_id), rows)
    assert set(bertology.rows(result.run_id, metric="accuracy")["metric"]) == {"accuracy"}
    figure = result.plot()
    curve = next(t for t in figure.data if t.name == "tiny-bert" and t.mode == "lines+markers")
    assert list(curve.x) == [0, 1, 2] and list(curve.y) == pytest.approx(summary["UPOS acc"].tolist())
    shipped = bertology.figure("syntax_layer_curves", runs=result.run_id)
    assert any(t.name == "tiny-bert" for t in shipped.data)
    with pytest.raises(ConfigError, match="plot kind must be one of"):
        result.plot("pie")


def test_a_bad_setting_is_the_cli_error_line(tiny_checkpoint, runs_root, capsys):
    from app.cli import main

    for settings, flags in (({"tasks": ["upos", "nope"]}, ["--tasks", "upos,nope"]),
                            ({"seed": -1}, ["--seed", "-1"]),
                            ({"cache_dtype": "fp8"}, ["--cache-dtype", "fp8"])):
        with pytest.raises(ConfigError) as err:
            bertology.probe(tiny_checkpoint, "syntax", **settings)
        assert main(["probe", "syntax", "--checkpoint", str(tiny_checkpoint), *flags]) == 2
        line = capsys.readouterr().err.strip()
        assert line == f"bertology: error: {err.value}" and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="unknown probe"):
        bertology.probe(tiny_checkpoint, "sintax")
    assert bertology.runs().empty  # nothing ran


def test_a_derived_model_is_probed_in_memory_under_its_own_key(tiny_checkpoint, runs_root):
    model = bertology.load(tiny_checkpoint)
    twin = model.derive("random_init", {"seed": 5})
    assert twin.checkpoints == [] and twin.lineage.transform == "random_init"
    assert twin.handle.checkpoint_hash != model.handle.checkpoint_hash
    settings = {**QUICK, "baselines": []}
    a = bertology.probe(twin, "syntax", tasks=["upos"], **settings)
    b = bertology.probe(model, "syntax", tasks=["upos"], **settings)
    assert a.run_id != b.run_id and not b.reused
    assert set(a.rows["model"]) == {f"in-memory-{twin.handle.checkpoint_hash[:8]}"}
    assert bertology.probe(twin, "syntax", tasks=["upos"], **settings).run_id == a.run_id
    saved = bertology.load(twin.save(runs_root / "derived" / "twin"))
    cache, ref = saved.run_with_cache("a b c"), twin.run_with_cache("a b c")
    torch.testing.assert_close(cache["final"], ref["final"])


def test_finetune_is_the_driver_with_keyword_overrides(tiny_checkpoint, runs_root, tmp_path):
    from tests.training_helpers import tiny_finetune_config

    base = {k: v for k, v in vars(tiny_finetune_config(tiny_checkpoint, tmp_path / "ft")).items()}
    result = bertology.finetune(base, epochs=1, seeds=[0])
    assert result.run_id in set(bertology.runs()["run_id"])
    best = bertology.load(result.seeds[0].checkpoint)
    assert best.hidden_size == 32
    with pytest.raises(ConfigError, match="epochs"):
        bertology.finetune(base, epochs="many")


def test_the_drivers_signatures_take_overrides():
    for fn in (bertology.finetune, bertology.prune, bertology.distill, bertology.peft):
        params = inspect.signature(fn).parameters
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()), fn.__name__


def test_progress_draws_a_notebook_bar_in_a_jupyter_kernel(monkeypatch):
    import io
    import types

    from tqdm import tqdm

    from workbench import progress as prog

    monkeypatch.delenv("BERTOLOGY_QUIET", raising=False)
    log = io.StringIO()  # not a terminal: outside a kernel, plain lines
    assert not prog.in_notebook()
    assert isinstance(prog.progress(range(3), desc="x", stream=log), prog.LineProgress)

    class ZMQInteractiveShell:  # what IPython's get_ipython() returns inside a Jupyter kernel
        pass

    fake = types.ModuleType("IPython")
    fake.get_ipython = ZMQInteractiveShell
    monkeypatch.setitem(__import__("sys").modules, "IPython", fake)
    assert prog.in_notebook()
    bar = prog.progress(range(3), desc="x", stream=log)
    assert isinstance(bar, tqdm) and list(bar) == [0, 1, 2]  # the widget, or tqdm's text bar without ipywidgets
    assert log.getvalue() == ""  # nothing went to the log stream
    monkeypatch.setenv("BERTOLOGY_QUIET", "1")
    assert isinstance(prog.progress(range(3)), prog.SilentProgress)


def test_reproduce_refuses_an_unknown_row_with_the_cli_line(runs_root, capsys):
    from app.cli import main

    with pytest.raises(ConfigError) as err:
        bertology.reproduce(rows=["tenney2019", "nope2031"])
    assert main(["reproduce", "--rows", "tenney2019,nope2031"]) == 2
    assert capsys.readouterr().err.strip() == f"bertology: error: {err.value}"
    assert "nope2031" in str(err.value) and "tenney2019" in str(err.value)  # the known rows are named
    assert bertology.runs().empty


def test_reproduce_gives_the_table_the_command_prints(runs_root, capsys):
    from app.cli import main

    table = bertology.reproduce(rows="strubell2019")  # Strubell et al.'s inputs through our cost code: seconds
    assert table["row"].iloc[0] == "strubell2019" and table["verdict"].iloc[0] == "reproduced"
    assert table["ours"].iloc[0] == pytest.approx(table["paper_value"].iloc[0], rel=0.01)
    latest = runs_root / "reproduce" / "latest" / "reproduce.csv"
    assert pd.read_csv(latest)["row"].iloc[0] == "strubell2019"  # what the app's page reads
    assert main(["reproduce", "--rows", "strubell2019", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "strubell2019" in printed and f"{table['ours'].iloc[0]:.0f}" in printed.replace(",", "")
