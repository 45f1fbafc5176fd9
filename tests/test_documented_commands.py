"""Every command the docs show still exists, with every flag they give it.

README.md and docs/**/*.md are the user's guide: a renamed subcommand or flag that leaves a page
behind fails here rather than in a reader's terminal. Each fenced code block (and each inline code
span of the prose that holds a `bertology` command) is read as shell text (continuation lines
joined, `# comments` dropped, `&&`, `;` and `|` splitting commands); every
`bertology ...` command (any `.../bertology` path, after environment assignments or `nice`) and
every `python benchmarks/SCRIPT.py ...` whose script has an argparse command line is collected.
Each distinct subcommand path (`data verify`, `probe syntax`, `prune`, ...) is then run once with
`--help` in this process (`app.cli.main`, exit 0 expected), the parser that answers is captured,
and each `--flag` the docs give that path must be one of its option strings, exactly (no prefix
abbreviation: a doc should show the flag a user will find in `--help`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import re
import runpy
import shlex
import sys
from collections import defaultdict
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^[ \t]*```([^\n`]*)\n(.*?)^[ \t]*```", re.S | re.M)
SKIP_LANGUAGES = {"python", "py", "yaml", "yml", "json", "toml"}
OPERATORS = {"&&", "||", ";", "|", "&", "(", ")", ";;", "|&", ">", ">>", "<", "2>", "2>&1"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")  # e.g. `bertology probe NAME --help`
SPAN = re.compile(r"`([^`]+)`")  # inline code spans, paired left to right as Markdown pairs them
# Commands the docs cite as ones that do NOT exist (docs/app.md: a page's "no data" hint used to name
# them); the test checks that they indeed do not, instead of skipping them silently.
NOT_COMMANDS = {("bertology", "probe", "prune"), ("bertology", "probe", "distill")}


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _shell_tokens(line: str) -> list[str]:
    """Tokens of one shell line, operators as their own tokens; a line shlex cannot read (an
    unbalanced quote in prose) falls back to whitespace splitting with comments dropped."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        return list(lexer)
    except ValueError:
        return line.split("#", 1)[0].split()


def commands_in(text: str) -> list[tuple[str, list[str]]]:
    """(program, arguments) of every documented command in the fenced code blocks of `text`, then in
    its inline code spans (a span may wrap across lines).

    program is "bertology" or a benchmarks/ script path ("benchmarks/bench_train.py");
    `torchrun ... -m workbench.drivers.train ARGS` and `python -m workbench.drivers.train ARGS` count as
    `bertology train ARGS` (the same parser)."""
    found = []
    for lang, body in FENCE.findall(text):
        if lang.strip().lower() in SKIP_LANGUAGES:
            continue
        for line in re.sub(r"\\\n", " ", body).splitlines():
            _commands_of_line(line, found)
    for span in SPAN.findall(FENCE.sub("", text)):
        if re.search(r"\bbertology ", span):
            _commands_of_line(" ".join(span.split()), found)
    return found


def _commands_of_line(line: str, found: list) -> None:
    segment: list[str] = []
    for token in [*_shell_tokens(line), ";"]:
        if token in OPERATORS or set(token) <= set(";&|()<>"):
            _collect(segment, found)
            segment = []
        else:
            segment.append(token)


def _collect(tokens: list[str], found: list) -> None:
    tokens = [t.strip("[]") for t in tokens]
    for i, token in enumerate(tokens):
        if token.rsplit("/", 1)[-1] == "bertology":
            found.append(("bertology", tokens[i + 1:]))
            return
        if re.fullmatch(r"(.*/)?benchmarks/[\w-]+\.py", token) and i > 0 and "python" in tokens[i - 1]:
            found.append(("benchmarks/" + token.rsplit("/", 1)[-1], tokens[i + 1:]))
            return
        if token == "-m" and i + 1 < len(tokens) and tokens[i + 1] == "workbench.drivers.train":
            found.append(("bertology", ["train", *tokens[i + 2:]]))
            return


def command_path(args: list[str]) -> tuple[str, ...]:
    """The subcommand path of `bertology ARGS`: the command, plus the action of commands that
    have subcommands (`data verify`, `runs show`, `cache prune`) and the probe of `probe`."""
    if not args or args[0].startswith("-"):
        return ()
    path = (args[0],)
    if (args[0] == "probe" or args[0] in _commands_with_actions()) and len(args) > 1 and not args[1].startswith("-"):
        path += (args[1],)
    return path


@functools.lru_cache(maxsize=1)
def _commands_with_actions() -> frozenset[str]:
    """The `bertology` commands that have actions of their own (`data`, `runs`, `cache`)."""
    from app.cli import build_parser

    def actions(parser):
        return next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)

    return frozenset(name for name, sub in actions(build_parser()).choices.items() if actions(sub) is not None)


