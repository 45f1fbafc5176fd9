"""The `bertology` command line: help on every command, clear errors, non-zero exits."""

import subprocess
import sys

import pytest

from app.cli import main

COMMANDS = [["train"], ["probe", "syntax"], ["data", "verify"], ["data", "fetch"], ["data", "corpus"], ["probe"], ["run"],
            ["runs", "list"], ["runs", "show"], ["runs", "delete"], ["runs", "gc"], ["runs", "reindex"],
            ["app"], ["figures"]]


def test_top_level_help_lists_every_command(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for name in ("data", "train", "probe", "run", "app", "figures", "runs"):
        assert name in out


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_help_on_every_command(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    assert "usage: bertology " + " ".join(command) in capsys.readouterr().out.replace("\n", " ")


def test_errors_are_one_clear_line_and_exit_2(tmp_path, capsys):
    assert main(["runs", "show", "--root", str(tmp_path), "no-such-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bertology: error:") and "no-such-run" in err
    assert main(["figures"]) == 2


def test_bad_usage_exits_non_zero():
    result = subprocess.run([sys.executable, "-m", "app.cli", "data", "frobnicate"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "invalid choice" in result.stderr


def test_runs_list_on_empty_root(tmp_path, capsys):
    assert main(["runs", "list", "--root", str(tmp_path)]) == 0
    assert "no runs" in capsys.readouterr().out
