"""Verify the data root against `SHA256SUMS` and fetch the data sets from a mirror.

The data root (see `workbench.paths.data_root`) holds public data sets copied unchanged from their
sources; `SHA256SUMS` (the `sha256sum` format, paths relative to the root) is the contract that
every reader and every run manifest relies on.
"""

from __future__ import annotations

import shutil
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from workbench.errors import DataFormatError, DataRootError
from workbench.io import atomic_path, sha256_file
from workbench.progress import progress as progress_bar

CHECKSUM_FILE = "SHA256SUMS"


def read_checksums(path: str | Path) -> dict[str, str]:
    """Parse a `sha256sum` file into {relative path: hex digest}."""
    path = Path(path)
    if not path.is_file():
        raise DataRootError(f"{path} is missing: cannot verify or fetch without a checksum list")
    sums: dict[str, str] = {}
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        digest, sep, name = line.partition("  ")
        if not sep:  # `sha256sum -b` writes "digest *name"
            digest, sep, name = line.partition(" *")
        if not sep or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest.lower()):
            raise DataFormatError(path, lineno, f"expected '<sha256>  <path>', got {line[:80]!r}")
        name = name.removeprefix("./")
        if name.startswith("/") or ".." in Path(name).parts:
            raise DataFormatError(path, lineno, f"path {name!r} escapes the data root")
        sums[name] = digest.lower()
    return sums


@dataclass
class VerifyReport:
    root: Path
    checked: int = 0
    missing: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.corrupt

    def summary(self) -> str:
        lines = [f"data root {self.root}: {self.checked} files checked, "
                 f"{len(self.missing)} missing, {len(self.corrupt)} corrupt"]
        lines += [f"  missing: {name}" for name in self.missing]
        lines += [f"  corrupt (checksum differs): {name}" for name in self.corrupt]
        return "\n".join(lines)


def verify(root: str | Path, progress: bool = True) -> VerifyReport:
    """Check every file listed in `root/SHA256SUMS`; report what is missing or altered."""
    root = Path(root)
    sums = read_checksums(root / CHECKSUM_FILE)
    report = VerifyReport(root=root)
    for name, digest in progress_bar(sorted(sums.items()), desc="verify", unit="file", disable=not progress):
        report.checked += 1
        path = root / name
        if not path.is_file():
            report.missing.append(name)
        elif sha256_file(path) != digest:
            report.corrupt.append(name)
    return report


def _is_url(source: str) -> bool:
    return urllib.parse.urlparse(source).scheme in {"http", "https", "file"}


def _copy_from(source: str, name: str, dest: Path) -> None:
    """Copy one file of the mirror to `dest` (a temporary path)."""
    if _is_url(source):
        url = source.rstrip("/") + "/" + urllib.parse.quote(name)
        with urllib.request.urlopen(url, timeout=60) as response, open(dest, "wb") as out:
            shutil.copyfileobj(response, out)
    else:
        shutil.copyfile(Path(source) / name, dest)


def fetch(source: str | Path, root: str | Path, progress: bool = True) -> VerifyReport:
    """Copy (folder) or download (http/https/file URL) every data file from a mirror into `root`.

    The mirror has the data root's layout with its own `SHA256SUMS`. Files already present with the
    right checksum are skipped; each new file is written to a temporary name, verified, then renamed,
    so an interrupted fetch leaves only whole, verified files and can simply be run again.
    """
    source = str(source)
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with atomic_path(root / CHECKSUM_FILE) as tmp:
        _copy_from(source, CHECKSUM_FILE, tmp)
        sums = read_checksums(tmp)
    report = VerifyReport(root=root)
    for name, digest in progress_bar(sorted(sums.items()), desc="fetch", unit="file", disable=not progress):
        report.checked += 1
        target = root / name
        if target.is_file() and sha256_file(target) == digest:
            continue
        try:
            with atomic_path(target) as tmp:
                _copy_from(source, name, tmp)
                if sha256_file(tmp) != digest:
                    report.corrupt.append(name)
                    raise _ChecksumMismatch
        except _ChecksumMismatch:
            continue
        except (OSError, urllib.error.URLError) as err:
            report.missing.append(f"{name} ({err})")
    return report


class _ChecksumMismatch(Exception):
    pass
