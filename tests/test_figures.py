"""`bertology figures`: every shipped figure renders from a store of real probe rows to PNG, SVG, PDF
and HTML with a manifest, draws exactly the store's numbers, and two renders give identical data."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from app.cli import main
from app.figures import figure_names, load_spec, render
from workbench.errors import ConfigError


@pytest.mark.slow
def test_every_shipped_figure_renders_with_manifest(probe_store, tmp_path):
    assert set(figure_names()) >= {"syntax_layer_curves", "syntax_depth_summary", "training_time_heatmap"}
    for name in figure_names():
        spec = load_spec(name)[1]
        if spec["query"].get("probe") != "syntax" or "name" in spec["query"]:
            continue  # other probes' figures are tested beside them, the sweep figure with the sweep
        r = render(name, probe_store, tmp_path / name)
        heads = {p.suffix: p.read_bytes()[:8] for p in r.files}
        assert heads[".png"].startswith(b"\x89PNG") and heads[".pdf"].startswith(b"%PDF")
        assert b"<svg" in (r.folder / f"{name}.svg").read_bytes()[:400]
        assert "plotly" in (r.folder / f"{name}.html").read_text()[:5000].lower()
        m = json.loads((r.folder / "manifest.json").read_text())
        assert m["run_ids"] and m["spec"] == spec and m["n_points"] > 0
        assert len(m["data_sha256"]) == 64


def test_layer_curve_data_are_the_store_rows_and_reproducible(probe_store, tmp_path):
    a = render("syntax_layer_curves", probe_store, tmp_path / "a", formats=("html",))
    b = render("syntax_layer_curves", probe_store, tmp_path / "b", formats=("html",))
    assert (a.folder / "data.csv").read_bytes() == (b.folder / "data.csv").read_bytes()
    assert a.manifest["data_sha256"] == b.manifest["data_sha256"]
    data = pd.read_csv(a.folder / "data.csv")
    (run_id,) = a.manifest["run_ids"]
    rows = probe_store.read(run_id)
    want = rows[(rows["task"] == "upos") & (rows["metric"] == "accuracy")].sort_values(["model", "layer"])
    got = data[(data["task"] == "upos") & (data["metric"] == "accuracy")].sort_values(["model", "layer"])
    assert got["value"].round(8).tolist() == want["value"].round(8).tolist()
    assert set(got["kind"]) == {"model", "random_init"}
    # baselines are drawn by the name their rows declare (extra.baseline, probes/syntax/)
    assert {"baseline:majority", "baseline:control", "baseline:right_branching"} <= set(data["kind"])


def test_training_heatmap_is_steps_by_layers(probe_store, tmp_path):
    r = render("training_time_heatmap", probe_store, tmp_path, formats=("html",))
    # `run: latest` is the one-checkpoint run: a heatmap of one step; the sweep over steps is earlier
    data = pd.read_csv(r.folder / "data.csv")
    assert sorted(set(data["step"])) == [10] and sorted(set(data["layer"])) == [0, 1, 2]
    runs = probe_store.runs()
    over_steps = runs[runs["name"] == "over-steps"]["run_id"].iloc[0]
    spec = tmp_path / "h.yaml"
    spec.write_text(f"title: t\nquery: {{probe: syntax, tasks: [upos], metrics: [accuracy], run: {over_steps}, "
                    f"twins: false, split: dev}}\nplot: training_heatmap\noptions: {{task: upos}}\n")
    r = render(spec, probe_store, tmp_path / "h", formats=("html",))
    data = pd.read_csv(r.folder / "data.csv")
    assert sorted(set(data["step"])) == [0, 10] and len(data) == 6


def test_uuas_heatmap_draws_the_stored_uuas_of_each_layer(probe_store, tmp_path):
    r = render("training_time_heatmap_uuas", probe_store, tmp_path, formats=("html",))
    data = pd.read_csv(r.folder / "data.csv").sort_values("layer")
    (run_id,) = r.manifest["run_ids"]
    rows = probe_store.read(run_id)
    want = rows[(rows["task"] == "structural-distance") & (rows["metric"] == "uuas") & rows["layer"].notna()
                & ~rows["model"].str.contains("random init", case=False)].sort_values("layer")
    assert set(data["metric"]) == {"uuas"} and data["layer"].tolist() == [0, 1, 2]
    assert data["value"].round(8).tolist() == want["value"].round(8).tolist()


def test_depth_summary_expected_layer_matches_hand_computation(probe_store, tmp_path):
    from app.figures import expected_layers

    df = pd.DataFrame({"model": "m", "task": "t", "metric": "accuracy", "layer": [0, 1, 2, 3],
                       "value": [0.5, 0.7, 0.65, 0.8]})
    # deltas: +0.2 (l=1), -0.05 -> 0 (l=2), +0.15 (l=3): E = (1*0.2 + 3*0.15) / 0.35
    assert expected_layers(df)["value"].iloc[0] == pytest.approx((0.2 + 0.45) / 0.35)
    r = render("syntax_depth_summary", probe_store, tmp_path, formats=("html",))
    data = pd.read_csv(r.folder / "data.csv")
    assert set(data["task"]) == {"upos", "structural-distance"}
    # NaN where no layer improves on the one below (all deltas <= 0): nothing to place in depth
    assert data["value"].dropna().between(0, 2).all() and data["value"].notna().any()


def test_figure_cli_errors_and_all(probe_store, tmp_path, capsys):
    assert main(["figures", "no_such_figure", "--runs-root", str(probe_store.root)]) == 2
    assert "no such figure" in capsys.readouterr().err
    assert main(["figures", "syntax_layer_curves", "--runs-root", str(tmp_path / "empty")]) == 2
    assert "no run in" in capsys.readouterr().err
    bad = tmp_path / "bad.yaml"
    bad.write_text("title: x\nplot: pie\n")
    with pytest.raises(ConfigError, match="plot must be one of"):
        load_spec(bad)


def test_sweep_curves_split_by_setting_and_average_seeds():
    from app.data import aggregate_seeds

    def row(model, pooling, seed, layer, value):
        return {"model": model, "task": "upos", "metric": "accuracy", "stack": "encoder", "layer": layer, "step": 5,
                "value": value, "ci_low": value - 0.01, "ci_high": value + 0.01, "split": "dev", "run_id": f"r{seed}",
                "extra": json.dumps({"pooling": pooling, "probe_seed": seed})}

    rows = pd.DataFrame([row("m", p, s, l, 0.5 + 0.1 * l + (0.02 if s else 0) + (0.1 if p == "mean" else 0))
                         for p in ("first", "mean") for s in (0, 1) for l in (0, 1)])
    out = aggregate_seeds(rows, ["pooling"]).sort_values(["model", "layer"])
    assert out["model"].tolist() == ["m | pooling=first"] * 2 + ["m | pooling=mean"] * 2
    assert out["value"].round(6).tolist() == [0.51, 0.61, 0.61, 0.71]
    assert out["ci_low"].round(6).tolist() == [0.5, 0.6, 0.6, 0.7]  # the spread over seeds
    assert out["ci_high"].round(6).tolist() == [0.52, 0.62, 0.62, 0.72] and set(out["n_seeds"]) == {2}


@pytest.mark.slow
def test_probe_a_training_folder_and_draw_its_heatmap_in_one_command(probe_store, tmp_path, capsys):
    train = probe_store.root.parent / "train" / "tinyrun" / "seed-0"
    runs = tmp_path / "runs"
    code = main(["probe", "syntax", "--checkpoint", str(train), "--tasks", "upos", "--max-train-sentences", "60",
                 "--max-eval-sentences", "30", "--baselines", "majority", "--mdl-tasks", "", "--scalar-mix-tasks", "",
                 "--n-boot", "20", "--runs-root", str(runs), "--cache-dir", str(tmp_path / "cache"), "--quiet",
                 "--figures", "training_time_heatmap"])
    out = capsys.readouterr().out
    assert code == 0, out
    (folder,) = (runs / "figures").iterdir()
    data = pd.read_csv(folder / "data.csv")
    assert sorted(set(data["step"])) == [0, 10] and sorted(set(data["layer"])) == [0, 1, 2]
    assert (folder / "training_time_heatmap.png").read_bytes()[:4] == b"\x89PNG"
    assert f"figure training_time_heatmap: {folder}" in out


# Fake exporters that hang: nothing here waits on the clock. The real timeout runs only once the fake
# child has written its ready file (`_wait_until_written`, which stops waiting when the child dies
# instead), so it surely expires on a child that never finishes, however slow the machine; and the
# assertions are about processes and files, never elapsed time.
_SLEEP_FOREVER = "while True: time.sleep(3600)"


def _wait_until_written(path, proc) -> None:
    """Wait for the fake child `proc` to write `path`; fail (not hang) if it exits first."""
    import time

    while not path.exists():
        assert proc.poll() is None, f"the fake exporter exited ({proc.returncode}) before writing {path}"
        time.sleep(0.05)


def _communicate_once_written(monkeypatch, path, then=None):
    """Swap subprocess.Popen for one whose communicate() first waits until the child wrote `path`,
    then calls `then(proc)` (e.g. raise an interrupt) or the real communicate with its timeout."""
    import subprocess

    class WaitsForTheChild(subprocess.Popen):
        def communicate(self, input=None, timeout=None):
            _wait_until_written(path, self)
            if then is not None:
                then(self)
            return super().communicate(input, timeout)

    monkeypatch.setattr(subprocess, "Popen", WaitsForTheChild)


def _gone(pid: int) -> bool:
    """Exited, or a zombie (dead, waiting for init to reap it: an orphan is not ours to reap)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _kill_leftovers(pids: list[int]) -> list[int]:
    """The pids still running; SIGKILLed so that a failing test leaves nothing behind."""
    import os
    import signal

    alive = [p for p in pids if not _gone(p)]
    for p in alive:
        os.kill(p, signal.SIGKILL)
    return alive


