"""The package build: what the sdist and the wheel carry, and a missing compiler's message."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def source_copy(tmp_path: Path) -> Path:
    """The files a build reads, copied: building in the checkout would leave build/ behind."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("probing", "native"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "_native"))
    return source


def test_the_wheel_carries_the_native_helper_the_pth_and_the_script(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("probing-*.whl")
    assert "py3-none-any" not in wheel.name  # compiled code: a platform wheel
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "probing/_native/libprobing-helper.so",
        "probing/_native/probing-inject",
        "probing-autostart.pth",
        "probing/bootstrap/attach.py",
        "probing/bootstrap/loader.py",
        "probing/bootstrap/sitecustomize.py",
    ):
        assert needed in names, needed
    assert any(name.endswith(".data/scripts/probing") for name in names)


def test_the_sdist_carries_what_the_build_needs(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    (sdist,) = tmp_path.glob("probing-*.tar.gz")
    names = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
    for needed in ("native/helper.c", "native/inject.c", "setup.py", "probing/agent/probing-autostart.pth",
                   "probing/bootstrap/attach.py", "probing/cli/bin/probing"):  # fmt: skip
        assert needed in names, needed


def test_a_missing_compiler_is_a_clear_install_error(tmp_path: Path) -> None:
    environment = {key: value for key, value in os.environ.items() if key != "CC"}
    environment["PATH"] = str(tmp_path)  # no cc, gcc or clang here
    result = subprocess.run(
        [sys.executable, "setup.py", "build"],
        cwd=source_copy(tmp_path),
        env=environment,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0
    assert "probing: no C compiler found" in result.stderr and "apt-get install gcc" in result.stderr
