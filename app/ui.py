"""Streamlit helpers shared by every page: the store, problem messages, and a guard that turns any
error into one st.error line (a page never shows a traceback)."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd
import streamlit as st

from app import data
from workbench.errors import WorkbenchError
from workbench.paths import runs_root

NO_RUNS = "No runs yet under {root}. Run `bertology run experiments/main.yaml` (or `bertology probe syntax --checkpoint ...`) to make some."
MAIN_COMMAND = "bertology run experiments/main.yaml"
# The command that makes each probe's rows, for a probe page with none (a probe without an entry:
# `bertology probe NAME --checkpoint CKPT`). Result pages name their own (their module's MAKE).
PROBE_COMMANDS = {
    "syntax": "bertology probe syntax --checkpoint CKPT (or bertology run experiments/probe_syntax.yaml)",
    "cloze": "bertology probe cloze --checkpoint CKPT",
    "coref": "bertology probe coref --checkpoint CKPT",
    "align": "bertology probe align --tasks parallel --checkpoint CKPT",
    "extraction": "bertology run experiments/extraction/gpt_tiny_canaries_run.yaml",
    "membership": "bertology probe membership --checkpoint runs/train/NAME/seed-0",
}


def probe_command(probe: str) -> str:
    """The command that makes `probe`'s rows (PROBE_COMMANDS, else the generic probe command)."""
    return PROBE_COMMANDS.get(probe, f"bertology probe {probe} --checkpoint CKPT")


def no_rows(what: str, command: str, root) -> None:
    """The line a page shows when the store holds none of its rows: which command makes them."""
    st.info(f"No {what} rows yet under {root}: run `{command}`.")


def store():
    """The results store of the runs root ($BERTOLOGY_RUNS, read on every rerun)."""
    return data.open_store(runs_root())


def guarded(page):
    """Run a page; a WorkbenchError or any other exception becomes one st.error line."""

    @functools.wraps(page)
    def run(*args, **kwargs):
        try:
            return page(*args, **kwargs)
        except WorkbenchError as e:
            st.error(str(e))
        except Exception as e:  # noqa: BLE001 - the app shows what went wrong instead of a traceback
            st.error(f"{type(e).__name__}: {e}")

    return run


def show_problems(problems: list[str], limit: int = 8) -> None:
    for p in problems[:limit]:
        st.warning(p)
    if len(problems) > limit:
        st.warning(f"... and {len(problems) - limit} more damaged or older runs")


def _query(root: str, run_ids: tuple, health: tuple, filters: tuple) -> data.Loaded:
    runs = pd.DataFrame({"run_id": list(run_ids), "health": list(health)})
    return data.query(data.open_store(root), runs, **{k: list(v) if isinstance(v, tuple) else v for k, v in filters})


def _manifest(root: str, run_id: str, mtime_ns: int | None) -> tuple[dict | None, list[str]]:
    return data.manifest(data.open_store(root), run_id)


@functools.cache
def _cached(fn, what: str):  # made on first use: st.cache_data outside a running app (figures CLI) only warns
    return st.cache_data(max_entries=32, show_spinner=f"reading {what}")(fn)


def cached_query(s, runs: pd.DataFrame, **filters) -> data.Loaded:
    """`data.query` of catalog `runs` (with their `health`), cached across reruns: a published run
    never changes, so its id and health key the cache (a run damaged or deleted changes its health)."""
    key = tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple, set)) else v) for k, v in filters.items()))
    return _cached(_query, "rows")(str(s.root), tuple(runs["run_id"]), tuple(runs["health"]), key)


def cached_manifest(s, run_id: str) -> tuple[dict | None, list[str]]:
    """`data.manifest` cached across reruns, keyed by the run id and its manifest's mtime."""
    path = Path(s.results_dir) / run_id / data.MANIFEST_NAME
    try:
        mtime = path.stat().st_mtime_ns
    except OSError:
        mtime = None
    return _cached(_manifest, "manifests")(str(s.root), run_id, mtime)


def catalog_or_stop(s, what: str | None = None, command: str | None = None):
    """The catalog; an info line and st.stop() when the store holds no runs: the page's own
    `no_rows(what, command)` line when given, else the generic NO_RUNS."""
    runs = data.catalog(s)
    if runs.empty:
        if command:
            no_rows(what or "", command, s.root)
        else:
            st.info(NO_RUNS.format(root=s.root))
        st.stop()
    return runs


def pick(label: str, options: list, key: str, default=None, **kw):
    """A selectbox that keeps a valid choice when the options change."""
    if not options:
        return None
    index = options.index(default) if default in options else 0
    return st.selectbox(label, options, index=index, key=key, **kw)


def table(df, key: str, hide_index: bool = True) -> None:
    """A dataframe inside a container keyed `key` (the tests and the browser find it by that key:
    `at.container(key)`, CSS class `st-key-<key>`)."""
    with st.container(key=key):
        st.dataframe(df, hide_index=hide_index, width="stretch")


def chart(draw, key: str, say_missing: bool = True):
    """Draw one plot of a page: `draw()` returns an `app.figures.Drawn`; a plot whose rows are not in
    the store (`figures.MissingData`) shows its reason (or nothing, `say_missing=False`) instead of
    an exception. Returns the drawn figure, or None when there was nothing to draw."""
    from app.figures import MissingData

    try:
        drawn = draw()
    except MissingData as e:
        if say_missing:
            st.info(str(e))
        return None
    drawn.figure.update_layout(width=None)
    st.plotly_chart(drawn.figure, width="stretch", key=key)
    return drawn
