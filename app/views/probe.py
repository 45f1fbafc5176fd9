"""The generic page of a probe without a companion module (`app/page_modules/<probe>.py`): any probe's
rows, whatever its tasks and metrics: the runs holding it, layer curves per task and metric, and
the rows without a layer (whole-model scores, matrices) as a table."""

from __future__ import annotations

import streamlit as st

from app import data, figures, ui
from app.views import layer_curves


def render(probe: str, store=None) -> None:
    s = store if store is not None else ui.store()
    rows = probe_rows(s, probe, f"Probe: {probe}", key=f"probe-{probe}")
    if rows is None:
        return
    tasks = sorted(rows["task"].dropna().unique())
    task = ui.pick("Task", tasks, key=f"probe-{probe}-task")
    sub = rows[rows["task"] == task]
    layer_curves.draw(sub, probe, task, key=f"probe-{probe}-{task}")
    flat = sub[sub["layer"].isna()]
    if not flat.empty:
        st.subheader("Rows without a layer")
        ui.table(flat.dropna(axis=1, how="all"), f"probe-{probe}-flat")


def probe_rows(s, probe: str, title: str, key: str | None = None, command: str | None = None):
    """The opening of every probe page: its header, the runs holding `probe` (when there are none,
    the command that makes them: `command`, else `ui.probe_command(probe)`), a run picker, and the
    chosen rows (None when there is nothing to show)."""
    st.header(title)
    runs = data.catalog(s)
    runs = data.filter_runs(runs, probes=[probe]) if not runs.empty else runs
    if runs.empty:
        ui.no_rows(probe, command or ui.probe_command(probe), s.root)
        return None
    return select_rows(s, runs, probe, key=key or probe)


def twin_toggle(rows, key: str, default: bool = True):
    """The "Show random-init twins" checkbox of a probe page and the rows it leaves."""
    twins = st.checkbox("Show random-init twins", value=default, key=f"{key}-twins")
    return rows if twins else rows[~data.twin_mask(rows).to_numpy()]


def panel_curves(rows, panels, key: str) -> None:
    """One layer-curve chart per `(task, metric)` panel with the baselines its rows declare for it
    (`app.data.row_kinds`) as reference lines; a panel without rows of its metric is left out."""
    rows = data.row_kinds(rows)
    for n, (task, metric) in enumerate(panels):
        panel = rows[(rows["task"] == task) & ((rows["metric"] == metric) | data.baseline_mask(rows))]
        if panel[panel["metric"] == metric].empty:
            continue
        drawn = figures.layer_curves(panel, f"{task}: {metric}", {})
        drawn.figure.update_layout(width=None)
        st.plotly_chart(drawn.figure, width="stretch", key=f"{key}-curve-{n}")


def select_rows(s, runs, probe: str, key: str):
    """A run picker (newest first, or every run) and that selection's rows of `probe`; None when
    nothing is readable (the reason shown)."""
    ids = runs["run_id"].tolist()[::-1]
    labels = {r: f"{r}  {n or ''}" for r, n in zip(runs["run_id"], runs["name"])}
    choice = st.selectbox("Run", ["all runs"] + ids, index=1, key=f"{key}-run",
                          format_func=lambda r: labels.get(r, r))
    chosen = runs if choice == "all runs" else runs[runs["run_id"] == choice]
    loaded = data.query(s, chosen, probe=probe)
    ui.show_problems(loaded.problems)
    if loaded.rows.empty:
        st.info(f"No readable {probe} rows in this selection.")
        return None
    return loaded.rows
