"""Who may use the app, and what they may change (issue 53): the one home of the app's access policy.

The app shows every run and manifest, loads any checkpoint under the runs root or the Hugging Face
cache, generates text and deletes runs, with no accounts. So, as TensorBoard, Jupyter and MLflow's UI
do, `bertology app` listens on the loopback (127.0.0.1) unless `--host ADDR` exposes it; exposed, it
needs a token in the URL (`?token=...`, Jupyter's way: printed once by `bertology app`, generated
unless `--token` or $BERTOLOGY_APP_TOKEN gives one) and is read-only (no deleting runs, no
generating text) unless `--allow-writes`.

Two halves, one module so the names they share are defined once:
- the command's side (`serving`): check the address, take or make the token, and the environment
  of the Streamlit process. The token and the write permission travel in that environment, never on
  Streamlit's command line (`ps` shows command lines to every user; /proc/PID/environ is its owner's
  only) and never in a log: the one place it is written is the URL `bertology app` prints.
- the app's side (`gate`, `write_off`): the entry script calls `gate()` before it builds any page,
  so every page, deep links (`/runs?token=...`) included, goes through it.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import socket
from dataclasses import dataclass, field
from urllib.parse import quote

from workbench.errors import ConfigError

TOKEN_ENV = "BERTOLOGY_APP_TOKEN"  # the token: given by the user, and how it reaches the app
READ_ONLY_ENV = "BERTOLOGY_APP_READ_ONLY"  # "1": the app refuses to delete runs and to generate text
LOOPBACK = "127.0.0.1"
TOKEN_PARAM = "token"  # the URL's query parameter
_ACCEPTED = "access-token-accepted"  # session_state key: this browser session gave the token

WRITE_OFF = ("{what} is off: this app is open to the network read-only. Whoever started it can allow it with "
             "`bertology app --host ... --allow-writes`.")
REFUSED = ("This app needs its token: open it with the URL `bertology app` printed "
           "(http://HOST:PORT/?token=...).")


@dataclass(frozen=True)
class Serving:
    """How `bertology app` serves: Streamlit's address, the environment of its process (only the
    variables this module sets or clears: `None` clears one), the URLs to print and, when exposed,
    the one warning line."""

    address: str
    exposed: bool
    env: dict[str, str | None] = field(repr=False)  # holds the token: never printed whole
    urls: list[str] = field(repr=False)
    warning: str | None = None


def _check_address(host: str) -> str:
    """`host` as an IP address of this machine (`localhost` is the loopback), or a ConfigError.

    Only IP addresses: deciding whether a host name is the loopback would need a name lookup
    (network traffic, and an answer that can change); an address that is not this machine's is
    refused here, in one line, rather than by a Streamlit traceback."""
    if host == "localhost":
        return LOOPBACK
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ConfigError(f"--host: not an IP address: {host!r} (give 127.0.0.1, the default, 0.0.0.0 for every "
                          f"network interface, or one of this machine's addresses)") from None
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))  # a local check: nothing is sent anywhere
    except OSError as e:
        raise ConfigError(f"--host {host}: this machine cannot listen on that address ({e.strerror})") from None
    return str(ip)


def _url(host: str, port: int, token: str | None) -> str:
    h = f"[{host}]" if ":" in host else host
    return f"http://{h}:{port}/" + (f"?{TOKEN_PARAM}={quote(token, safe='')}" if token else "")


def serving(host: str, port: int, token: str | None, allow_writes: bool, environ=os.environ) -> Serving:
    """The address, environment and URLs of `bertology app --host HOST --port PORT [--token T]
    [--allow-writes]`; a bad address, port or token is a ConfigError (one line, exit 2).

    On the loopback no token is needed (the machine's other users are the exposure, as with
    TensorBoard and MLflow); one given by `--token` or $BERTOLOGY_APP_TOKEN is still required.
    Exposed, the token is the given one or a fresh `secrets.token_hex(24)` (Jupyter's length)."""
    if not 0 < port < 65536:
        raise ConfigError(f"--port: must be 1..65535, got {port}")
    address = _check_address(host)
    exposed = not ipaddress.ip_address(address).is_loopback
    source = "--token"
    if token is None:
        token, source = environ.get(TOKEN_ENV), f"${TOKEN_ENV}"
    if token is not None and not token.strip():
        raise ConfigError(f"{source}: the token is empty; give a non-empty one, or none and one is generated")
    if token is None and exposed:
        token = secrets.token_hex(24)
    read_only = exposed and not allow_writes
    env = {TOKEN_ENV: token, READ_ONLY_ENV: "1" if read_only else None}
    if not exposed:
        urls = [_url(address, port, token)]
        return Serving(address, False, env, urls)
    wildcard = ipaddress.ip_address(address).is_unspecified
    # a wildcard address is no URL: name the machine (no lookup) and the loopback, as Jupyter does
    urls = ([_url(socket.gethostname(), port, token), _url(LOOPBACK if address == "0.0.0.0" else "::1", port, token)]
            if wildcard else [_url(address, port, token)])
    who = "anyone who can reach this machine" if wildcard else f"anyone who can reach {address}"
    mode = ("they can delete runs and generate text (--allow-writes)" if allow_writes else
            "read-only: no deleting runs, no generating text (--allow-writes allows both)")
    warning = f"listening on {address}:{port}: {who} can open the app with the token in the URL below; {mode}"
    return Serving(address, True, env, urls, warning)


# --------------------------------------------------------------------------- the app's side
def gate() -> None:
    """Stop the script run, showing one line and nothing else, unless this session gave the token.

    Called by the entry script before any page is built, so every page and every deep link goes
    through it. The token comes as `?token=...` in the URL of the session's first request; once
    accepted it is remembered in the session (navigating between pages drops the query string) and
    put back in the URL, so a reload or a bookmark of the page opens it again. The comparison is
    constant-time (`hmac.compare_digest`), so the time a refusal takes says nothing of how much of
    a guess was right."""
    import streamlit as st

    expected = os.environ.get(TOKEN_ENV)
    if not expected:
        return
    if not st.session_state.get(_ACCEPTED):
        given = st.query_params.get(TOKEN_PARAM, "")
        if not hmac.compare_digest(given.encode(), expected.encode()):
            st.error(REFUSED)
            st.stop()
        st.session_state[_ACCEPTED] = True
    if st.query_params.get(TOKEN_PARAM) != expected:
        st.query_params[TOKEN_PARAM] = expected


def write_off(what: str) -> str | None:
    """Why `what` ("Deleting runs", "Generating text") is off in this app, or None when it is on:
    off when the app is exposed without `--allow-writes` (the page disables its control and shows
    this line)."""
    return WRITE_OFF.format(what=what) if os.environ.get(READ_ONLY_ENV) == "1" else None
