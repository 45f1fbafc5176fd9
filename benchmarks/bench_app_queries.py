"""Dashboard queries on a big results store: the runs page (catalog + facets + health) and the
layer-curve query of one probe/task, at 100 and 1,000 runs of 5,000 rows each.

    .venv/bin/python benchmarks/bench_app_queries.py [--root /tmp/bench-store] [--runs 100,1000]

The store is generated in the store's own layout (results/<run_id>/{rows.parquet,manifest.json},
rows with the real schema) and registered by `ResultsStore` itself (its catalog sync), which is
much faster than 1,000 `start_run`s (each hashes files and asks git). Runs cycle over four probes
with five tasks each, 4 models (one a random-init twin) x 13 layers x 20 metrics (cut to 5,000
rows), so one probe/task lives in a quarter of the runs; the worst case (a filter that every run
matches) is timed too. Also timed: the per-file read loop `ResultsStore.query` used before it
became one pyarrow dataset scan. Target (issue 14): under 1 s each at 1,000 runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app import data
from workbench.store.results import (
    ARROW_SCHEMA,
    RESULT_COLUMNS,
    SCHEMA_VERSION,
    ResultsStore,
    coerce_rows,
)

PROBES = {"syntax": ["upos", "xpos", "deprel", "arc", "structural-distance"],
          "align": ["bli", "parallel", "model-pair", "diachronic", "fake-language"],
          "cloze": ["age", "antonym", "objects", "taxonomy", "multihop"],
          "coref": ["gum-pairs", "gum-entity-type", "gap", "attention-heads", "gap-cloze"]}
N_ROWS, LAYERS = 5000, 13
METRICS = ["accuracy", "control_accuracy", "majority", "selectivity", "train_accuracy", "uuas", "dspr", "auc", "f1",
           "p_at_1", "cka", "mrr", "loss", "mdl", "compression", "spearman", "root_acc", "scalar_mix_weight",
           "cumulative_accuracy", "zero_shot"]


def make_rows(i: int, run_id: str, rng: np.random.Generator) -> tuple[pa.Table, dict]:
    probe = list(PROBES)[i % len(PROBES)]
    seed = i % 5
    models = [f"exp{i % 50}/seed-{seed}/step-{1000 * (i % 7):07d}", "bert-base", "MiniLM"]
    models.append(models[0] + " (random init)")
    grid = np.array(np.meshgrid(np.arange(len(PROBES[probe])), np.arange(len(models)), np.arange(LAYERS),
                                np.arange(len(METRICS)), indexing="ij")).reshape(4, -1)[:, :N_ROWS]
    t, m, layer, k = grid
    value = rng.random(N_ROWS)
    cols = {
        "run_id": [run_id] * N_ROWS, "model": [models[j] for j in m], "family": ["bert"] * N_ROWS,
        "seed": np.full(N_ROWS, seed), "step": np.full(N_ROWS, 1000 * (i % 7)), "probe": [probe] * N_ROWS,
        "task": [PROBES[probe][j] for j in t], "split": ["dev"] * N_ROWS, "stack": ["encoder"] * N_ROWS,
        "layer": layer, "metric": [METRICS[j] for j in k], "value": value, "n": np.full(N_ROWS, 2000),
        "ci_low": value - 0.02, "ci_high": value + 0.02, "extra": [None] * N_ROWS,
    }
    table = pa.table({c: pa.array(cols[c], type=ARROW_SCHEMA.field(c).type) for c in RESULT_COLUMNS},
                     schema=ARROW_SCHEMA)
    summary = {"models": sorted(models), "families": ["bert"], "probes": [probe], "tasks": sorted(PROBES[probe]),
               "metrics": sorted(METRICS), "seeds": [seed], "steps": [1000 * (i % 7)]}
    manifest = {"schema_version": SCHEMA_VERSION, "run_id": run_id, "kind": "probe", "name": f"bench-{i}",
                "status": "finished", "config": {"probe": probe, "i": i}, "created": "2026-11-23T00:00:00+00:00",
                "finished": "2026-11-23T00:01:00+00:00", "n_rows": N_ROWS, "summary": summary, "notes": {}}
    return table, manifest


def generate(root: Path, n_runs: int) -> ResultsStore:
    if root.exists():
        shutil.rmtree(root)
    results = root / "results"
    results.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(n_runs):
        run_id = f"20261123T{i // 3600:02d}{i // 60 % 60:02d}{i % 60:02d}.000000Z-{i:08x}"
        table, manifest = make_rows(i, run_id, rng)
        (results / run_id).mkdir()
        pq.write_table(table, results / run_id / "rows.parquet")
        (results / run_id / "manifest.json").write_text(json.dumps(manifest))
    return ResultsStore(root)  # registers every folder in its catalog


KEYS = ("runs_page", "layer_curve", "all_metrics", "worst_case", "per_file_loop")


def timed(fn, repeat: int = 3) -> tuple[float, float, object, float]:
    """(first call, best of `repeat` calls) in wall seconds, the last result, and the CPU seconds of
    the best call (process time: what the query costs when the machine is not shared)."""
    times, cpu, out = [], [], None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    best = int(np.argmin(times))
    return times[0], times[best], out, cpu[best]


def per_file_query(store: ResultsStore, run_ids: list[str], probe: str, task: str):
    """The pre-dataset-scan path of ResultsStore.query: one pq.read_table per run file."""
    import pyarrow.compute as pc

    expr = (pc.field("probe") == probe) & (pc.field("task") == task)
    tables = [pq.read_table(store.results_dir / r / "rows.parquet", schema=ARROW_SCHEMA, filters=expr)
              for r in run_ids]
    return coerce_rows(pa.concat_tables(tables))


def bench(root: Path, n_runs: int) -> dict:
    t0 = time.perf_counter()
    generate(root, n_runs)
    gen = time.perf_counter() - t0
    store = ResultsStore(root)

    def runs_page():
        runs = data.catalog(store)
        facets = {c: data.facet_values(runs, c) for c in ("families", "probes", "tasks", "models", "seeds", "steps")}
        return data.filter_runs(runs, probes=["syntax"], steps=["3000"]), facets

    def layer_curve():  # what the Layer curves page reads: the task's rows, whose extra says which are baselines
        runs = data.filter_runs(data.catalog(store), probes=["syntax"], tasks=["upos"])
        loaded = data.query(store, runs, probe="syntax", task="upos")
        data.metric_choices(loaded.rows)
        return loaded

    def all_metrics():  # every row of the probe/task (the generic probe page's read)
        runs = data.filter_runs(data.catalog(store), probes=["syntax"], tasks=["upos"])
        return data.query(store, runs, probe="syntax", task="upos")

    def worst_case():  # a filter every run matches: all runs' files scanned
        return store.query(model="bert-base", metric="accuracy", layer=6)

    out = {"runs": n_runs, "generate_s": gen}
    out["runs_page"] = timed(runs_page)
    out["layer_curve"] = timed(layer_curve)
    out["all_metrics"] = timed(all_metrics)
    out["worst_case"] = timed(worst_case)
    ids = data.filter_runs(store.runs(), probes=["syntax"])["run_id"].tolist()
    out["per_file_loop"] = timed(lambda: per_file_query(store, ids, "syntax", "upos"), repeat=2)
    full = out["all_metrics"][2]
    assert not full.problems and len(full.rows) == len(ids) * 4 * LAYERS * len(METRICS)  # upos: first task
    assert len(out["per_file_loop"][2]) == len(full.rows)  # same rows, the old way
    loaded = out["layer_curve"][2]
    assert len(loaded.rows) == len(ids) * 4 * LAYERS * 5  # accuracy, majority, control, selectivity, mix
    out["layer_curve_rows"] = len(loaded.rows)
    out["layer_curve_runs"] = len(ids)
    out["worst_case_rows"] = len(out["worst_case"][2])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="/tmp/bertology-bench-store")
    ap.add_argument("--runs", default="100,1000")
    args = ap.parse_args()
    results = [bench(Path(args.root) / f"n{n}", int(n)) for n in args.runs.split(",")]
    print(f"store: {N_ROWS} rows per run; wall seconds, first call / best of 3 (loadavg now "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"{'runs':>6} {'generate':>9} {'runs page':>16} {'layer curve':>16} {'(rows, runs)':>16} "
          f"{'all metrics':>16} {'every run':>16} {'old per-file':>16}")
    for r in results:
        def f(key):
            return f"{r[key][0]:.3f} / {r[key][1]:.3f}"
        print(f"{r['runs']:>6} {r['generate_s']:>9.1f} {f('runs_page'):>16} {f('layer_curve'):>16} "
              f"{(r['layer_curve_rows'], r['layer_curve_runs'])!s:>16} {f('all_metrics'):>16} "
              f"{f('worst_case'):>16} {f('per_file_loop'):>16}")
    print("CPU seconds of the best call: " + "; ".join(
        f"{r['runs']} runs: " + ", ".join(f"{k} {r[k][3]:.3f}" for k in KEYS) for r in results))
    if len(results) > 1:
        a, b = results[0], results[-1]
        grow = {k: b[k][1] / a[k][1] for k in KEYS}
        print(f"growth {a['runs']} -> {b['runs']} runs (best times): "
              + ", ".join(f"{k} x{v:.1f}" for k, v in grow.items()))
    for r in results:
        shutil.rmtree(Path(args.root) / f"n{r['runs']}", ignore_errors=True)


if __name__ == "__main__":
    main()