@pytest.mark.slow
def test_a_hung_static_export_is_killed_and_the_figure_falls_back_to_html(probe_store, tmp_path, monkeypatch, capsys):
    """The exporter swapped for one that starts writing a PNG and then sleeps forever: at the
    timeout it is killed, the figure folder holds data.csv, the HTML and the manifest (no image, no
    part of one, and not the earlier render's PNG), and the manifest lists exactly those files and
    says why."""
    import os
    import sys

    from app import figures

    name, folder = "syntax_layer_curves", tmp_path / "fig"
    before = render(name, probe_store, folder, formats=("png", "html"))
    assert (folder / f"{name}.png").read_bytes().startswith(b"\x89PNG")
    seen = tmp_path / "child.txt"
    hang = ("import os, sys, time, pathlib; pathlib.Path(sys.argv[2], 'figure.png').write_bytes(b'half');"
            f"tmp = pathlib.Path({str(seen)!r} + '.tmp'); tmp.write_text(f'{{os.getpid()}} {{sys.argv[2]}}');"
            f"tmp.rename({str(seen)!r})\n{_SLEEP_FOREVER}")
    monkeypatch.setattr(figures, "_export_command", lambda spec, out, fmts: [sys.executable, "-c", hang, str(spec),
                                                                             str(out), *fmts])
    _communicate_once_written(monkeypatch, seen)
    monkeypatch.setenv(figures.EXPORT_TIMEOUT_ENV, "0.5")
    r = render(name, probe_store, folder, formats=("png", "svg"))
    pid, tmp = seen.read_text().split(" ", 1)
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid), 0)  # killed (and reaped)
    assert not os.path.exists(tmp)  # its half-written image went with its private folder
    assert sorted(p.name for p in folder.iterdir()) == ["data.csv", "manifest.json", f"{name}.html"]
    m = json.loads((folder / "manifest.json").read_text())
    assert m == r.manifest and m["files"] == ["data.csv", f"{name}.html"]
    assert len(m["warnings"]) == 1 and "(png, svg) did not finish within 0.5 s" in m["warnings"][0]
    assert f"warning: figure {name}: static export" in capsys.readouterr().err
    assert m["data_sha256"] == before.manifest["data_sha256"]
    with pytest.raises(ConfigError, match="positive number of seconds"):
        render(name, probe_store, folder, timeout=0)


