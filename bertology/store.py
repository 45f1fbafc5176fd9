"""The results store from Python (`runs`, `rows`, `figure`), as `bertology runs` and `bertology figures` read it.

Thin calls into `workbench.store.results.ResultsStore` (the catalog and the rows, as `bertology
runs list` / `runs show` read them) and `app.figures.draw` (a shipped figure, as `bertology
figures NAME` draws it before writing its files). The store is the runs root's,
`$BERTOLOGY_RUNS` (default ./runs).
"""

from __future__ import annotations

from typing import Any, Sequence

import pandas as pd


def runs(include_running: bool = False, **filters: Any) -> pd.DataFrame:
    """The store's catalog, one row per run, oldest first (`bertology runs list`). Filters:
    `kind="probe"`, `name=...`, `probe="syntax"`, `task="upos"`, `model=...`; a list matches any.

    >>> bertology.runs(probe="syntax", task="upos")[["run_id", "name", "models"]]   # doctest: +SKIP
    """
    from workbench.store.results import ResultsStore

    return ResultsStore().runs(include_running=include_running, **filters)


def rows(run_id: str | None = None, **filters: Any) -> pd.DataFrame:
    """Result rows: one run's (`bertology runs show RUN_ID`), or every run's rows matching equality
    filters on the result columns (`probe="syntax", task="upos", layer=3`; a list matches any).

    >>> bertology.rows(probe="syntax", task="upos", metric="accuracy")   # doctest: +SKIP
    """
    from workbench.store.results import ResultsStore

    store = ResultsStore()
    if run_id is None:
        return store.query(**filters)
    out = store.read(run_id)
    for column, want in filters.items():
        out = out[out[column].isin(want if isinstance(want, (list, tuple, set)) else [want])]
    return out.reset_index(drop=True)


def figure(name: str, runs: str | Sequence[str] | None = None):
    """A shipped figure (`experiments/figures/NAME.yaml`, or a YAML path) as a plotly figure, drawn
    from the store exactly as `bertology figures NAME` draws it; `runs` (a run id or a list)
    replaces the spec's run selection. Nothing is written (`bertology figures` writes the files).

    >>> bertology.figure("syntax_layer_curves", runs=result.run_id)   # doctest: +SKIP
    """
    from app.figures import draw

    run_ids = None if runs is None else ([runs] if isinstance(runs, str) else list(runs))
    return draw(name, run_id=run_ids)[2].figure
