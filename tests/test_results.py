"""Results store: round trip with provenance, concurrent writer processes, crashes, validation."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow
import pytest

from workbench.errors import CheckpointError, ConfigError
from workbench.io import sha256_files
from workbench.store.manifest import checkpoint_record, git_state
from workbench.paths import REPO_ROOT, data_path
from workbench.store.results import (
    DTYPES,
    RESULT_COLUMNS,
    ResultsError,
    ResultsStore,
    RunNotFoundError,
    decode_extra,
    format_manifest,
    format_rows,
    format_runs,
)


def _rows(probe="syntax", task="upos", layers=range(3)):
    return [
        {"model": "tiny-bert", "family": "bert", "seed": 0, "step": 1000, "probe": probe, "task": task,
         "split": "dev", "stack": "encoder", "layer": layer, "metric": "accuracy", "value": 0.5 + 0.1 * layer,
         "n": 2001, "ci_low": 0.45 + 0.1 * layer, "ci_high": 0.55 + 0.1 * layer, "extra": {"n_train": 3}}
        for layer in layers
    ]  # fmt: skip


def _subprocess(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    """Until `proc` writes `path`; fails when it exits first (no deadline: pytest-timeout stops a hang)."""
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        time.sleep(0.02)


def _hidden(store: ResultsStore) -> list[str]:
    return sorted(p.name for p in store.results_dir.iterdir() if p.name.startswith(".") and p.name != ".writers")


def test_round_trip_rows_and_manifest(tmp_path):
    gap = data_path("gap", "gap-development.tsv")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    from safetensors.numpy import save_file

    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text("{}")  # not a weight file: must not enter the hash

    store = ResultsStore(tmp_path / "runs")
    frame = pd.DataFrame({
        "model": ["tiny-bert", "tiny-bert", None], "family": ["bert", "bert", "bert"], "seed": [0, 1, 2],
        "step": [None, 500, 1000], "probe": ["syntax"] * 3, "task": ["upos", "upos", "deprel"],
        "split": ["dev", "test", "dev"], "layer": [0, 1, 2], "metric": ["accuracy", "accuracy", "uuas"],
        "value": [0.25, float("nan"), 0.875], "n": [2001, 2077, None],
        "extra": [{"lr_decay": 0.5, "n_train": 10}, None, '{"boot": [1, 2]}'],
    })  # fmt: skip
    config = {"probe": "syntax", "tasks": ["upos", "deprel"], "lr": 0.001, "path": str(gap)}
    with store.start_run("probe", config, seeds=[0, 1, 2], data_files=[gap],
                         checkpoints=[ckpt, (tmp_path / "other", "ab" * 32)], name="upos-sweep") as run:  # fmt: skip
        assert run.add(frame) == 3
        run.note("fit_seconds", 12.5)
        run.note("stats", {"truncated": 0, "windows": 3})
        assert store.runs().empty  # not visible before finish
    run_id = run.run_id

    expected = pd.DataFrame({
        "run_id": [run_id] * 3, "model": ["tiny-bert", "tiny-bert", pd.NA], "family": ["bert"] * 3,
        "seed": [0, 1, 2], "step": [pd.NA, 500, 1000], "probe": ["syntax"] * 3, "task": ["upos", "upos", "deprel"],
        "split": ["dev", "test", "dev"], "stack": [pd.NA] * 3, "layer": [0, 1, 2],
        "metric": ["accuracy", "accuracy", "uuas"], "value": [0.25, np.nan, 0.875], "n": [2001, 2077, pd.NA],
        "ci_low": [np.nan] * 3, "ci_high": [np.nan] * 3,
        "extra": ['{"lr_decay": 0.5, "n_train": 10}', pd.NA, '{"boot": [1, 2]}'],
    }).astype(DTYPES)  # fmt: skip
    got = store.read(run_id)
    assert list(got.columns) == RESULT_COLUMNS
    pd.testing.assert_frame_equal(got, expected)
    assert json.loads(got["extra"][0]) == {"lr_decay": 0.5, "n_train": 10}
    # how every reader gets `extra` back: a dict per row, {} where there is none
    assert [decode_extra(e) for e in got["extra"]] == [{"lr_decay": 0.5, "n_train": 10}, {}, {"boot": [1, 2]}]
    assert [decode_extra(e) for e in ({"a": 1}, "", None, float("nan"), "[1, 2]", "{not json")] == [{"a": 1}, {}, {}, {}, {}, {}]

    m = store.manifest(run_id)
    assert (m["run_id"], m["kind"], m["name"], m["status"]) == (run_id, "probe", "upos-sweep", "finished")
    assert m["n_rows"] == 3 and "started" not in m
    assert m["config"] == config
    assert m["seeds"] == [0, 1, 2]
    assert m["notes"] == {"fit_seconds": 12.5, "stats": {"truncated": 0, "windows": 3}}
    assert m["created"] <= m["finished"] and m["created"].endswith("+00:00")
    assert m["packages"]["numpy"] == np.__version__ and m["packages"]["pandas"] == pd.__version__
    assert m["packages"]["pyarrow"] == pyarrow.__version__
    for pkg in ("torch", "transformers", "tokenizers", "scikit-learn"):
        assert m["packages"][pkg], pkg
    assert m["environment"]["hostname"] == socket.gethostname()
    assert m["environment"]["python"] == ".".join(map(str, sys.version_info[:3]))
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode == 0:
        assert m["git"]["commit"] == head.stdout.strip() and isinstance(m["git"]["dirty"], bool)
    else:
        assert m["git"] is None
    [df] = m["data_files"]
    assert df["sha256"] == hashlib.sha256(gap.read_bytes()).hexdigest()
    assert df["data_relpath"] == "gap/gap-development.tsv" and df["bytes"] == gap.stat().st_size
    c1, c2 = m["checkpoints"]
    assert c1["sha256"] == sha256_files([ckpt / "model.safetensors"], root=ckpt)
    assert c1["sha256"] != hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    assert c2 == {"path": str((tmp_path / "other").resolve()), "sha256": "ab" * 32}

    cat = store.runs()
    assert len(cat) == 1
    r = cat.iloc[0]
    assert (r.run_id, r.kind, r["name"], r.status, r.n_rows) == (run_id, "probe", "upos-sweep", "finished", 3)
    assert (r.models, r.probes, r.tasks) == ("tiny-bert", "syntax", "deprel, upos")
    assert Path(r.path) == store.results_dir / run_id
    text = format_manifest(m)
    assert run_id in text and "gap/gap-development.tsv" in text and "fit_seconds" in text


def test_query_filters_across_runs(tmp_path):
    store = ResultsStore(tmp_path)
    with store.start_run("probe", {}) as a:
        a.add(_rows("syntax", "upos", range(4)))
    with store.start_run("probe", {}) as b:
        b.add(_rows("syntax", "deprel", range(4)) + _rows("coref", "gap", range(2)))
    assert a.run_id < b.run_id  # ids sort by creation time

    everything = store.query()
    assert len(everything) == 10 and list(everything.columns) == RESULT_COLUMNS
    assert everything["run_id"].tolist() == [a.run_id] * 4 + [b.run_id] * 6
    assert everything.dtypes.to_dict() == DTYPES
    q = store.query(probe="syntax", layer=3)
    assert sorted(q["task"]) == ["deprel", "upos"] and q["value"].round(6).tolist() == [0.8, 0.8]
    q = store.query(task=["gap", "upos"], layer=(0, 1))
    assert sorted(zip(q["task"], q["layer"])) == [("gap", 0), ("gap", 1), ("upos", 0), ("upos", 1)]
    assert store.query(run_id=a.run_id, layer=2)["task"].tolist() == ["upos"]
    assert len(store.query(stack=None)) == 0 and len(store.query(stack="encoder")) == 10
    empty = store.query(probe="nope")
    assert empty.empty and empty.dtypes.to_dict() == DTYPES
    assert store.runs(probe="coref")["run_id"].tolist() == [b.run_id]
    assert store.runs(task=["upos", "gap"])["run_id"].tolist() == [a.run_id, b.run_id]
    out = format_rows(store.read(b.run_id))
    assert f"run {b.run_id}, 6 rows" in out and "0.8" in out and "coref" in out
    listing = format_runs(store.runs())
    assert a.run_id in listing and b.run_id in listing and "finished" in listing

    store.delete(a.run_id)
    assert store.runs()["run_id"].tolist() == [b.run_id]
    assert len(store.query()) == 6
    with pytest.raises(RunNotFoundError, match="no run"):
        store.read(a.run_id)
    with pytest.raises(RunNotFoundError):
        store.delete(a.run_id)


def test_validation_errors_are_clear(tmp_path):
    store = ResultsStore(tmp_path)
    run = store.start_run("probe", {"x": 1})
    good = _rows()[0]
    with pytest.raises(ResultsError, match=r"lack required column\(s\) \['metric'\]"):
        run.add([{k: v for k, v in good.items() if k != "metric"}])
    with pytest.raises(ResultsError, match=r"unknown result column\(s\) \['accuracy_std'\].*`extra`"):
        run.add([{**good, "accuracy_std": 0.1}])
    with pytest.raises(ResultsError, match=r"row 1 given to add\(\) has no 'probe'"):
        run.add([good, {k: v for k, v in good.items() if k != "probe"}])
    with pytest.raises(ResultsError, match=r"value=None"):
        run.add([{**good, "value": None}])
    with pytest.raises(ResultsError, match=r"column 'value', row 0: expected a number, got str"):
        run.add([{**good, "value": "0.5"}])
    with pytest.raises(ResultsError, match=r"column 'layer', row 0: expected an integer, got 2.5"):
        run.add([{**good, "layer": 2.5}])
    with pytest.raises(ResultsError, match=r"column 'layer', row 0: must be >= 0"):
        run.add([{**good, "layer": -1}])
    with pytest.raises(ResultsError, match=r"column 'split', row 0: expected a string, got int"):
        run.add([{**good, "split": 1}])
    with pytest.raises(ResultsError, match=r"column 'extra', row 0: a string must be JSON"):
        run.add([{**good, "extra": "control=0.3"}])
    with pytest.raises(ResultsError, match=r"column 'extra', row 0 cannot be stored as JSON"):
        run.add([{**good, "extra": {"f": object()}}])
    with pytest.raises(ResultsError, match=r"the store assigns run_id"):
        run.add([{**good, "run_id": "someone-else"}])
    with pytest.raises(ResultsError, match=r"not a single dict"):
        run.add(good)
    with pytest.raises(ResultsError, match=r"row 0 has an empty 'task'|has an empty 'task'"):
        run.add(pd.DataFrame([{**good, "task": ""}]))
    with pytest.raises(ResultsError, match=r"note 'obj' cannot be stored as JSON"):
        run.note("obj", object())
    assert run.n_rows == 0  # nothing half-added
    assert run.add(pd.DataFrame([good])) == 1
    run.finish()
    with pytest.raises(ResultsError, match="already finished"):
        run.add([good])
    assert len(store.read(run.run_id)) == 1
    with pytest.raises(ResultsError, match=r"unknown query\(\) filter 'accuracy'"):
        store.query(accuracy=1)
    with pytest.raises(ResultsError, match="layer holds integers"):
        store.query(layer="3")
    with pytest.raises(ResultsError, match="unknown runs"):
        store.runs(colour="red")
    with pytest.raises(ConfigError, match="config must be a dict"):
        store.start_run("probe", ["not", "a", "dict"])
    with pytest.raises(ConfigError, match="run config cannot be stored as JSON"):
        store.start_run("probe", {"model": object()})
    with pytest.raises(CheckpointError, match="no weight files"):
        store.start_run("probe", {}, checkpoints=[tmp_path])
    with pytest.raises(RunNotFoundError, match="not a run id"):
        store.read("../etc")


def test_exception_inside_run_publishes_nothing(tmp_path):
    store = ResultsStore(tmp_path)
    with pytest.raises(RuntimeError, match="probe diverged"):
        with store.start_run("probe", {}) as run:
            run.add(_rows())
            raise RuntimeError("probe diverged")
    assert store.runs().empty and store.query().empty
    assert _hidden(store) == [] and list(store.writers_dir.iterdir()) == []


WRITER = """
import sys, time
from pathlib import Path
from workbench.store.results import ResultsStore
root, writer, go = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
store = ResultsStore(root)
Path(f"{go}.ready{writer}").touch()
while not go.exists():
    time.sleep(0.005)