# A stand-in for kaleido: the child starts a "Chromium" in a session of its own (as choreographer
# starts it), records both pids and hangs, as does its Chromium.
_HANGS_WITH_CHROMIUM = (
    "import os, pathlib, subprocess, sys, time\n"
    f"chromium = subprocess.Popen([sys.executable, '-c', 'import time\\n{_SLEEP_FOREVER}'], start_new_session=True)\n"
    "tmp = pathlib.Path(sys.argv[1]).with_name('pids.tmp'); tmp.write_text(f'{os.getpid()} {chromium.pid}')\n"
    "tmp.rename(tmp.with_suffix('.txt'))\n"
    f"{_SLEEP_FOREVER}")


def _hung_export_with_chromium(folder, monkeypatch, then=None):
    """Swap the exporter for `_HANGS_WITH_CHROMIUM`; returns the file its two pids are written to."""
    import sys

    from app import figures

    monkeypatch.setattr(figures, "_export_command",
                        lambda spec, out, fmts: [sys.executable, "-c", _HANGS_WITH_CHROMIUM, str(folder / "x")])
    _communicate_once_written(monkeypatch, folder / "pids.txt", then)
    return folder / "pids.txt"


def test_a_timed_out_export_also_kills_the_chromium_in_its_own_session(tmp_path, monkeypatch):
    """Kaleido's Chromium runs in a session of its own, out of the child's process group: on a
    timeout it is killed with the child all the same (found as the child's descendant), and the
    export returns instead of waiting for the orphan to close the pipes it inherited."""
    import plotly.graph_objects as go

    from app.figures import static_images

    pids_file = _hung_export_with_chromium(tmp_path, monkeypatch)
    assert static_images(go.Figure(), ["png"], 0.5) is None
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2 and not _kill_leftovers(pids)


