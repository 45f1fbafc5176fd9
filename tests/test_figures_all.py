"""`bertology figures --all` draws what it can (issue 26's promise, issue 40): on an empty store, a
syntax-only one, the main job's and a mixed one (syntax, coref, cloze, membership, align, prune,
distill and fine-tuning runs) every shipped figure whose data is in the store is drawn with its
manifest, every other one is listed with the command that makes its data, the exit status is 2
when any was skipped, and nothing ends in a traceback. Bad input is one line and exit 2 before any
figure is drawn.

The stores hold rows written through the results store API: real syntax probe rows on a tiny
BERT (`probe_store`, and a main-job run of all six tasks), and for the other probes small planted
rows made by the probes' own row builders (`layer_rows`, `mark_baselines`, `build_rows`,
`distill_rows`) or in their shape."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from app import figures
from app.cli import main
from app.figures import MissingData, figure_names, load_spec, produced_by, query_rows
from workbench.store.results import ResultsStore

MAIN_JOB_FIGURES = {"syntax_depth_summary", "syntax_layer_curves", "training_time_heatmap",
                    "training_time_heatmap_uuas"}


# --------------------------------------------------------------------------- running the command
def _figures_all(root: Path, out: Path, capsys, *extra: str) -> tuple[int, dict[str, str], dict[str, str], str]:
    """Run `bertology figures --all` (HTML only: no Chromium in tests) on `root`, the figures under
    `out`. Returns (exit status, {drawn figure: its line}, {listed figure: why}, stderr)."""
    code = main(["figures", "--all", "--runs-root", str(root), "--out", str(out), "--formats", "html", *extra])
    stdout, stderr = capsys.readouterr()
    drawn = dict(re.findall(r"^(\w+): (/.*)$", stdout, flags=re.M))
    listed = dict(re.findall(r"^  (\w+): (.*)$", stderr, flags=re.M))
    return code, drawn, listed, stderr


def _check_every_figure_accounted_for(code, drawn, listed, stderr, out: Path, store: ResultsStore) -> None:
    """Every shipped figure is drawn (folder with data.csv, HTML and a manifest naming runs of the
    store) or listed as skipped with its produced_by command; none failed; exit 2 iff any skipped."""
    names = figure_names()
    assert "Traceback" not in stderr
    assert "could not be drawn" not in stderr and "failed with an error" not in stderr, stderr
    assert set(drawn) | set(listed) == set(names) and not set(drawn) & set(listed)
    assert code == (2 if listed else 0)
    if listed:
        assert f"{len(listed)} of {len(names)} figure(s) skipped" in stderr
    for name in listed:
        assert f"  {name}: {listed[name]}\n    make the data with: {produced_by(load_spec(name)[1])}\n" in stderr
        assert not (out / name).exists()
    known = set(store.runs()["run_id"])
    for name in drawn:
        folder = out / name
        assert {p.name for p in folder.iterdir()} == {"data.csv", "manifest.json", f"{name}.html"}
        m = json.loads((folder / "manifest.json").read_text())
        assert m["figure"] == name and m["run_ids"] and set(m["run_ids"]) <= known and m["n_points"] > 0
        assert m["files"] == ["data.csv", f"{name}.html"] and m["spec"] == load_spec(name)[1]
        assert len(pd.read_csv(folder / "data.csv")) == m["n_points"]


# --------------------------------------------------------------------------- the four stores
def test_an_empty_store_lists_every_figure_with_its_command(tmp_path, capsys):
    """Before issue 40: KeyError 'name' in query_rows (an empty catalog lost its columns)."""
    root = tmp_path / "runs"
    code, drawn, listed, stderr = _figures_all(root, tmp_path / "figs", capsys)
    store = ResultsStore(root)
    _check_every_figure_accounted_for(code, drawn, listed, stderr, tmp_path / "figs", store)
    assert code == 2 and drawn == {} and set(listed) == set(figure_names())
    assert listed["syntax_layer_curves"].startswith("no run in")
    assert "make the data with: bertology run experiments/main.yaml" in stderr


def test_a_syntax_only_store_draws_its_syntax_figures(probe_store, tmp_path, capsys):
    assert set(probe_store.runs()["probes"]) == {"syntax"}
    out = tmp_path / "figs"
    code, drawn, listed, stderr = _figures_all(probe_store.root, out, capsys)
    _check_every_figure_accounted_for(code, drawn, listed, stderr, out, probe_store)
    # the store's syntax runs (upos, deprel, structural-distance; no xpos, arc, depth, no sweep or named runs)
    assert set(drawn) == MAIN_JOB_FIGURES
    last = probe_store.runs()["run_id"].iloc[-1]
    assert json.loads((out / "syntax_layer_curves" / "manifest.json").read_text())["run_ids"] == [last]
    # a figure pinned to runs made elsewhere is skipped, not fatal (before issue 40: it stopped the rest)
    assert "not in the store" in listed["coref_real_models"]


@pytest.fixture(scope="module")
def main_job_store(probe_store, tmp_path_factory):
    """The main job's store (experiments/main.yaml): one syntax run of the six tasks on the last
    checkpoint, with the majority, control and random-init baselines (here on the tiny BERT of
    `probe_store`, few sentences)."""
    from probes.syntax import TASKS, run_syntax_probes

    last = probe_store.root.parent / "train" / "tinyrun" / "seed-0" / "step-0000010"
    store = ResultsStore(tmp_path_factory.mktemp("main-job") / "runs")
    run_syntax_probes([last], list(TASKS), store=store, name="main", baselines=("majority", "control", "random_init"),
                      pooling="mean", max_train_sentences=60, max_eval_sentences=30, n_boot=20,
                      structural={"epochs": 2}, mdl_tasks=(), scalar_mix_tasks=(),
                      cache_dir=probe_store.root.parent / "cache", progress=False)
    return store


@pytest.mark.slow
def test_the_main_jobs_store_draws_the_syntax_figures(main_job_store, tmp_path, capsys):
    out = tmp_path / "figs"
    code, drawn, listed, stderr = _figures_all(main_job_store.root, out, capsys)
    _check_every_figure_accounted_for(code, drawn, listed, stderr, out, main_job_store)
    assert set(drawn) == MAIN_JOB_FIGURES and code == 2
    depth = pd.read_csv(out / "syntax_depth_summary" / "data.csv")
    assert set(depth["task"]) <= {"upos", "xpos", "deprel", "arc", "structural-distance", "structural-depth"}
    assert len(set(depth["task"])) >= 4  # a 3-layer model: a task whose curve never rises is not placed


# planted rows of the other probes, in the shape their writers give them
LAYERS = [0.50, 0.60, 0.80, 0.70]  # a per-layer curve peaking at layer 2


def _syntax_rows(model: str) -> pd.DataFrame:
    from probes.core import depth
    from probes.core.baselines import mark_baselines
    from probes.core.rows import layer_rows

    rng = np.random.default_rng(0)
    boot = np.clip(np.array(LAYERS) + rng.normal(0, 0.01, (50, 4)), 0, 1)
    frames = [layer_rows({"accuracy": LAYERS, "majority": [0.2] * 4}, probe="syntax", task="upos", split="dev",
                         model=model, family="bert", step=10, extra=depth.boot_extras(boot)),
              layer_rows({"uuas": [0.3, 0.4, 0.45, 0.4]}, probe="syntax", task="structural-distance", split="dev",
                         model=model, family="bert", step=10)]
    return mark_baselines(pd.concat(frames, ignore_index=True), {"majority": ("majority", "accuracy")})


def _coref_rows(model: str) -> pd.DataFrame:
    from probes.core import depth
    from probes.core.rows import layer_rows

    rng = np.random.default_rng(1)
    curve = [0.55, 0.60, 0.70, 0.80]
    boot = np.clip(np.array(curve) + rng.normal(0, 0.01, (50, 4)), 0, 1)
    return pd.concat([
        layer_rows({"auc": curve}, probe="coref", task="gum-pairs", split="dev", model=model, family="bert",
                   extra=depth.boot_extras(boot)),
        layer_rows({"f1": [0.5, 0.6, 0.65, 0.6]}, probe="coref", task="gap", split="test", model=model, family="bert"),
    ], ignore_index=True)


def _cloze_rows() -> pd.DataFrame:
    from probes.core.baselines import mark_baselines
    from probes.core.rows import layer_rows

    frames = [layer_rows({"zero_shot_acc": [acc], "random_acc": [0.25]}, probe="cloze", task=task, split="test",
                         layers=[3], ci={"zero_shot_acc": ([acc - 0.05], [acc + 0.05])}, model="m", family="bert")
              for task, acc in (("age", 0.6), ("antonym", 0.4))]
    return mark_baselines(pd.concat(frames, ignore_index=True), {"random_acc": "chance"})


def _membership_rows() -> list[dict]:
    rows = []
    for step, auc in ((0, 0.5), (10, 0.7)):
        fpr = [0.0, 0.01, 0.1, 0.5, 1.0]
        rows.append({"model": f"m/step-{step}", "family": "bert", "probe": "membership", "task": "loss", "split": "test",
                     "metric": "auc", "value": auc, "ci_low": auc - 0.05, "ci_high": auc + 0.05, "step": step,
                     "extra": {"roc_fpr": fpr, "roc_tpr": [0.0, 0.02 + 0.1 * (auc - 0.5), 0.2, 0.6, 1.0]}})
    return rows


def _align_rows() -> pd.DataFrame:
    from probes.core.rows import layer_rows

    cka = np.arange(12).reshape(3, 4) / 12
    frames = [layer_rows({"cka": [cka[i, j]]}, probe="align", task="model-pair", split="all", layers=[i], model="m",
                         extra={"other_model": "other", "other_layer": j}) for i in range(3) for j in range(4)]
    frames.append(layer_rows({"accuracy": [0.2, 0.5, 0.4]}, probe="align", task="parallel", split="test", model="m"))
    return pd.concat(frames, ignore_index=True)


def _prune_rows() -> list[dict]:
    from workbench.drivers.prune_sweep import build_rows

    points = []
    for seed, acc in enumerate((0.80, 0.82)):
        common = {"seed": seed, "parameters": 1200, "prunable": 1000, "nonzero_parameters": 900}
        for method, amount, a, kw in (("full", 0.0, acc, {}), ("imp", 0.3, acc - 0.02, {"round": 1}),
                                      ("quantize", 8, acc, {"bits": 8})):
            points.append({"method": method, "amount": amount, "dev": {"accuracy": a, "n": 100},
                           "test": {"accuracy": a, "n": 100}, "nonzero_prunable": 700 if method == "imp" else 1000,
                           "sparsity_measured": 0.3 if method == "imp" else 0.0, **common, **kw})
    return build_rows(points, "sentence_polarity", "bert", "planted")


def _distill_rows() -> list[dict]:
    from workbench.drivers.distill import distill_rows

    teacher = {"test_accuracy": 0.80, "test_n": 100, "dev_accuracy": 0.8, "dev_n": 100, "parameters": 1000,
               "file_bytes": 4000, "latency_ms": 10.0, "depth": 6, "sha256": "x", "path": "/t"}
    point = {"point": {"depth": 3, "init": "teacher", "temperature": 2.0, "alpha": 0.5},
             "seeds": {str(s): {"test_accuracy": v, "dev_accuracy": v, "test_n": 100, "checkpoint": "c", "best_epoch": 1}
                       for s, v in enumerate((0.76, 0.78))},
             "parameters": 600, "file_bytes": 2400, "latency_ms": 5.0}
    return distill_rows({"L3-teacher-T2-a0.5": point}, teacher, "teacher", "bert", "sentence_polarity")


def _finetune_rows() -> list[dict]:
    rows, common = [], {"model": "m", "family": "bert", "probe": "finetune", "task": "sentence_polarity"}
    for seed, curve in enumerate(([0.6, 0.7], [0.62, 0.72])):
        rows += [{**common, "seed": seed, "step": 10 * e, "split": "dev", "metric": "accuracy_epoch", "value": v, "n": 50,
                  "extra": {"epoch": e}} for e, v in enumerate(curve, 1)]
        rows += [{**common, "seed": seed, "step": 20, "split": split, "metric": "accuracy", "value": max(curve), "n": 50}
                 for split in ("dev", "test")]
    rows.append({"model": "majority", "family": "baseline", "probe": "finetune", "task": "sentence_polarity",
                 "split": "test", "metric": "accuracy", "value": 0.5, "n": 50})
    return rows


MIXED = {"syntax": lambda: _syntax_rows("m"), "coref": lambda: _coref_rows("m"), "cloze": _cloze_rows,
         "membership": _membership_rows, "align": _align_rows, "prune": _prune_rows, "distill": _distill_rows,
         "finetune": _finetune_rows}
# the figures the mixed store has data for: `run: latest` (or a name prefix) of a probe it holds
MIXED_DRAWN = {"syntax_layer_curves", "syntax_depth_summary", "training_time_heatmap", "training_time_heatmap_uuas",
               "coref_depth", "cloze_zero_shot_families", "membership_roc",
               "membership_auc_steps", "align_model_pair", "align_parallel", "distill_layer_map", "prune_sparsity",
               "prune_size", "prune_bits", "distill_tradeoff", "distill_latency", "finetune_curves", "finetune_test"}


@pytest.fixture(scope="module")
def mixed_store(tmp_path_factory):
    store = ResultsStore(tmp_path_factory.mktemp("mixed") / "runs")
    for probe, rows in MIXED.items():
        kind = probe if probe in ("prune", "distill", "finetune") else "probe"
        with store.start_run(kind, {"probe": probe}, name="cloze-bert" if probe == "cloze" else f"{probe}-planted") as w:
            w.add(rows())
    return store


def test_a_mixed_store_draws_every_figure_it_has_data_for(mixed_store, tmp_path, capsys):
    """Before issue 40: one figure drawn, then `run(s) [...] not in the store` (coref_gap_real_models,
    pinned to runs made elsewhere) and exit 2, the rest never tried."""
    out = tmp_path / "figs"
    code, drawn, listed, stderr = _figures_all(mixed_store.root, out, capsys)
    _check_every_figure_accounted_for(code, drawn, listed, stderr, out, mixed_store)
    assert set(drawn) == MIXED_DRAWN, (sorted(set(drawn) - MIXED_DRAWN), sorted(MIXED_DRAWN - set(drawn)))
    for pinned in ("coref_gap_real_models", "coref_real_models"):
        assert "not in the store" in listed[pinned]
    # drawn from the right runs: each figure's manifest names the run of its probe
    by_name = {n: r for n, r in zip(mixed_store.runs()["name"], mixed_store.runs()["run_id"])}
    manifest = lambda n: json.loads((out / n / "manifest.json").read_text())  # noqa: E731
    assert manifest("coref_depth")["run_ids"] == sorted([by_name["coref-planted"], by_name["syntax-planted"]])
    assert manifest("finetune_test")["run_ids"] == [by_name["finetune-planted"]]
    curves = pd.read_csv(out / "syntax_layer_curves" / "data.csv")
    upos = curves[(curves["task"] == "upos") & (curves["kind"] == "model")].sort_values("layer")
    assert upos["value"].tolist() == LAYERS


def test_a_skipped_figure_keeps_its_earlier_render(mixed_store, tmp_path, capsys):
    """A figure drawn from one store and skipped on another: its folder stays as the render left it."""
    out = tmp_path / "figs"
    assert main(["figures", "finetune_test", "--runs-root", str(mixed_store.root), "--out", str(out / "finetune_test"),
                 "--formats", "html"]) == 0
    before = {p.name: p.read_bytes() for p in (out / "finetune_test").iterdir()}
    capsys.readouterr()
    code, drawn, listed, _ = _figures_all(tmp_path / "empty", out, capsys)
    assert code == 2 and not drawn and "finetune_test" in listed
    assert {p.name: p.read_bytes() for p in (out / "finetune_test").iterdir()} == before


# --------------------------------------------------------------------------- queries
def test_queries_on_an_empty_or_unrelated_store_are_missing_data_not_key_errors(tmp_path, mixed_store):
    empty = ResultsStore(tmp_path / "runs")
    for query in ({"probe": "align", "tasks": ["diachronic"], "name": "communities_era:", "run": "latest"},
                  {"probe": ["coref", "syntax"], "tasks": ["gum-pairs", "upos"], "run": "latest"},
                  {"name": "cloze-"}, {"probe": "syntax", "run": ["20261126T205617.955474Z-a42a6f2e"]}):
        with pytest.raises(MissingData):
            query_rows(empty, query)
    with pytest.raises(MissingData, match="not in the store"):  # pinned runs of another store
        query_rows(mixed_store, {"probe": "syntax", "run": ["20261126T205617.955474Z-a42a6f2e"]})
    with pytest.raises(MissingData, match="hold no rows"):  # the runs exist, the rows asked for do not
        query_rows(mixed_store, {"probe": "syntax", "tasks": ["upos"], "metrics": ["no_such_metric"], "split": "test"})


# --------------------------------------------------------------------------- bad input and bugs
@pytest.mark.parametrize("argv, env, match", [
    (["syntax_layer_curves", "no_such_figure"], {}, "no such figure"),
    (["--all", "syntax_layer_curves"], {}, "not both"),
    ([], {}, "name a figure or pass --all"),
    (["--all", "--formats", "html,jpg"], {}, "--formats: unknown format(s) ['jpg']"),
    (["--all"], {"BERTOLOGY_FIGURE_TIMEOUT": "soon"}, "positive number of seconds"),
    (["syntax_layer_curves", "syntax_layer_curves"], {}, "named twice"),
])
def test_bad_input_is_one_line_and_exit_2_before_any_figure(tmp_path, capsys, monkeypatch, argv, env, match):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    out, root = tmp_path / "figs", tmp_path / "runs"
    assert main(["figures", *argv, "--runs-root", str(root), "--out", str(out)]) == 2
    stdout, stderr = capsys.readouterr()
    assert stdout == "" and stderr.count("\n") == 1 and stderr.startswith("bertology: error: ") and match in stderr
    assert not out.exists() and not root.exists()  # refused before the store is opened


@pytest.mark.parametrize("text, match", [("title: [unclosed\n", "not valid YAML"), ("- a list\n", ""),
                                         ("title: t\nquery: 3\nplot: layer_curves\n", "query must be a mapping"),
                                         ("title: t\nplot: pie\n", "plot must be one of")])
def test_an_unreadable_figure_yaml_is_one_line_before_any_figure(mixed_store, tmp_path, capsys, text, match):
    """The bad YAML comes after a figure the store can draw: that one is not drawn either."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    out = tmp_path / "figs"
    assert main(["figures", "syntax_layer_curves", str(bad), "--runs-root", str(mixed_store.root),
                 "--out", str(out)]) == 2
    stdout, stderr = capsys.readouterr()
    assert stdout == "" and stderr.count("\n") == 1 and str(bad) in stderr and match in stderr
    assert not out.exists()