for r in range(10):
    with store.start_run("probe", {"writer": writer, "run": r}, seeds=[writer]) as run:
        run.add([{"model": f"m{writer}", "probe": "stress", "task": f"t{r}", "metric": "id",
                  "value": float(writer * 10000 + r * 100 + i), "layer": i % 5, "seed": writer}
                 for i in range(100)])
    print(run.run_id)
"""


def test_two_concurrent_writer_processes(tmp_path):
    root, go = tmp_path / "runs", tmp_path / "go"
    ResultsStore(root)  # create the catalog once so both start from the same state
    procs = [_subprocess(WRITER, str(root), str(w), str(go)) for w in (1, 2)]
    for w, p in zip((1, 2), procs):  # both imported and opened the store: release them together
        _wait_for(Path(f"{go}.ready{w}"), p)
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    printed = [line for out, _ in outs for line in out.split()]
    assert len(printed) == 20 == len(set(printed))

    store = ResultsStore(root)
    rows = store.query()
    assert len(rows) == 2000
    expected = {float(w * 10000 + r * 100 + i) for w in (1, 2) for r in range(10) for i in range(100)}
    assert set(rows["value"]) == expected
    assert rows.groupby("run_id").size().eq(100).all()
    cat = store.runs()
    assert sorted(cat["run_id"]) == sorted(printed) and (cat["status"] == "finished").all()
    assert cat["n_rows"].tolist() == [100] * 20
    spans = {}
    for rid in cat["run_id"]:
        m = store.manifest(rid)
        lo, hi = spans.get(m["config"]["writer"], (m["created"], m["finished"]))
        spans[m["config"]["writer"]] = (min(lo, m["created"]), max(hi, m["finished"]))
    assert spans[1][0] < spans[2][1] and spans[2][0] < spans[1][1]  # the writers really overlapped
    with sqlite3.connect(root / "catalog.sqlite") as con:  # the catalog itself, not a repaired view
        counts = con.execute("SELECT COUNT(*), COUNT(DISTINCT run_id) FROM runs WHERE status='finished'").fetchone()
        assert counts == (20, 20)
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert len(store.query(model="m2", layer=4)) == 200
    assert _hidden(store) == [] and list(store.writers_dir.iterdir()) == []


CRASH_BEFORE_RENAME = """
import sys, time
from pathlib import Path
from workbench.store import results
from workbench.io import atomic_write_text
root, ready = sys.argv[1], Path(sys.argv[2])
def hook(tmp):
    atomic_write_text(ready, str(tmp))  # atomic: the test reads the path as soon as the file exists
    while True:  # until the test kills it, however long its checks take
        time.sleep(3600)
