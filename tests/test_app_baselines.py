"""Baselines and twins are what the rows say they are (extra.baseline, app.data.row_kinds), the app
and the exported figures aggregate seeds with one function (app.data.aggregate_seeds), and
`bertology figures --all` draws what it can and lists the rest with the command that makes it."""

import json

import numpy as np
import pandas as pd

from app import data, figures
from app.cli import main
from workbench.store.results import ResultsStore

LAYERS = range(4)


def _rows(model, metric, values, extra=None, task="bli", seed=0, ci=0.02, split="test"):
    return [{"model": model, "probe": "toyprobe", "task": task, "split": split, "stack": "encoder", "layer": layer,
             "metric": metric, "value": v, "ci_low": v - ci, "ci_high": v + ci, "seed": seed,
             "extra": json.dumps(extra) if extra is not None else None} for layer, v in zip(LAYERS, values)]


def _store(tmp_path, rows, name="toy") -> ResultsStore:
    store = ResultsStore(tmp_path / "runs")
    with store.start_run("probe", {"probe": "toyprobe"}, name=name) as run:
        run.add(rows)
    return store


def _figure_yaml(folder, name, query, plot="layer_curves", options=None, produced_by=None):
    spec = {"title": name, "query": query, "plot": plot}
    if options is not None:
        spec["options"] = options
    if produced_by is not None:
        spec["produced_by"] = produced_by
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


# a toy probe with a baseline whose name no table in the app knows
CURVE = [0.2, 0.5, 0.7, 0.6]
SHUFFLED = [0.11, 0.12, 0.13, 0.12]
TOY = (_rows("m", "p_at_1", CURVE, {"k": 1})
       + _rows("m", "shuffled_p_at_1", SHUFFLED, {"baseline": "shuffled-labels", "baseline_for": "p_at_1"})
       + _rows("m", "wordcount_p_at_1", [0.3] * 4, {"baseline": "word-count"})  # no baseline_for: by its name's end
       + _rows("m (random init)", "p_at_1", [0.1, 0.1, 0.15, 0.1], {"baseline": "random_init"}))


def test_a_new_probes_baseline_is_a_baseline_in_the_data_layer(tmp_path):
    rows = _store(tmp_path, TOY).query(probe="toyprobe")
    kinds = data.row_kinds(rows)
    by_metric = kinds.drop_duplicates(["model", "metric"]).set_index(["model", "metric"])
    assert by_metric.loc[("m", "p_at_1"), "kind"] == "model"
    assert by_metric.loc[("m", "shuffled_p_at_1"), "kind"] == "baseline:shuffled-labels"
    assert by_metric.loc[("m", "wordcount_p_at_1"), ["kind", "baseline_for"]].tolist() == ["baseline:word-count", "p_at_1"]
    assert by_metric.loc[("m (random init)", "p_at_1"), "kind"] == "random_init"
    assert data.metric_choices(rows) == (["p_at_1"], ["shuffled_p_at_1", "wordcount_p_at_1"])
    assert data.twin_models(rows) == {"m (random init)"}
    # a row whose probe marks it as a baseline is one whatever its metric is called
    plain = pd.DataFrame(_rows("m", "accuracy", CURVE, {"baseline": "anything"}))
    assert data.baseline_mask(plain).all() and not data.twin_mask(plain).any()


def test_a_new_probes_baseline_is_drawn_as_a_baseline_by_the_figure_exporter(tmp_path, monkeypatch):
    store = _store(tmp_path, TOY)
    spec = _figure_yaml(tmp_path, "toy_curves", {"probe": "toyprobe", "tasks": ["bli"], "metrics": ["p_at_1"]})
    r = figures.render(spec, store, tmp_path / "fig", formats=("html",))
    drawn = pd.read_csv(r.folder / "data.csv")
    assert sorted(set(drawn["kind"])) == ["baseline:shuffled-labels", "baseline:word-count", "model", "random_init"]
    shuffled = drawn[drawn["kind"] == "baseline:shuffled-labels"].sort_values("layer")
    assert shuffled["value"].round(8).tolist() == SHUFFLED
    # one panel (the model's metric), the baselines grey dashed lines in it, the twin dotted
    rows, _ = figures.query_rows(store, {"probe": "toyprobe", "tasks": ["bli"], "metrics": ["p_at_1"]})
    fig = figures.layer_curves(rows, "toy", {}).figure
    assert [a.text for a in fig.layout.annotations] == ["bli: p_at_1"]
    lines = {t.name: t.line for t in fig.data if t.mode in ("lines", "lines+markers")}
    assert lines["shuffled-labels"].color == "grey" and lines["shuffled-labels"].dash not in (None, "solid")
    assert lines["word-count"].color == "grey"
    assert lines["m (random init)"].dash == "dot" and lines["m"].dash == "solid"
    # twins: false drops the twin by its rows' marker
    spec2 = _figure_yaml(tmp_path, "no_twins", {"probe": "toyprobe", "metrics": ["p_at_1"], "twins": False})
    r2 = figures.render(spec2, store, tmp_path / "fig2", formats=("html",))
    assert "random_init" not in set(pd.read_csv(r2.folder / "data.csv")["kind"])