@functools.lru_cache(maxsize=1)
def _global_options() -> frozenset[str]:
    """The options of `bertology` itself (`--quiet`), which app/cli.py accepts after any command too."""
    from app.cli import build_parser

    return frozenset(o for o in build_parser()._option_string_actions if o.startswith("--") and o != "--help")


def flags_of(args: list[str]) -> set[str]:
    """The long options a command line gives (`--a`, `--b=1` -> {"--a", "--b"}), values and
    short options left aside."""
    return {a.split("=", 1)[0] for a in args if re.match(r"--[A-Za-z]", a)}


def documented(files: list[Path] | None = None) -> dict[tuple[str, ...], dict[str, set[str]]]:
    """{(program, *subcommand path): {flag: {files that show it}}}; a path with no flags maps to {}."""
    table: dict[tuple[str, ...], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for f in files or doc_files():
        where = str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f)
        for program, args in commands_in(f.read_text(encoding="utf-8")):
            path = (program, *command_path(args)) if program == "bertology" else (program,)
            if any(PLACEHOLDER.match(p) for p in path[1:]):
                continue
            entry = table[path]
            for flag in flags_of(args):
                entry[flag].add(where)
    return table


def help_of(path: tuple[str, ...]) -> tuple[int, set[str] | None, str]:
    """Run `PATH --help` in this process: (exit code, option strings of the parser that printed
    the help or None when no argparse help action ran, the text printed)."""
    captured: list[argparse.ArgumentParser] = []
    original = argparse._HelpAction.__call__

    def record(self, parser, namespace, values, option_string=None):
        captured.append(parser)
        original(self, parser, namespace, values, option_string)

    out = io.StringIO()
    argparse._HelpAction.__call__ = record
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            if path[0] == "bertology":
                from app.cli import main

                code = main([*path[1:], "--help"])
            else:
                argv = sys.argv
                sys.argv = [str(ROOT / path[0]), "--help"]
                try:
                    runpy.run_path(str(ROOT / path[0]), run_name="__main__")
                    code = "returned without exiting"
                finally:
                    sys.argv = argv
    except SystemExit as stop:
        code = stop.code or 0
    except Exception as error:  # an import that fails: the command does not work either
        code = f"{type(error).__name__}: {error}"
    finally:
        argparse._HelpAction.__call__ = original
    options = set(captured[-1]._option_string_actions) if captured else None
    return code, options, out.getvalue()


def problems(table: dict[tuple[str, ...], dict[str, set[str]]]) -> list[str]:
    """One line per documented command path that does not answer --help with exit 0, and per flag
    the docs show that its parser does not have."""
    lines = []
    for path, flags in sorted(table.items()):
        code, options, text = help_of(path)
        shown = " ".join(path)
        if code != 0:
            last = (text.strip().splitlines() or [""])[-1]
            lines.append(f"`{shown} --help` exited {code}: {last}")
            continue
        if options is None:  # a hand-printed help (`bertology probe --help`): its text is all there is
            options = set(re.findall(r"--[A-Za-z][\w-]*", text))
        if path[0] == "bertology":  # `bertology --quiet` is also accepted after any command
            options |= _global_options()
        for flag in sorted(set(flags) - options):
            lines.append(f"`{shown}` has no {flag} (shown in {', '.join(sorted(flags[flag]))})")
    return lines


def _benchmark_has_cli(script: str) -> bool:
    source = (ROOT / script).read_text(encoding="utf-8")
    return "argparse" in source and '__name__ == "__main__"' in source


# --------------------------------------------------------------------------- the real docs
def test_the_docs_show_commands_of_every_kind():
    """The extraction reads what the docs hold (guards against a parser that finds nothing)."""
    table = documented()
    paths = {p[:2] for p in table if p[0] == "bertology"}
    for expected in [("bertology", c) for c in ("data", "train", "run", "finetune", "distill", "peft", "prune",
                                                "probe", "runs", "cache", "cost", "figures", "generate", "app")]:
        assert expected in paths, expected
    assert {p[:3] for p in table if p[:2] == ("bertology", "probe")} >= {
        ("bertology", "probe", n) for n in ("syntax", "coref", "cloze", "membership", "align", "extraction")}
    assert any(p[0].startswith("benchmarks/") for p in table)


def test_every_documented_command_answers_help_and_has_every_documented_flag(monkeypatch, tmp_path):
    monkeypatch.setenv("BERTOLOGY_RUNS", str(tmp_path / "runs"))
    table = {p: f for p, f in documented().items() if p[0] == "bertology" or _benchmark_has_cli(p[0])}
    assert len(table) > 20
    assert problems({p: f for p, f in table.items() if p not in NOT_COMMANDS}) == []
    for path in NOT_COMMANDS & set(table):
        assert help_of(path)[0] == 2, path


