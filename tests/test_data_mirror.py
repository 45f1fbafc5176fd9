"""`bertology data verify` / `fetch` against the real data root and altered copies of it."""

import shutil
import subprocess
import sys

import pytest

from workbench.data.mirror import fetch, read_checksums, verify
from workbench.errors import DataFormatError
from workbench.io import sha256_file
from workbench.paths import data_root

SAMPLE = ["gap/gap-development.tsv", "nltk/swadesh/en", "ud/en_pud/en_pud-ud-test.conllu"]


def _bertology(*args, env_root=None):
    import os

    env = dict(os.environ)
    if env_root is not None:
        env["BERTOLOGY_DATA"] = str(env_root)
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True, text=True, env=env)


@pytest.fixture
def small_mirror(tmp_path):
    """A data root holding three real files and a SHA256SUMS listing exactly them."""
    real = data_root()
    sums = read_checksums(real / "SHA256SUMS")
    mirror = tmp_path / "mirror"
    lines = []
    for name in SAMPLE:
        (mirror / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(real / name, mirror / name)
        lines.append(f"{sums[name]}  ./{name}")
    (mirror / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    return mirror


def test_real_data_root_verifies():
    report = verify(data_root(), progress=False)
    assert report.ok, report.summary()
    assert report.checked == len(read_checksums(data_root() / "SHA256SUMS")) > 4000


def test_cli_verify_passes_on_a_small_mirror(small_mirror):
    # The real root is hashed once, above; the CLI is checked on three real files (BERTOLOGY_DATA
    # and --root both name the root).
    for args, env_root in ((("--quiet",), small_mirror), (("--quiet", "--root", str(small_mirror)), None)):
        result = _bertology("data", "verify", *args, env_root=env_root)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"data root {small_mirror}: 3 files checked, 0 missing, 0 corrupt"


def test_verify_reports_altered_and_removed_files(small_mirror):
    with open(small_mirror / SAMPLE[0], "ab") as f:
        f.write(b"x")
    (small_mirror / SAMPLE[1]).unlink()
    report = verify(small_mirror, progress=False)
    assert not report.ok
    assert report.corrupt == [SAMPLE[0]]
    assert report.missing == [SAMPLE[1]]
    result = _bertology("data", "verify", "--quiet", env_root=small_mirror)
    assert result.returncode == 2
    assert f"corrupt (checksum differs): {SAMPLE[0]}" in result.stdout
    assert f"missing: {SAMPLE[1]}" in result.stdout


def test_fetch_copies_verifies_and_skips_corrupt(small_mirror, tmp_path):
    dest = tmp_path / "dest"
    report = fetch(small_mirror, dest, progress=False)
    assert report.ok, report.summary()
    for name in SAMPLE:
        assert sha256_file(dest / name) == sha256_file(data_root() / name)
    # A corrupt file in the mirror is reported and never lands in the destination.
    with open(small_mirror / SAMPLE[2], "ab") as f:
        f.write(b"corruption")
    dest2 = tmp_path / "dest2"
    report = fetch(small_mirror.as_uri(), dest2, progress=False)
    assert report.corrupt == [SAMPLE[2]]
    assert not (dest2 / SAMPLE[2]).exists()
    assert not [p for p in (dest2 / SAMPLE[2]).parent.iterdir() if p.name.endswith(".tmp")]


def test_malformed_checksum_file_names_line(tmp_path):
    (tmp_path / "SHA256SUMS").write_text("a" * 64 + "  ./ok\nnot-a-digest  ./bad\n")
    with pytest.raises(DataFormatError, match=r"SHA256SUMS:2:"):
        read_checksums(tmp_path / "SHA256SUMS")


def test_missing_data_root_is_a_clear_error(tmp_path):
    result = _bertology("data", "verify", env_root=tmp_path / "nowhere")
    assert result.returncode == 2
    assert "does not exist" in result.stderr
