"""The Streamlit runs browser renders a real run from the store, headless (AppTest)."""

from streamlit.testing.v1 import AppTest

from workbench.paths import REPO_ROOT
from workbench.results import ResultsStore


def test_app_shows_runs_and_layer_curve(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path))
    store = ResultsStore(tmp_path)
    with store.start_run("probe", {"probe": "syntax"}, name="app-test") as run:
        run.add([{"model": "m", "probe": "syntax", "task": "upos", "split": "dev", "stack": "encoder",
                  "layer": layer, "metric": "accuracy", "value": 0.5 + 0.1 * layer, "n": 100,
                  "ci_low": 0.45 + 0.1 * layer, "ci_high": 0.55 + 0.1 * layer} for layer in range(3)])
    app = AppTest.from_file(str(REPO_ROOT / "app" / "streamlit_app.py"), default_timeout=60).run()
    assert not app.exception
    assert app.selectbox[0].value == store.runs()["run_id"].iloc[0]
    assert app.selectbox[1].value == "upos" and app.selectbox[2].value == "accuracy"
    table = app.dataframe[-1].value
    assert table["value"].round(3).tolist() == [0.5, 0.6, 0.7]


def test_app_on_an_empty_store_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path))
    app = AppTest.from_file(str(REPO_ROOT / "app" / "streamlit_app.py"), default_timeout=60).run()
    assert not app.exception
    assert "bertology run experiments/main.yaml" in app.info[0].value
