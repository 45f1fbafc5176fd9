"""The app's pages, without running the app: (section, title, url path, page callable) for every
page `app/streamlit_app.py` hands to `st.navigation`, so the tests open exactly the pages the app
has (tests/test_app_browser.py opens each URL as the first request of a fresh server).

Why the page modules live in `app/page_modules/` and never in `app/pages/`: Streamlit takes a folder
named `pages` beside the entry script for its own file-based multipage app (`PagesManager.
uses_pages_directory`, decided by the first session of a server process). A deep link such as
`/prune` as a fresh server's first request then ran `pages/prune.py` as a script: a blank page under a
sidebar of file names, for every later visitor too, until someone opened the root URL (issue 40).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from app import page_modules, ui
from app.views import explorer, layer_curves, probe, runs

RESULTS, PROBES = "Results", "Probes"


@dataclass(frozen=True)
class PageSpec:
    section: str  # RESULTS or PROBES
    title: str  # the sidebar's label
    url: str  # the URL path: http://HOST:PORT/<url>
    render: Callable[[], None]  # the page, guarded (an error is one st.error line)


def _probe_page(name: str, module):
    """A page callable for one probe (its companion module's render, or the generic page)."""
    if module is not None:
        def page():
            module.render(ui.store())
    else:
        def page():
            probe.render(name)
    page.__name__ = f"probe_{name}"
    return ui.guarded(page)


def page_specs() -> list[PageSpec]:
    """Every page of the app, in the sidebar's order: Runs, Layer curves, Model explorer, the result
    pages (`page_modules.RESULT_PAGES`), then one page per registered probe."""
    specs = [PageSpec(RESULTS, "Runs", "runs", ui.guarded(runs.render)),
             PageSpec(RESULTS, "Layer curves", "layer-curves", ui.guarded(layer_curves.render)),
             PageSpec(RESULTS, "Model explorer", "explorer", ui.guarded(explorer.render))]
    for name, module in page_modules.result_pages():  # rows of a command (finetune, prune, ...), not of a probe
        specs.append(PageSpec(RESULTS, getattr(module, "TITLE", name), name, _probe_page(name, module)))
    for name, module in page_modules.probe_pages():
        title = getattr(module, "TITLE", None) or name
        specs.append(PageSpec(PROBES, f"Probe: {title}", f"probe-{name}", _probe_page(name, module)))
    return specs
