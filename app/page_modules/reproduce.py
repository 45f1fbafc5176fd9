"""The Reproductions page: the latest `bertology reproduce` table and figure, read from the runs
root (`reproduce/latest`, or `reproduce/quick` when only a --quick run exists), with each row's
probe runs linked to the Runs page (`runs?run=RUN_ID`)."""

from __future__ import annotations

import json
from pathlib import Path

TITLE = "Reproductions"
MAKE = "bertology reproduce"


def render(store) -> None:
    import pandas as pd
    import plotly.io
    import streamlit as st

    from app.reproduce.report import latest_folder

    st.header("The literature's findings beside ours")
    folder = next((f for f in (latest_folder(store.root, False), latest_folder(store.root, True))
                   if (f / "reproduce.csv").is_file()), None)
    if folder is None:
        st.info(f"No reproduction table under {store.root} yet: run `{MAKE}` (the real models) or "
                f"`{MAKE} --quick` (tiny models, minutes).")
        return
    manifest = json.loads((folder / "manifest.json").read_text()) if (folder / "manifest.json").is_file() else {}
    quick = folder.name == "quick"
    st.caption(f"`{manifest.get('command', MAKE)}`" + (" — tiny models: this checks the machinery, not the papers"
                                                       if quick else "") + f" ({folder})")
    frame = pd.read_csv(folder / "reproduce.csv")
    shown = frame[["row", "finding", "paper", "where", "paper_value", "verified", "ours", "ci_low", "ci_high",
                   "model", "test", "verdict", "reason"]]
    st.dataframe(shown, hide_index=True, use_container_width=True)
    figure = folder / "reproduce.json"
    if figure.is_file():
        st.plotly_chart(plotly.io.from_json(figure.read_text()), use_container_width=True, key="reproduce-figure")
    runs = manifest.get("run_ids", {})
    if runs:
        st.subheader("The runs behind each row")
        for row, ids in runs.items():
            if ids:
                st.markdown(f"- **{row}**: " + ", ".join(f"[`{i}`](runs?run={i})" for i in ids)
                            + " (each opens the run's manifest on the Runs page; `bertology runs show RUN_ID`)")
