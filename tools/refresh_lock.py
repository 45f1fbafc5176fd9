#!/usr/bin/env python3
"""Refresh `requirements.lock`, the exact versions every install of the workbench uses.

Why a lock: `pyproject.toml` states bounds (what the code is known to work with), so a fresh
`pip install` without the lock takes whatever was released yesterday; the README's install line and
`.ci/run` install through the lock (`pip install -c requirements.lock ...`), so a fresh clone gets
what the last landing tested (issue 48).

What a refresh does, in a temporary virtualenv (the project's own `.venv` is not touched):
  1. a current pip, then torch at the version asked for (the CPU wheel where one is configured),
  2. the project with its dev extra and no constraint (the newest releases the bounds allow, or
     those uploaded before `--as-of`),
  3. `pip freeze` of the result, written atomically to `requirements.lock` with torch's local build
     label dropped (`torch==2.13.0` accepts the CPU and the CUDA build of that version),
  4. the full test suite (pins included) in that virtualenv, unless `--no-tests`; if it fails, the
     previous lock is put back (the suite's own lock test reads the new one while it runs).
It prints the changed versions and a commit message. A refresh is its own commit, made only when
the suite passed:

    python3 tools/refresh_lock.py                      # newest releases, full suite (~15 min on 2 cores)
    python3 tools/refresh_lock.py --as-of 2026-11-29   # the releases of a day, e.g. to reproduce a landing
    git commit -F lock-refresh-message.txt requirements.lock

Standard library only: it runs before the project is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
MESSAGE = ROOT / "lock-refresh-message.txt"
HEADER = """\
# The exact versions every install uses: the README's install line and .ci/run install with
# `pip install -c requirements.lock ...`. Made by `python3 tools/refresh_lock.py` ({how});
# refresh it on purpose, in its own commit, after the full suite passed on the new versions.
# torch carries no build label, so a CUDA build of the same version satisfies it.
"""


def parse_lock(text: str) -> dict[str, str]:
    """{normalised name: version} of a lock or `pip freeze` text (comments and blank lines ignored)."""
    versions = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise SystemExit(f"error: {line!r} is not NAME==VERSION")
        versions[re.sub(r"[-_.]+", "-", name).lower()] = version
    return versions


def lock_text(freeze: str, how: str) -> str:
    lines = []
    for line in sorted(freeze.splitlines(), key=str.lower):
        line = line.strip()
        if not line or line.startswith(("#", "-e ")) or " @ " in line:
            continue  # the editable project itself
        if line.lower().startswith("torch=="):
            line = line.split("+", 1)[0]
        lines.append(line)
    return HEADER.format(how=how) + "\n".join(lines) + "\n"


def changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    out = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            out.append(f"{name} {old.get(name, '(new)')} -> {new.get(name, '(removed)')}")
    return out


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, **kw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch", default=None,
                        help="torch version to lock (default: the one in the current lock)")
    parser.add_argument("--as-of", default=None,
                        help="only releases uploaded before this ISO date or datetime (pip --uploaded-prior-to)")
    parser.add_argument("--no-tests", action="store_true", help="write the lock without running the suite")
    args = parser.parse_args(argv)

    old = parse_lock(LOCK.read_text()) if LOCK.exists() else {}
    torch_version = args.torch or old.get("torch")
    if not torch_version:
        raise SystemExit("error: no torch version in requirements.lock; pass --torch VERSION")
    with tempfile.TemporaryDirectory(prefix="bertology-lock-") as tmp:
        venv = Path(tmp) / "venv"
        run([sys.executable, "-m", "venv", str(venv)])
        pip = [str(venv / "bin" / "python"), "-m", "pip"]
        run(pip + ["install", "-q", "--upgrade", "pip"])
        run(pip + ["install", "-q", f"torch=={torch_version}"])
        dated = ["--uploaded-prior-to", args.as_of] if args.as_of else []
        run(pip + ["install", "-q", *dated, "-e", f"{ROOT}[dev]"])
        freeze = run(pip + ["freeze", "--exclude-editable"], capture_output=True, text=True).stdout
        how = f"torch {torch_version}, releases before {args.as_of}" if args.as_of else f"torch {torch_version}"
        text = lock_text(freeze, how)
        new = parse_lock(text)
        previous = LOCK.read_text() if LOCK.exists() else None
        write_atomically(LOCK, text)  # the suite's own lock test reads it
        if not args.no_tests:
            env = dict(os.environ, BERTOLOGY_RUNS=str(Path(tmp) / "runs"))
            result = subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q"], cwd=ROOT, env=env)
            if result.returncode != 0:
                if previous is not None:
                    write_atomically(LOCK, previous)
                print("the suite failed on the new versions: requirements.lock left as it was", file=sys.stderr)
                return 1
    changed = changes(old, new)
    tested = "full suite passed (pins included)" if not args.no_tests else "suite NOT run (--no-tests)"
    message = (f"Lock refresh: {len(changed)} version(s) changed; {tested}\n\n" + "\n".join(changed) + "\n")
    MESSAGE.write_text(message)
    print(message + f"\nwritten: {LOCK}\ncommit message: {MESSAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
