"""Streamlit app (`bertology app`): a multipage dashboard over the runs root.

Pages: Runs (catalog, manifests, delete, compare), Layer curves (any probe x task x metric), Model
explorer (attention, word vectors across layers, logit lens), and one page per registered probe:
`app/page_modules/<probe>.py` when the probe ships a companion module (its `render(store)`), else the
generic probe page. The list comes from `probes.probe_names()`, so adding a probe never edits this
file (see app/page_modules/__init__.py). `?page=<url path>` opens a page directly (used by the tests).

Reads only under the runs root ($BERTOLOGY_RUNS) and the Hugging Face cache.
"""

from __future__ import annotations

import streamlit as st

from app import page_modules, ui
from app.views import explorer, layer_curves, probe, runs


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


def build_pages(requested: str | None) -> dict[str, list]:
    specs = [("Runs", "runs", ui.guarded(runs.render)),
             ("Layer curves", "layer-curves", ui.guarded(layer_curves.render)),
             ("Model explorer", "explorer", ui.guarded(explorer.render))]
    probe_specs = []
    for name, module in page_modules.probe_pages():
        title = getattr(module, "TITLE", None) or name
        probe_specs.append((f"Probe: {title}", f"probe-{name}", _probe_page(name, module)))
    for name, module in page_modules.result_pages():  # rows of a command (finetune, prune, distill, peft, cost), not of a probe
        specs.append((getattr(module, "TITLE", name), name, _probe_page(name, module)))
    urls = [url for _, url, _ in specs + probe_specs]
    default = requested if requested in urls else "runs"

    def make(title, url, fn):  # no icons: material icons would be fetched from the internet
        return st.Page(fn, title=title, url_path=url, default=url == default)

    return {"Results": [make(*s) for s in specs], "Probes": [make(*s) for s in probe_specs]}


st.set_page_config(page_title="BERTology workbench", layout="wide")
try:
    requested = st.query_params.get("page")
    navigation = st.navigation(build_pages(requested))
except Exception as e:  # noqa: BLE001 - e.g. a probe's companion module that fails to import
    st.error(f"the app could not build its pages: {type(e).__name__}: {e}")
    st.stop()
navigation.run()