# --------------------------------------------------------------------------- the check itself
SNIPPET = """
Text with `bertology prune x.yaml
--inline-flag` inline, wrapped; `a span` then prose naming bertology --not-a-flag then `another`.

```bash
HF_HUB_OFFLINE=1 nice -n 10 .venv/bin/bertology prune experiments/prune/minilm_polarity_cpu.yaml \\
    --seeds 0,1 --no-such-flag 3   # a comment --comment-flag
bertology data verify --quiet && bertology runs show RUN_ID --manifest-only | head
for S in 0 1; do bertology probe syntax --checkpoint X --tasks upos --made-up=2 & done
torchrun --nproc_per_node 2 -m workbench.drivers.train CONFIG.yaml --seeds 1
.venv/bin/python benchmarks/report.py --readme docs/benchmarks.md
```

```python
main(["bertology", "--python-is-not-read"])
```
"""


def test_the_extraction_reads_shell_lines_as_a_shell_would():
    commands = commands_in(SNIPPET)
    assert commands == [
        ("bertology", ["prune", "experiments/prune/minilm_polarity_cpu.yaml", "--seeds", "0,1", "--no-such-flag", "3"]),
        ("bertology", ["data", "verify", "--quiet"]),
        ("bertology", ["runs", "show", "RUN_ID", "--manifest-only"]),
        ("bertology", ["probe", "syntax", "--checkpoint", "X", "--tasks", "upos", "--made-up=2"]),
        ("bertology", ["train", "CONFIG.yaml", "--seeds", "1"]),
        ("benchmarks/report.py", ["--readme", "docs/benchmarks.md"]),
        ("bertology", ["prune", "x.yaml", "--inline-flag"]),
    ]
    assert command_path(commands[0][1]) == ("prune",) and command_path(commands[3][1]) == ("probe", "syntax")
    assert command_path(commands[2][1]) == ("runs", "show")


def test_a_flag_no_parser_has_fails_and_names_the_page(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(SNIPPET)
    found = problems(documented([page]))
    assert found == [
        f"`bertology probe syntax` has no --made-up (shown in {page})",
        f"`bertology prune` has no --inline-flag (shown in {page})",
        f"`bertology prune` has no --no-such-flag (shown in {page})",
    ]
    renamed = tmp_path / "renamed.md"
    renamed.write_text("```bash\nbertology prunes x.yaml\nbertology probe nosuchprobe --tasks a\n```\n")
    lines = problems(documented([renamed]))
    assert len(lines) == 2 and all("exited 2" in line for line in lines), lines
    assert lines[0].startswith("`bertology probe nosuchprobe --help` exited 2")


# --------------------------------------------------------------------------- links between pages
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors_of(text: str) -> set[str]:
    prose = FENCE.sub("", text)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", prose, re.M):
        slug = _slug(heading)
        out.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return out


def _where(f: Path) -> str:
    return str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else f.name


def broken_links(files: list[Path]) -> list[str]:
    """One line per relative link (outside code) whose file or #anchor does not exist."""
    lines = []
    for f in files:
        for target in LINK.findall(FENCE.sub("", f.read_text(encoding="utf-8"))):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (f.parent / path).resolve() if path else f
            if not dest.exists():
                lines.append(f"{_where(f)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest.read_text(encoding="utf-8")):
                lines.append(f"{_where(f)}: {target} (no such heading)")
    return lines


def test_every_relative_link_in_the_docs_resolves():
    assert broken_links(doc_files()) == []


def test_a_link_to_a_moved_section_is_reported(tmp_path):
    (tmp_path / "guide.md").write_text("# Guide\n\n## Kept here\n\n[ok](#kept-here) [moved](#measured-on-cpu)\n"
                                       "[page](evidence/x.md#measured-on-cpu) [gone](nothing.md)\n")
    (tmp_path / "evidence").mkdir()
    (tmp_path / "evidence" / "x.md").write_text("# X\n\n```bash\n# Not a heading\n```\n\n## Measured on CPU\n")
    assert broken_links([tmp_path / "guide.md"]) == [
        "guide.md: #measured-on-cpu (no such heading)", "guide.md: nothing.md (no such file)"]
    assert anchors_of("## A: `b` (c, 1)\n## A: `b` (c, 1)\n") == {"a-b-c-1", "a-b-c-1-1"}


def test_the_benchmark_table_lives_between_one_marker_pair_of_docs_benchmarks(tmp_path):
    """`benchmarks/report.py --readme docs/benchmarks.md` (the command the docs give) finds its markers
    there, once, and the README no longer carries a copy that would go stale."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import report
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page.count(report.START) == 1 and page.count(report.END) == 1
    assert page.index(report.START) < page.index(report.END)
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert report.START not in readme and "report.py --readme docs/benchmarks.md" in readme