results._before_publish = hook
store = results.ResultsStore(root)
with store.start_run("probe", {"doomed": True}) as run:
    run.add([{"probe": "syntax", "task": "upos", "metric": "acc", "value": float(i), "layer": i} for i in range(500)])
"""


def test_crash_mid_write_leaves_no_visible_run(tmp_path):
    root, ready = tmp_path / "runs", tmp_path / "ready"
    store = ResultsStore(root)
    proc = _subprocess(CRASH_BEFORE_RENAME, str(root), str(ready))
    _wait_for(ready, proc)
    tmp_dir = Path(ready.read_text())
    # fully written, not yet renamed into place
    assert (tmp_dir / "rows.parquet").is_file() and (tmp_dir / "manifest.json").is_file()
    assert store.runs(include_running=True)["status"].tolist() == ["running"]
    assert store.gc() == []  # a live writer's temp folder is kept
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    for s in (store, ResultsStore(root)):
        assert s.runs().empty and s.runs(include_running=True).empty
        assert s.query().empty
    assert _hidden(store) == [tmp_dir.name]

    with store.start_run("probe", {}) as run:
        run.add(_rows())
    assert store.runs()["run_id"].tolist() == [run.run_id] and len(store.query()) == 3

    removed = store.gc()
    assert tmp_dir in removed and len(removed) == 2  # the temp folder and the dead writer's lock file
    assert _hidden(store) == [] and list(store.writers_dir.iterdir()) == []
    assert len(store.read(run.run_id)) == 3


CRASH_AFTER_RENAME = """
import os, signal, sys
from workbench.store import results
results.ResultsStore._register = lambda self, manifest: os.kill(os.getpid(), signal.SIGKILL)
store = results.ResultsStore(sys.argv[1])
with store.start_run("probe", {}, name="orphan") as run:
    run.add([{"probe": "syntax", "task": "upos", "metric": "acc", "value": 0.75, "layer": 2}])
