"""Probe pages of the app: one optional companion module per probe, found by the probe's name.

A probe `NAME` (registered in `probes/__init__.py`) gets its own page by adding
`app/page_modules/NAME.py` with

    TITLE = "Syntax"                      # optional: the page's title (default: the probe's name)
    def render(store) -> None: ...        # draw the page with streamlit (st.*); `store` is a ResultsStore
    PLOTS = {"my_plot": fn}               # optional: extra plot kinds for experiments/figures/*.yaml,
                                          #   fn(rows, title, options) -> app.figures.Drawn

Nothing else is edited: the app lists `probes.probe_names()` and imports `app.page_modules.NAME` when it
exists; a probe without one gets the generic page (`app.views.probe.render`), which draws any
probe's rows (layer curves per task and metric, and its rows without a layer as a table).
"""

from __future__ import annotations

import importlib
import importlib.util
import warnings
from types import ModuleType

from probes import probe_names

def page_module(probe: str) -> ModuleType | None:
    """`app.page_modules.<probe>` when that companion module exists, else None."""
    name = f"{__name__}.{probe}"
    if not probe.isidentifier() or importlib.util.find_spec(name) is None:
        return None
    return importlib.import_module(name)


def probe_pages() -> list[tuple[str, ModuleType | None]]:
    """(probe name, its companion module or None) for every registered probe."""
    return [(name, page_module(name)) for name in probe_names()]


# Pages of results that no registered probe writes (a command's or sweep's own rows), shown under
# "Results" in the app: app/page_modules/<NAME>.py with TITLE, render(store) and optional PLOTS, exactly
# like a probe's companion module.
RESULT_PAGES = ("finetune", "prune", "distill", "peft", "cost", "reproduce")  # fine-tuning runs; compression sweeps
# (workbench/compress); distillation sweeps; fine-tuning methods (workbench/drivers/peft_sweep.py); checkpoint costs;
# the reproduction table (app/reproduce)


def result_pages() -> list[tuple[str, ModuleType]]:
    """(name, module) of every page in RESULT_PAGES."""
    return [(name, importlib.import_module(f"{__name__}.{name}")) for name in RESULT_PAGES]


def extra_plots() -> dict:
    """Plot kinds contributed by companion modules (`PLOTS`), for `bertology figures`."""
    out: dict = {}
    for name in [*probe_names(), *RESULT_PAGES]:
        try:
            module = page_module(name)
        except Exception as e:  # noqa: BLE001 - one broken page must not take every figure down
            warnings.warn(f"app/page_modules/{name}.py cannot be imported ({type(e).__name__}: {e}); its plots are "
                          f"unavailable", stacklevel=2)
            continue
        out.update(getattr(module, "PLOTS", {}) or {})
    return out
