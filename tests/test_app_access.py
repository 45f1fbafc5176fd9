"""Who may use the app (issue 53, `app.access`): `bertology app` listens on the loopback only by
default (its listening sockets read from the socket table with psutil); `--host 0.0.0.0` asks for the
printed token on every page, deep links included, and is read-only (no deleting runs, no generating
text) unless `--allow-writes`; a bad `--host` or an empty token is one line and exit 2.

Every connection a test makes goes to 127.0.0.1: an app exposed on 0.0.0.0 is reached on the loopback
(the refusal and the token are the same whatever interface a visitor comes from)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import psutil
import pytest
from streamlit.testing.v1 import AppTest

from app import access
from app.cli import main
from tests.conftest import tiny_gpt2
from tests.test_app import APP, app_env, no_errors, open_page  # noqa: F401 - app_env is a fixture
from tests.test_app_browser import CHROMIUM, runs_root, streamlit_server, wait_until_drawn

GPT = "train/gpt/seed-0/step-0000001"


# --------------------------------------------------------------------------- the command's side
def test_loopback_by_default_needs_no_token():
    s = access.serving("127.0.0.1", 8501, None, False, environ={})
    assert (s.address, s.exposed, s.warning) == ("127.0.0.1", False, None)
    assert s.urls == ["http://127.0.0.1:8501/"]
    assert s.env == {access.TOKEN_ENV: None, access.READ_ONLY_ENV: None}  # both cleared for Streamlit
    assert access.serving("localhost", 8501, None, False, environ={}).address == "127.0.0.1"
    # a token given on the loopback is still asked for
    given = access.serving("127.0.0.1", 8501, "abc", False, environ={})
    assert given.env[access.TOKEN_ENV] == "abc" and given.urls == ["http://127.0.0.1:8501/?token=abc"]


def test_exposed_makes_a_token_and_is_read_only_unless_allowed():
    s = access.serving("0.0.0.0", 8600, None, False, environ={})
    token = s.env[access.TOKEN_ENV]
    assert re.fullmatch(r"[0-9a-f]{48}", token)
    assert access.serving("0.0.0.0", 8600, None, False, environ={}).env[access.TOKEN_ENV] != token  # random
    assert s.exposed and s.env[access.READ_ONLY_ENV] == "1"
    assert s.urls[1] == f"http://127.0.0.1:8600/?token={token}"
    assert s.warning.startswith("listening on 0.0.0.0:8600: anyone who can reach this machine") and "read-only" in s.warning
    w = access.serving("0.0.0.0", 8600, None, True, environ={})
    assert w.env[access.READ_ONLY_ENV] is None and "can delete runs and generate text" in w.warning
    # the environment's token, quoted in the URL
    e = access.serving("0.0.0.0", 8600, None, False, environ={access.TOKEN_ENV: "a b&c"})
    assert e.env[access.TOKEN_ENV] == "a b&c" and e.urls[1].endswith("/?token=a%20b%26c")
    assert access.serving("0.0.0.0", 8600, "flag", False, environ={access.TOKEN_ENV: "env"}).env[access.TOKEN_ENV] == "flag"


@pytest.mark.parametrize("argv, env, says", [
    (["--host", "lab-server"], None, "--host: not an IP address: 'lab-server'"),
    (["--host", "999.1.1.1"], None, "--host: not an IP address: '999.1.1.1'"),
    (["--host", "192.0.2.1"], None, "--host 192.0.2.1: this machine cannot listen on that address"),  # TEST-NET-1
    (["--host", "0.0.0.0", "--token", ""], None, "--token: the token is empty"),
    (["--host", "0.0.0.0"], "", "$BERTOLOGY_APP_TOKEN: the token is empty"),
    (["--port", "70000"], None, "--port: must be 1..65535, got 70000"),
])
def test_bad_host_or_empty_token_is_one_line_and_exit_2(argv, env, says, capsys, monkeypatch):
    if env is None:
        monkeypatch.delenv(access.TOKEN_ENV, raising=False)
    else:
        monkeypatch.setenv(access.TOKEN_ENV, env)
    assert main(["app", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no URL printed, no server started
    assert err.count("\n") == 1 and err.startswith(f"bertology: error: {says}"), err


def listening_addresses(pid: int, port: int) -> set[str]:
    """The local addresses of the sockets listening on `port` in process `pid` and its children (the
    socket table, read with psutil: nothing is connected to)."""
    parent = psutil.Process(pid)
    return {c.laddr.ip for p in (parent, *parent.children(recursive=True))
            for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


@pytest.mark.slow
def test_default_server_listens_on_the_loopback_only(tmp_path):
    (tmp_path / "runs").mkdir()
    with streamlit_server(tmp_path / "runs", tmp_path) as served:
        port = int(served.base.rsplit(":", 1)[1])
        assert listening_addresses(served.proc.pid, port) == {"127.0.0.1"}
        printed = served.log_path.read_text()
    assert f"The app, once started: http://127.0.0.1:{port}/\n" in printed
    assert "warning" not in printed and "Network URL" not in printed and "token" not in printed


# --------------------------------------------------------------------------- the app's side (AppTest)
def test_every_page_refuses_a_session_without_the_token(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path))
    monkeypatch.setenv(access.TOKEN_ENV, "s3cret")
    for page in ("runs", "explorer", "probe-syntax"):
        for given in (None, "s3cre", "s3cret!"):
            at = AppTest.from_file(APP, default_timeout=120)
            at.query_params["page"] = page
            if given is not None:
                at.query_params["token"] = given
            at.run()
            assert [e.value for e in at.error] == [access.REFUSED], (page, given)
            assert len(at.main.children) == 1 and not at.header and not at.info, (page, given)  # nothing else
    at = open_page("runs")
    at.query_params["token"] = "s3cret"
    at.run()
    no_errors(at)
    assert at.header[0].value == "Runs"
    del at.query_params["token"]  # as navigating to another page drops the query string
    at.run()  # the session gave the token once: kept, and put back in the URL
    assert at.header[0].value == "Runs" and at.query_params["token"] == "s3cret"


def test_read_only_disables_delete_and_generate(app_env, tokenizers, monkeypatch):
    store = app_env
    gpt = store.root / GPT  # the newest checkpoint: the explorer opens on it
    tiny_gpt2(tokenizers["gpt"], seed=1).save_pretrained(gpt)
    tokenizers["gpt"].save_pretrained(gpt)
    (gpt / "manifest.json").write_text(json.dumps({"family": "gpt", "step": 1, "seed": 0}))
    monkeypatch.setenv(access.READ_ONLY_ENV, "1")
    victim = store.runs()["run_id"].iloc[0]
    at = open_page("runs")
    at.selectbox(key="runs-delete-run").set_value(victim).run()
    no_errors(at)
    assert at.checkbox(key="runs-delete-confirm").disabled and at.button(key="runs-delete-button").disabled
    assert [i.value for i in at.info] == [access.WRITE_OFF.format(what="Deleting runs")]
    assert at.info[0].value.startswith("Deleting runs is off: this app is open to the network read-only.")
    forged = at.button(key="runs-delete-button")  # a click on the disabled button, as a forged message would send
    forged.proto.disabled = False  # (AppTest, like a browser, refuses to click a disabled widget)
    forged.click().run()
    no_errors(at)
    assert victim in store.runs()["run_id"].tolist()

    at = open_page("explorer")
    no_errors(at)
    assert at.selectbox(key="ex-local").value == GPT
    assert access.WRITE_OFF.format(what="Generating text") in [i.value for i in at.info]
    assert "ex-gen-prompt" not in [t.key for t in at.text_input]  # no controls, no generation
    monkeypatch.delenv(access.READ_ONLY_ENV)  # --allow-writes (or the loopback): the same model generates
    at = open_page("explorer")
    assert "ex-gen-prompt" in [t.key for t in at.text_input]
    assert access.write_off("Generating text") is None


# --------------------------------------------------------------------------- a real browser, exposed
def main_text(page) -> str:
    return page.locator('[data-testid="stMain"]').inner_text().strip()


@pytest.mark.slow
def test_exposed_app_asks_for_the_token_in_a_browser(probe_store, tokenizers, tmp_path):
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium); the browser test needs it")
    from playwright.sync_api import sync_playwright

    root = runs_root(probe_store, tokenizers, tmp_path)
    refusal = access.REFUSED.replace("`", "")  # as drawn: the backticks become code
    with streamlit_server(root, tmp_path, "exposed", ("--host", "0.0.0.0")) as served, sync_playwright() as p:
        base = served.base  # the loopback: the test connects nowhere else
        port = int(base.rsplit(":", 1)[1])
        printed = served.log_path.read_text()
        token = re.search(rf"http://127\.0\.0\.1:{port}/\?token=([0-9a-f]{{48}})", printed).group(1)
        assert "warning: listening on 0.0.0.0" in printed
        assert listening_addresses(served.proc.pid, port) == {"0.0.0.0"}
        for proc in psutil.Process(served.proc.pid).children(recursive=True):  # not on a command line (ps)
            assert token not in " ".join(proc.cmdline())
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"])
        for url in ("", "runs", "prune", f"explorer?token={token[:-1]}", f"runs?token={token}x"):
            context = browser.new_context()
            page = context.new_page()
            page.goto(f"{base}/{url}", wait_until="domcontentloaded")
            page.wait_for_selector('[data-testid="stAlertContentError"]', timeout=120_000)
            wait_until_drawn(page)
            assert main_text(page) == refusal, url  # one line, nothing else
            assert page.locator('[data-testid="stHeading"]').count() == 0, url
            assert page.locator('[data-testid="stSidebarNav"]').count() == 0, url
            context.close()

        page = browser.new_context(viewport={"width": 1400, "height": 1600}).new_page()
        page.goto(f"{base}/?token={token}", wait_until="domcontentloaded")  # Runs, the default page
        page.wait_for_selector('[data-testid="stHeading"]', timeout=120_000)
        wait_until_drawn(page)
        assert page.locator('[data-testid="stHeading"]').first.inner_text().strip() == "Runs"
        page.get_by_role("tab", name="Delete").click()
        page.get_by_role("combobox", name="Run to delete").click()
        page.get_by_role("option").first.click()
        page.wait_for_selector(".st-key-runs-delete-button button", timeout=60_000)
        wait_until_drawn(page)
        assert page.locator(".st-key-runs-delete-button button").is_disabled()
        assert access.WRITE_OFF.format(what="Deleting runs").replace("`", "") in main_text(page)
        # another page from the sidebar: the session keeps the token (and the URL gets it back)
        page.locator('[data-testid="stSidebarNav"] a', has_text="Layer curves").click()
        page.wait_for_function("() => [...document.querySelectorAll('[data-testid=\"stHeading\"]')]"
                               ".some(h => h.innerText.trim() === 'Layer curves')", timeout=120_000)
        wait_until_drawn(page)
        assert page.url == f"{base}/layer-curves?token={token}"
        assert page.locator('[data-testid="stAlertContentError"]').count() == 0
        browser.close()
        printed = served.log_path.read_text()
    assert printed.count(token) == 2  # printed once, in the hostname's URL and the loopback's; never logged
    assert len([line for line in printed.splitlines() if token in line]) == 1
