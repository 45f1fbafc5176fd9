"""Streamlit app (`bertology app`): a multipage dashboard over the runs root.

Pages: Runs (catalog, manifests, delete, compare), Layer curves (any probe x task x metric), Model
explorer (attention, word vectors across layers, logit lens), the result pages of the commands
(fine-tuning, compression, distillation, fine-tuning methods, cost) and one page per registered
probe: `app/page_modules/<probe>.py` when the probe ships a companion module (its `render(store)`),
else the generic probe page. The list is `app.navigation.page_specs()` (adding a probe never edits
this file). Every page opens by its URL (`/prune`, `/probe-syntax`, ...), also as the first request
of a fresh server; `?page=<url path>` opens a page directly too (used by the AppTest tests).

Keep the page modules out of a folder named `pages` beside this file: Streamlit would take it for
its own file-based multipage app (see app/navigation.py).

Reads only under the runs root ($BERTOLOGY_RUNS) and the Hugging Face cache. Served to the network
(`bertology app --host ...`), every page asks for the token first (`app.access.gate`, called here
before any page is built) and deleting runs and generating text are off unless `--allow-writes`.
"""

from __future__ import annotations

import streamlit as st

from app.access import gate
from app.navigation import PROBES, RESULTS, page_specs


def build_pages(requested: str | None) -> dict[str, list]:
    """The `st.navigation` sections. The default page is served at the root URL: Streamlit gives it
    the URL path "" whatever `url_path` says, so its own link (`/runs`) matched no page, and as a
    session's first request it showed a "Page not found" dialog before falling back to the root
    (issue 51). Its own path is served by a hidden alias of the same page, so a bookmark of `/runs`
    opens the Runs page and the root still does."""
    specs = page_specs()
    urls = [s.url for s in specs]
    default = requested if requested in urls else "runs"

    def make(s):  # no icons: material icons would be fetched from the internet
        if s.url == default:  # at the root; url_path "" keeps its page hash apart from the alias's
            return st.Page(s.render, title=s.title, url_path="", default=True)
        return st.Page(s.render, title=s.title, url_path=s.url)

    sections = {section: [make(s) for s in specs if s.section == section] for section in (RESULTS, PROBES)}
    home = next(s for s in specs if s.url == default)
    sections[home.section].append(st.Page(home.render, title=home.title, url_path=home.url, visibility="hidden"))
    return sections


st.set_page_config(page_title="BERTology workbench", layout="wide")
gate()  # exposed: no token, no page (the refusal is the only thing drawn)
try:
    requested = st.query_params.get("page")
    navigation = st.navigation(build_pages(requested))
except Exception as e:  # noqa: BLE001 - e.g. a probe's companion module that fails to import
    st.error(f"the app could not build its pages: {type(e).__name__}: {e}")
    st.stop()
navigation.run()