def _toy_figures(folder: Path) -> Path:
    """Three figures over the syntax rows of the mixed store: a, c draw layer curves; b uses a plot that breaks."""
    folder.mkdir()
    q = "query: {probe: syntax, tasks: [upos], metrics: [accuracy], run: latest, split: dev}\n"
    for name, plot in (("a_curves", "layer_curves"), ("b_broken", "broken"), ("c_curves", "layer_curves")):
        (folder / f"{name}.yaml").write_text(f"title: {name}\n{q}plot: {plot}\nproduced_by: bertology x\n")
    return folder


def test_a_plot_bug_is_one_line_and_the_rest_are_drawn(mixed_store, tmp_path, capsys, monkeypatch):
    """A plot that raises something the workbench does not name (a bug) is listed in one line with
    the command that shows its traceback; the figures after it are drawn; exit status 1. Named
    alone, the figure keeps its traceback."""
    def broken(rows, title, options):
        return {}["no such key"]

    monkeypatch.setattr(figures, "FIGURES_DIR", _toy_figures(tmp_path / "specs"))
    monkeypatch.setitem(figures.PLOTS, "broken", broken)
    out = tmp_path / "figs"
    code = main(["figures", "--all", "--runs-root", str(mixed_store.root), "--out", str(out), "--formats", "html"])
    stdout, stderr = capsys.readouterr()
    assert code == 1 and "Traceback" not in stderr
    assert "1 of 3 figure(s) failed with an error" in stderr and "  b_broken: KeyError: 'no such key'\n" in stderr
    assert sorted(p.name for p in out.iterdir()) == ["a_curves", "c_curves"]
    assert (out / "c_curves" / "manifest.json").is_file() and "drew 2 of 3 figure(s)" in stdout
    with pytest.raises(KeyError):
        main(["figures", "b_broken", "--runs-root", str(mixed_store.root), "--out", str(tmp_path / "one")])