def test_an_interrupted_export_kills_the_child_and_its_chromium(tmp_path, monkeypatch):
    """Ctrl-C (or any exception) while waiting for the export: the child and its Chromium go too."""
    import plotly.graph_objects as go

    from app.figures import static_images

    def interrupt(proc):
        raise KeyboardInterrupt

    pids_file = _hung_export_with_chromium(tmp_path, monkeypatch, then=interrupt)
    with pytest.raises(KeyboardInterrupt):
        static_images(go.Figure(), ["png"], 600)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 2 and not _kill_leftovers(pids)


def test_kill_tree_kills_what_ignores_sigterm(tmp_path):
    """A descendant that ignores SIGTERM is SIGKILLed after the grace period."""
    import subprocess
    import sys

    from app.figures import _kill_tree

    ready = tmp_path / "ready"
    stubborn = ("import os, pathlib, signal, subprocess, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                f"kid = subprocess.Popen([sys.executable, '-c', 'import signal, time\\n"
                f"signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n{_SLEEP_FOREVER}'])\n"
                f"pathlib.Path({str(ready)!r} + '.tmp').write_text(f'{{os.getpid()}} {{kid.pid}}')\n"
                f"os.rename({str(ready)!r} + '.tmp', {str(ready)!r})\n{_SLEEP_FOREVER}")
    proc = subprocess.Popen([sys.executable, "-c", stubborn], start_new_session=True)
    _wait_until_written(ready, proc)
    pids = [int(p) for p in ready.read_text().split()]
    _kill_tree(proc, grace=0.2)
    assert proc.returncode is not None
    assert not _kill_leftovers(pids)


def test_a_failed_static_export_leaves_the_earlier_render_as_it_was(probe_store, tmp_path, monkeypatch):
    """The export fails after the figure is drawn: the folder keeps the earlier render's data.csv,
    images and manifest byte for byte (no new data.csv beside old images and a stale manifest)."""
    import sys

    from app import figures
    from workbench.errors import WorkbenchError

    writes = ("import pathlib, sys; [pathlib.Path(sys.argv[2], 'figure.' + f).write_bytes(b'old ' + f.encode())"
              " for f in sys.argv[3:]]")
    monkeypatch.setattr(figures, "_export_command", lambda spec, out, fmts: [sys.executable, "-c", writes, str(spec),
                                                                             str(out), *fmts])
    name, folder = "syntax_layer_curves", tmp_path / "fig"
    render(name, probe_store, folder, formats=("png", "html"))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert sorted(before) == ["data.csv", "manifest.json", f"{name}.html", f"{name}.png"]
    (folder / "data.csv").write_text("an earlier store's numbers\n")  # the new render would change it
    (folder / "manifest.json").write_text('{"data_sha256": "of those numbers"}\n')
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    monkeypatch.setattr(figures, "_export_command", lambda spec, out, fmts: [sys.executable, "-c",
                                                                             "import sys; sys.exit('kaleido broke')"])
    with pytest.raises(WorkbenchError, match="kaleido broke"):
        render(name, probe_store, folder, formats=("png", "html"))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
