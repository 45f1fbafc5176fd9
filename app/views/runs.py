"""Runs: the catalog filtered by family, probe, task, model, seed and step; one run's manifest (what
produced it); delete a run (with confirmation); compare two runs. `?run=RUN_ID` in the page's link
opens that run's manifest (the Reproductions page links each row's runs so)."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from app import access, data, ui
from workbench.store.aggregate import aggregate, per_unit

FACETS = {"family": "families", "probe": "probes", "task": "tasks", "model": "models", "seed": "seeds",
          "step": "steps"}
SHOWN = ["run_id", "name", "kind", "health", "n_rows", "probes", "tasks", "models", "families", "seeds", "steps",
         "finished"]


def render() -> None:
    st.header("Runs")
    s = ui.store()
    st.caption(f"runs root: {s.root}")
    runs = ui.catalog_or_stop(s)

    cols = st.columns(len(FACETS))
    wanted = {}
    for col, (label, column) in zip(cols, FACETS.items()):
        wanted[column] = col.multiselect(label, data.facet_values(runs, column), key=f"runs-filter-{label}")
    shown = data.filter_runs(runs, **wanted)
    st.write(f"{len(shown)} of {len(runs)} runs")
    ui.table(shown[SHOWN], "runs-table")
    if shown.empty:
        st.info("No run matches these filters.")
        return

    ids = shown["run_id"].tolist()
    labels = {r: f"{r}  {n or ''}" for r, n in zip(shown["run_id"], shown["name"])}
    tab_manifest, tab_compare, tab_delete = st.tabs(["Manifest", "Compare two runs", "Delete"])
    with tab_manifest:
        linked = st.query_params.get("run")  # a link to one run (`runs?run=RUN_ID`)
        index = ids.index(linked) if linked in ids else len(ids) - 1
        if linked and linked not in ids:
            st.warning(f"run {linked} is not in this runs root (or not among the filtered runs)")
        run_id = st.selectbox("Run", ids, index=index, format_func=labels.get, key="runs-manifest-run")
        show_manifest(s, run_id)
    with tab_compare:
        compare(s, ids, labels)
    with tab_delete:
        delete(s, ids, labels)


def show_manifest(s, run_id: str) -> None:
    m, problems = data.manifest(s, run_id)
    ui.show_problems(problems)
    if m is None:
        return
    git = m.get("git") or {}
    st.markdown(f"**{m.get('name') or run_id}** · kind `{m.get('kind')}` · {m.get('n_rows')} rows · "
                f"commit `{git.get('commit', 'unknown')}`{' (uncommitted changes)' if git.get('dirty') else ''} · "
                f"{m.get('created')} → {m.get('finished')}")
    ck = pd.DataFrame(m.get("checkpoints") or [], columns=["path", "sha256", "lineage"])
    if ck["lineage"].isna().all():  # no model made from another (`ModelHandle.derive`) in this run
        ck = ck.drop(columns="lineage")
    st.markdown("**Checkpoints** (weights sha256)")
    ui.table(ck, "manifest-checkpoints")
    files = pd.DataFrame(m.get("data_files") or [])
    if not files.empty:
        files = files[[c for c in ("data_relpath", "path", "sha256", "bytes") if c in files]]
    st.markdown("**Data files** (sha256)")
    ui.table(files, "manifest-data")
    versions = {k: v for k, v in (m.get("packages") or {}).items() if v}
    st.markdown("**Versions**")
    ui.table(pd.DataFrame(sorted(versions.items()), columns=["package", "version"]), "manifest-versions")
    with st.expander("Config"):
        st.code(json.dumps(m.get("config"), indent=2, default=str), language="json")
    with st.expander("Whole manifest (notes, environment, seeds)"):
        st.code(json.dumps(m, indent=2, default=str), language="json")


KEYS = ["model", "task", "metric", "split", "stack", "layer"]


def compare_rows(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    """Rows of two runs side by side on (model, task, metric, split, stack, layer): value_a, value_b, diff.
    Several rows of one key (seeds) are their mean (`workbench.store.aggregate`); the seed-less
    means older runs stored beside their per-seed rows are left out (`per_unit`), not averaged in."""
    def prep(df):
        df = per_unit(df)
        return aggregate(df, over="seed", by=KEYS, interval="none").set_index(KEYS)["value"].sort_index()
    both = pd.concat({"value_a": prep(a), "value_b": prep(b)}, axis=1).reset_index()
    both["diff"] = both["value_b"] - both["value_a"]
    return both


def config_diff(ma: dict, mb: dict) -> pd.DataFrame:
    ca, cb = (ma or {}).get("config") or {}, (mb or {}).get("config") or {}
    keys = sorted(set(ca) | set(cb))
    return pd.DataFrame([{"setting": k, "run a": json.dumps(ca.get(k), default=str), "run b": json.dumps(cb.get(k), default=str)}
                         for k in keys if ca.get(k) != cb.get(k)], columns=["setting", "run a", "run b"])


def compare(s, ids: list[str], labels: dict) -> None:
    if len(ids) < 2:
        st.info("Two runs are needed to compare; clear a filter.")
        return
    c1, c2 = st.columns(2)
    a = c1.selectbox("Run a", ids, index=0, format_func=labels.get, key="runs-compare-a")
    b = c2.selectbox("Run b", ids, index=1, format_func=labels.get, key="runs-compare-b")
    ma, pa_ = data.manifest(s, a)
    mb, pb_ = data.manifest(s, b)
    ra, rb = data.read_run(s, a), data.read_run(s, b)
    ui.show_problems(pa_ + pb_ + ra.problems + rb.problems)
    st.markdown("**Settings that differ**")
    ui.table(config_diff(ma, mb), "runs-compare-config")
    st.markdown("**Rows side by side** (diff = b - a)")
    ui.table(compare_rows(ra.rows, rb.rows), "runs-compare-rows")


def delete(s, ids: list[str], labels: dict) -> None:
    run_id = st.selectbox("Run to delete", ids, index=None, format_func=labels.get, key="runs-delete-run",
                          placeholder="choose a run")
    if run_id is None:
        return
    off = access.write_off("Deleting runs")  # exposed read-only: a stranger may look, not delete
    if off:
        st.info(off)
    sure = st.checkbox(f"Yes, delete run {run_id} and its rows for good", key="runs-delete-confirm", disabled=bool(off))
    # a click on a disabled button that a forged message sends anyway is discarded by Streamlit itself
    # (its session state drops a disabled widget's value; tests/test_app_access.py sends one)
    if st.button("Delete run", disabled=bool(off) or not sure, type="primary", key="runs-delete-button"):
        s.delete(run_id)
        st.success(f"deleted run {run_id}")