def test_a_named_failure_is_listed_and_the_rest_are_drawn(mixed_store, tmp_path, capsys, monkeypatch):
    """A figure the workbench cannot draw for a reason it names (here a failed static export) is
    listed with that reason; the rest are drawn; exit status 2."""
    from workbench.errors import WorkbenchError

    real = figures.static_images

    def export_fails(fig, formats, timeout):
        if fig.layout.title.text == "b_broken":
            raise WorkbenchError("static figure export (kaleido) failed: no Chromium")
        return {fmt: b"image" for fmt in formats} if fig.layout.title.text == "a_curves" else real(fig, formats, timeout)

    monkeypatch.setattr(figures, "FIGURES_DIR", _toy_figures(tmp_path / "specs"))
    monkeypatch.setitem(figures.PLOTS, "broken", figures.layer_curves)
    monkeypatch.setattr(figures, "static_images", export_fails)
    out = tmp_path / "figs"
    code = main(["figures", "b_broken", "a_curves", "--runs-root", str(mixed_store.root), "--out", str(out),
                 "--formats", "png,html"])
    stdout, stderr = capsys.readouterr()
    assert code == 2 and "1 of 2 figure(s) could not be drawn:\n  b_broken: static figure export (kaleido) " \
                         "failed: no Chromium\n" in stderr
    assert sorted(p.name for p in out.iterdir()) == ["a_curves"] and "drew 1 of 2 figure(s)" in stdout
    assert (out / "a_curves" / "a_curves.png").read_bytes() == b"image"
