"""docs/architecture.md's package map lists every module of workbench/, probes/, app/ and bertology/ with the
first sentence of its docstring, one table per package folder. The test regenerates the map from
the source and compares; after adding, moving or re-describing a module run
`python tests/test_architecture_doc.py` to rewrite the section."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
HEADING = "## The package map"
PACKAGES = ("workbench", "probes", "app", "bertology")
SENTENCE_END = re.compile(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)\.(?=\s|$)|:(?=\s)")


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split())
    end = SENTENCE_END.search(text)  # a full stop (not "et al.", "e.g.") or a colon, then a space
    return (text[: end.start()] if end else text).rstrip(".")


def package_map() -> str:
    """The section's text: one table per folder that holds modules, folders in path order."""
    out = [HEADING, "", "Generated from each module's docstring (its first sentence; `python tests/test_architecture_doc.py`",
           "rewrites this section); the docstring has the rest.", ""]
    folders: dict[str, list[Path]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            folders.setdefault(str(path.parent.relative_to(ROOT)), []).append(path)
    for folder in sorted(folders):
        out += [f"### {folder}/", "", "| module | what it is |", "|---|---|"]
        out += [f"| `{p.relative_to(ROOT)}` | {first_sentence(p)} |" for p in folders[folder]]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def current_section() -> tuple[str, str, str]:
    text = DOC.read_text()
    start = text.index(HEADING)
    rest = text[start + len(HEADING):]
    end = rest.find("\n## ")
    section = text[start:] if end < 0 else text[start:start + len(HEADING) + end + 1]
    return text[:start], section, text[start + len(section):]


def test_package_map_lists_every_module_with_its_docstring():
    _, section, _ = current_section()
    assert section == package_map(), "docs/architecture.md's package map is stale: run python tests/test_architecture_doc.py"


if __name__ == "__main__":
    before, _, after = current_section()
    DOC.write_text(before + package_map() + after)
    sys.exit(0)