"""


def test_catalog_is_repaired_from_the_folders(tmp_path):
    root = tmp_path / "runs"
    proc = _subprocess(CRASH_AFTER_RENAME, str(root))
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL  # died between rename and catalog insert
    with sqlite3.connect(root / "catalog.sqlite") as con:
        assert con.execute("SELECT COUNT(*) FROM runs").fetchone() == (0,)

    store = ResultsStore(root)  # repaired on open: the folder is the truth
    cat = store.runs()
    assert cat["name"].tolist() == ["orphan"] and cat["status"].tolist() == ["finished"]
    assert store.query(layer=2)["value"].tolist() == [0.75]
    with sqlite3.connect(root / "catalog.sqlite") as con:
        assert con.execute("SELECT name, n_rows FROM runs").fetchall() == [("orphan", 1)]

    with store.start_run("probe", {}, name="second") as run:
        run.add(_rows())
    (root / "catalog.sqlite").unlink()
    for suffix in ("-wal", "-shm"):
        (root / f"catalog.sqlite{suffix}").unlink(missing_ok=True)
    store = ResultsStore(root)
    assert store.runs()["name"].tolist() == ["orphan", "second"]
    assert store.reindex() == 2

    import shutil

    shutil.rmtree(store.results_dir / run.run_id)  # removed by hand: dropped from the catalog
    assert store.runs()["name"].tolist() == ["orphan"]


def test_manifest_helpers(tmp_path):
    assert git_state(tmp_path) is None  # not a checkout

    class Handle:
        path = None
        checkpoint_hash = "cd" * 32
        family = "bert"

    assert checkpoint_record(Handle()) == {"path": None, "sha256": "cd" * 32, "family": "bert"}
    weights = tmp_path / "pytorch_model.bin"
    weights.write_bytes(b"\x00\x01weights")
    assert checkpoint_record(weights)["sha256"] == hashlib.sha256(b"\x00\x01weights").hexdigest()
    with pytest.raises(CheckpointError, match="does not exist"):
        checkpoint_record(tmp_path / "missing")


def test_finished_units_discard_leaves_a_concurrent_runs_units(tmp_path):
    """Two runs of one sweep that differ only in their models share a partials folder and may run
    at once (submitit); the first to publish removes its own units, not the folder under the other."""
    from workbench.store.results import FinishedUnits

    store = ResultsStore(tmp_path)
    rows = pd.DataFrame([{"model": "m", "probe": "linear", "task": "upos", "layer": 0, "metric": "accuracy",
                          "value": 0.5, "n": 4}])
    first, second = (FinishedUnits(store, "syntax", {"seed": 0}) for _ in range(2))
    assert first.folder == second.folder
    first.save("tiny-0|encoder|upos", rows)
    second.save("tiny-1|encoder|upos", rows)
    first.discard()
    assert first.load("tiny-0|encoder|upos") is None
    assert second.load("tiny-1|encoder|upos")["value"].tolist() == [0.5]
    second.save("tiny-1|encoder|xpos", rows)  # still writable: the folder was not removed under it
    second.discard()
    assert not second.folder.exists()


def test_finished_units_round_trip_key_and_gc(tmp_path):
    from workbench.store.results import FinishedUnits

    store = ResultsStore(tmp_path)
    rows = [{"model": "m", "probe": "linear", "task": "upos", "layer": 2, "metric": "accuracy", "value": 0.75,
             "n": 10, "extra": {"a": 1}}]
    units = FinishedUnits(store, "syntax", {"tasks": ["upos"], "seed": 0})
    assert units.load("m|encoder|upos") is None
    units.save("m|encoder|upos", [pd.DataFrame(rows)])
    back = FinishedUnits(store, "syntax", {"seed": 0, "tasks": ["upos"]}).load("m|encoder|upos")  # same settings
    assert back["value"].tolist() == [0.75] and back["layer"].tolist() == [2] and json.loads(back["extra"][0]) == {"a": 1}
    assert FinishedUnits(store, "syntax", {"tasks": ["upos"], "seed": 1}).load("m|encoder|upos") is None
    # a damaged file is recomputed, with a warning
    next(units.folder.glob("*.parquet")).write_bytes(b"not parquet")
    with pytest.warns(UserWarning, match="unreadable saved unit"):
        assert units.load("m|encoder|upos") is None
    # gc removes saved units untouched for the age limit, keeps recent ones
    fresh = FinishedUnits(store, "syntax", {"seed": 2})
    fresh.save("u", [pd.DataFrame(rows)])
    old = time.time() - 40 * 86400
    for f in [units.folder, *units.folder.iterdir()]:
        os.utime(f, (old, old))
    removed = store.gc()
    assert units.folder in removed and not units.folder.exists() and fresh.folder.exists()
