"""One progress and logging facility (`workbench.progress`, issue 41 item 5): a bar on a terminal,
plain periodic lines in a log file, `logging` for messages, `--quiet` on every command."""

from __future__ import annotations

import hashlib
import io
import logging

import pytest
from tqdm import tqdm

import workbench.progress as wp
from app.cli import build_parser, main


class FakeClock:
    """A clock the test moves: the periods are checked without sleeping."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def loud(monkeypatch):
    """Every test starts (and the next one starts again) with quiet off."""
    monkeypatch.delenv(wp.QUIET_ENV, raising=False)
    wp.set_quiet(False)
    yield
    wp.set_quiet(False)


def test_a_log_file_gets_plain_lines_at_the_set_period_and_no_carriage_return(capsys):
    clock = FakeClock()
    bar = wp.progress(total=200, desc="train", unit="step", interval=10, clock=clock, stream=io.StringIO())
    assert isinstance(bar, wp.LineProgress)
    for _ in range(100):  # one step a second for 100 s
        clock.now += 1
        bar.update(1)
        if bar.n == 40:
            bar.set_postfix(loss="2.310")
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.strip().splitlines()
    # a line every 10 s (steps 10, 20, ..., 100), then the last one
    assert len(lines) == 11, err
    assert lines[0].endswith("train: 10/200 step (5%) 10 s elapsed, ~3.2 min left")
    assert lines[3].endswith("train: 40/200 step (20%) 40 s elapsed, ~2.7 min left")
    assert lines[4].endswith("train: 50/200 step (25%) 50 s elapsed, ~2.5 min left, loss=2.310")  # the postfix
    assert lines[-1].endswith("train: 100/200 step done in 100 s, loss=2.310")
    # a timestamp leads each line in a file: `YYYY-mm-dd HH:MM:SS message`
    assert all(len(line.split(" ", 2)[0]) == 10 and line[4] == "-" for line in lines)


def test_plain_lines_go_through_logging_and_short_jobs_write_nothing(caplog):
    caplog.set_level(logging.INFO, logger="bertology")
    clock = FakeClock()
    for _ in wp.progress(range(5), desc="quick", interval=30, clock=clock, stream=io.StringIO()):
        clock.now += 1  # 5 s: under one period
    assert caplog.records == []
    for _ in wp.progress(range(3), desc="slow", interval=30, clock=clock, stream=io.StringIO()):
        clock.now += 20  # an iterable: the update follows each item
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [
        ("bertology.progress", logging.INFO, "slow: 2/3 it (67%) 40 s elapsed, ~20 s left"),
        ("bertology.progress", logging.INFO, "slow: 3/3 it done in 60 s"),
    ]


def test_a_terminal_gets_a_tqdm_bar():
    tty = Terminal()
    bar = wp.progress(range(7), desc="on a terminal", unit="file", stream=tty)
    assert isinstance(bar, tqdm)
    assert list(bar) == list(range(7))
    shown = tty.getvalue()
    assert "\r" in shown and "on a terminal" in shown and "7/7" in shown


def test_quiet_and_disable_show_nothing_and_keep_the_interface(capsys):
    tty = Terminal()
    wp.set_quiet(True)
    assert wp.is_quiet() and logging.getLogger("bertology").level == logging.WARNING
    bar = wp.progress(range(4), desc="hidden", stream=tty, interval=0)
    assert isinstance(bar, wp.SilentProgress) and list(bar) == [0, 1, 2, 3] and bar.n == 4
    wp.set_quiet(False)
    with wp.progress(total=3, disable=True, stream=tty) as bar:
        bar.update(3)
        bar.set_postfix(loss=1.0)
    assert tty.getvalue() == "" and capsys.readouterr().err == ""


def test_messages_read_warning_and_info_plain(capsys):
    log = wp.get_logger("tests.progress")
    assert log.name == "bertology.tests.progress"
    log.info("hello")
    log.warning("careful")
    err = capsys.readouterr().err.splitlines()
    assert err[0].endswith(" hello") and err[1].endswith(" warning: careful")


def test_every_subcommand_accepts_quiet():
    parser = build_parser()
    assert parser.parse_args(["--quiet", "runs", "list"]).quiet is True
    assert parser.parse_args(["runs", "list"]).quiet is False
    for argv in (["runs", "list"], ["runs", "gc"], ["cache", "list"], ["data", "verify"], ["cost", "x"],
                 ["figures"], ["run", "x.yaml"], ["prune", "x.yaml"], ["peft", "x.yaml"], ["distill", "x.yaml"],
                 ["finetune"], ["app"]):
        assert parser.parse_args(argv + ["--quiet"]).quiet is True, argv


def _tiny_root(tmp_path, corrupt: bool = False):
    root = tmp_path / "data"
    lines = []
    for i in range(4):
        path = root / f"part{i}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"file {i}\n")
        lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  ./part{i}.txt")
    (root / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    if corrupt:
        (root / "part2.txt").write_text("changed\n")
    return root


def test_quiet_silences_progress_but_not_the_output_or_errors(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(wp, "DEFAULT_INTERVAL", 0.0)  # a line at every file: the job need not last 30 s
    root = _tiny_root(tmp_path)
    summary = f"data root {root}: 4 files checked, 0 missing, 0 corrupt"
    assert main(["data", "verify", "--root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == summary
    lines = [line.split(" ", 2)[2] for line in err.strip().splitlines()]  # after the timestamp
    assert "\r" not in err and len(lines) == 5, err
    for k, line in enumerate(lines[:4], start=1):
        assert line.startswith(f"verify: {k}/4 file ({25 * k}%) ") and " elapsed" in line, line
    assert lines[4].startswith("verify: 4/4 file done in "), lines[4]
    for argv in (["data", "verify", "--root", str(root), "--quiet"], ["--quiet", "data", "verify", "--root", str(root)]):
        assert main(argv) == 0
        out, err = capsys.readouterr()
        assert out.strip() == summary and err == ""
    assert not wp.is_quiet()  # main() leaves the switch as it found it
    # the command's result still prints, on stdout, when it reports a problem (exit 2)
    bad = _tiny_root(tmp_path / "bad", corrupt=True)
    assert main(["--quiet", "data", "verify", "--root", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert "1 corrupt" in out and "corrupt (checksum differs): part2.txt" in out and err == ""
    # an error still reads as one line on stderr
    assert main(["--quiet", "data", "verify", "--root", str(tmp_path / "nowhere")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("bertology: error:") and "SHA256SUMS is missing" in err


def test_quiet_drops_info_messages_and_keeps_warnings(tmp_path, capsys, monkeypatch):
    import workbench.store.results

    real = workbench.store.results.format_runs

    def format_runs(runs):  # a message of each kind while the real command runs
        log = wp.get_logger("workbench.store.results")
        log.info("an info message")
        log.warning("a warning")
        return real(runs)

    monkeypatch.setattr(workbench.store.results, "format_runs", format_runs)
    for quiet in (False, True):
        assert main(["runs", "list", "--root", str(tmp_path / "runs")] + ["--quiet"] * quiet) == 0
        out, err = capsys.readouterr()
        assert "no runs" in out
        assert ("an info message" in err) is not quiet and "warning: a warning" in err


def test_the_environment_switch_holds_under_the_cli(tmp_path, capsys, monkeypatch):
    """`BERTOLOGY_QUIET=1` (what worker processes inherit) is quiet without `--quiet`."""
    monkeypatch.setattr(wp, "DEFAULT_INTERVAL", 0.0)
    monkeypatch.setenv(wp.QUIET_ENV, "1")
    root = _tiny_root(tmp_path)
    assert main(["data", "verify", "--root", str(root)]) == 0
    out, err = capsys.readouterr()
    assert "4 files checked" in out and err == ""
    assert wp.is_quiet()


@pytest.mark.parametrize("argv", [["train", "--quiet", "--help"], ["--quiet", "train", "--help"],
                                  ["generate", "--help", "--quiet"], ["probe", "syntax", "--quiet", "--help"]])
def test_commands_with_their_own_parser_take_quiet(argv, capsys):
    """generate parses its own options (which know no --quiet): it is taken out for it; train's
    subcommand (the driver registry's, since issue 51) and probe's take it themselves."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 0
    assert "usage: " in capsys.readouterr().out