def test_old_rows_without_markers_still_draw_by_the_legacy_names(tmp_path):
    """Runs written before probes declared their baselines: the twin by its name, majority by its metric."""
    old = pd.DataFrame(_rows("m", "accuracy", CURVE, task="upos") + _rows("m", "majority", [0.3] * 4, task="upos")
                       + _rows("m (random init)", "accuracy", [0.2] * 4, task="upos"))
    kinds = data.row_kinds(old).drop_duplicates(["model", "metric"])
    assert kinds["kind"].tolist() == ["model", "baseline:majority", "random_init"]
    drawn = figures.layer_curves(old, "old", {}).data
    assert set(drawn["kind"]) == {"model", "baseline:majority", "random_init"}


def _seeded(values_by_seed, one_seed_model=None):
    rows = []
    for seed, values in enumerate(values_by_seed):  # training seeds in the model name, probe seed in `seed`
        rows += _rows(f"run/seed-{seed}/step-10", "p_at_1", values, {"probe_seed": seed}, seed=seed)
    if one_seed_model:
        rows += _rows(one_seed_model, "p_at_1", CURVE, ci=0.05)
    return pd.DataFrame(rows)


def test_the_app_and_the_figures_draw_the_same_seed_band():
    """The same rows through the app's path (aggregate, then draw) and the exporter's (draw): the
    same points and bands, and they are the mean and the min-max over seeds."""
    seeds = np.array([[0.2, 0.5, 0.7, 0.6], [0.3, 0.45, 0.75, 0.5], [0.1, 0.55, 0.6, 0.65]])
    rows = _seeded(seeds, one_seed_model="other")
    app_view = figures.layer_curves(data.aggregate_seeds(rows), "app", {}).data
    exported = figures.layer_curves(rows, "figure", {}).data
    pd.testing.assert_frame_equal(app_view, exported)
    agg = exported[exported["model"] == "run/step-10"].sort_values("layer")
    np.testing.assert_allclose(agg["value"], seeds.mean(0))
    np.testing.assert_allclose(agg["ci_low"], seeds.min(0))
    np.testing.assert_allclose(agg["ci_high"], seeds.max(0))
    single = exported[exported["model"] == "other"].sort_values("layer")  # one seed keeps its bootstrap CI
    np.testing.assert_allclose(single["ci_high"] - single["value"], 0.05)
    assert data.aggregate_seeds(rows).query("model == 'run/step-10'")["n_seeds"].tolist() == [3] * 4


def test_figures_all_draws_what_it_can_and_lists_the_rest(tmp_path, monkeypatch, capsys):
    """A store holding the data of one of two figures: the other (first in order) is skipped, the
    one with data is drawn, the skipped one is listed with its command, exit status 2."""
    store = _store(tmp_path, TOY)
    shipped = tmp_path / "figures"
    shipped.mkdir()
    _figure_yaml(shipped, "a_membership_roc", {"probe": "membership", "metrics": ["auc"]}, plot="roc_curves",
                 produced_by="bertology probe membership --checkpoint CKPT")
    _figure_yaml(shipped, "b_toy_curves", {"probe": "toyprobe", "metrics": ["p_at_1"]})
    _figure_yaml(shipped, "c_coref", {"probe": "coref", "tasks": ["gum-pairs"]})  # no produced_by: from the query
    monkeypatch.setattr(figures, "FIGURES_DIR", shipped)
    code = main(["figures", "--all", "--runs-root", str(store.root), "--formats", "html"])
    out, err = capsys.readouterr()
    assert code == 2
    assert (store.root / "figures" / "b_toy_curves" / "b_toy_curves.html").is_file()
    assert (store.root / "figures" / "b_toy_curves" / "manifest.json").is_file()
    assert "b_toy_curves:" in out and not (store.root / "figures" / "a_membership_roc").exists()
    assert "2 of 3 figure(s) skipped" in err
    assert "a_membership_roc" in err and "bertology probe membership --checkpoint CKPT" in err
    assert "c_coref" in err and "bertology probe coref --checkpoint CKPT --tasks gum-pairs" in err
    # with every figure's data present, exit 0
    for name in ("a_membership_roc", "c_coref"):
        (shipped / f"{name}.yaml").unlink()
    assert main(["figures", "--all", "--runs-root", str(store.root), "--formats", "html"]) == 0


def test_shipped_figures_name_the_command_that_makes_their_data():
    for name in figures.figure_names():
        _, spec = figures.load_spec(name)
        # a bertology command, or one of the repository's experiment scripts (experiments/*.py)
        assert spec.get("produced_by", "").startswith(("bertology ", "python experiments/")), name


def test_mark_baselines_sets_the_marker_and_keeps_a_twins():
    from probes.core.baselines import mark_baselines

    rows = pd.DataFrame(_rows("m", "majority", [0.3] * 4, {"a": 1}) + _rows("m", "accuracy", CURVE, {"a": 1})
                        + _rows("m (random init)", "majority", [0.3] * 4, {"baseline": "random_init"}))
    out = mark_baselines(rows, {"majority": ("majority", "accuracy")})
    extras = [json.loads(e) for e in out["extra"]]
    assert extras[0] == {"a": 1, "baseline": "majority", "baseline_for": "accuracy"}
    assert extras[4] == {"a": 1}  # other metrics untouched
    assert extras[8] == {"baseline": "random_init"}  # the runner's twin marker is kept
    assert json.loads(rows["extra"].iloc[0]) == {"a": 1}  # the input is not modified
