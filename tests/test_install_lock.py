"""The install lock (issue 48): `requirements.lock` holds every dependency at an exact version, inside
the bounds `pyproject.toml` states, and it is what the README's install line, `.ci/run` and this test
run install. Without it a fresh clone takes yesterday's releases and the suite tests other code than
the last landing did."""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements.lock"
sys.path.insert(0, str(ROOT / "tools"))
import refresh_lock  # noqa: E402  (a standalone script, not a package)


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    return [Requirement(r) for r in declared]


def test_every_declared_dependency_is_locked_inside_its_bounds():
    locked = refresh_lock.parse_lock(LOCK.read_text())
    for requirement in declared_requirements():
        name = normalise(requirement.name)
        assert name in locked, f"{requirement.name} is declared in pyproject.toml but not in requirements.lock"
        assert requirement.specifier.contains(Version(locked[name])), (
            f"requirements.lock has {name}=={locked[name]}, outside pyproject's {requirement}")


def test_every_lower_bound_is_a_release_the_lock_could_have_tested():
    """A lower bound above the locked version would make the lock uninstallable; one far below states
    a compatibility nobody tested: each bound names the locked release line (major.minor) or an older one."""
    locked = refresh_lock.parse_lock(LOCK.read_text())
    for requirement in declared_requirements():
        lower = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert lower, f"{requirement} has no lower bound"
        assert lower[0] <= Version(locked[normalise(requirement.name)])


def test_the_installed_environment_is_the_lock():
    """The suite runs on the locked versions (CI installs through the lock). A package installed at
    another version means this environment was not installed with the README's line."""
    locked = refresh_lock.parse_lock(LOCK.read_text())
    drifted = {}
    for name, version in locked.items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            drifted[name] = (version, "absent")
            continue
        if Version(installed).public != Version(version).public:  # torch's +cpu build label is allowed
            drifted[name] = (version, installed)
    assert not drifted, (f"installed versions differ from requirements.lock {drifted}; reinstall with "
                         f"pip install -c requirements.lock torch && pip install -c requirements.lock -e '.[dev]'")


def test_the_readme_and_ci_install_through_the_lock():
    readme = (ROOT / "README.md").read_text()
    first_command = readme.split("```bash\n", 1)[1].split("\n", 1)[0]
    ci = (ROOT / ".ci" / "run").read_text()
    for where, text in (("README.md's install line", first_command), (".ci/run", ci)):
        installs = [part for part in re.split(r"&&|\n", text) if "pip install" in part and "--upgrade" not in part]
        assert installs, where
        assert all("-c requirements.lock" in part for part in installs), (where, installs)


def test_a_refreshed_lock_drops_the_editable_project_and_the_torch_build_label():
    freeze = "torch==2.13.0+cpu\nNumPy==2.4.6\n-e git+https://x/y@abc#egg=bertology_workbench\nfoo @ file:///tmp/foo\n"
    text = refresh_lock.lock_text(freeze, "test")
    assert refresh_lock.parse_lock(text) == {"numpy": "2.4.6", "torch": "2.13.0"}
    assert refresh_lock.changes({"numpy": "2.4.5", "old": "1"}, {"numpy": "2.4.6", "new": "2"}) == [
        "new (new) -> 2", "numpy 2.4.5 -> 2.4.6", "old 1 -> (removed)"]


def test_a_malformed_lock_line_is_refused():
    with pytest.raises(SystemExit, match="not NAME==VERSION"):
        refresh_lock.parse_lock("numpy>=2\n")
