"""The package build: what the sdist and the wheel carry, a missing compiler's message, and
`pip install probing` on every CPython 3.8-3.15 taking wheels only.

Builds run in a copy of the sources under the test's temporary directory: building in the
checkout would leave build/ and probing.egg-info behind in the source tree.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import Dict, List

import pytest

from support import Target, interpreter_params

ROOT = Path(__file__).resolve().parents[2]

# The oldest CPython the CLI installs on. 3.8 has no wheel of any DuckDB after 1.2.2, and
# DuckDB 1.3.2 still claims 3.8, so a plain `pip install` there would compile DuckDB from
# source (12+ minutes); 3.8 jobs are inspected by a CLI installed on a newer Python, through
# the agent loaded by file path (tests/integration/test_attach.py runs on every interpreter).
CLI_FLOOR = (3, 9)
CLI_VERSIONS = ("3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15")


def source_copy(tmp_path: Path) -> Path:
    """The files a build reads, copied: building in the checkout would leave build/ behind."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("probing", "native"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "_native"))
    return source


def build_wheel(source: Path, into: Path) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(into),
         str(source)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    (wheel,) = into.glob("probing-*.whl")
    return wheel


def platform_tag() -> str:
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def test_the_wheel_carries_the_native_helper_the_pth_and_the_script(tmp_path: Path) -> None:
    wheel = build_wheel(source_copy(tmp_path), tmp_path / "dist")
    # Standalone native parts, no extension module: one wheel serves every CPython.
    assert wheel.name.endswith(f"-py3-none-{platform_tag()}.whl"), wheel.name
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
    assert any(name.endswith(".data/scripts/probing") for name in names)  # the native front end
    assert any(name.endswith(".data/scripts/probing-python") for name in names)
    assert not any(name.endswith(".so") and "cpython" in name for name in names)


def test_the_sdist_carries_what_the_build_needs(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path)],
        cwd=source_copy(tmp_path),
        check=True,
        capture_output=True,
    )
    (sdist,) = tmp_path.glob("probing-*.tar.gz")
    names = {name.split("/", 1)[1] for name in tarfile.open(sdist).getnames() if "/" in name}
    for needed in ("native/helper.c", "native/inject.c", "native/inject.h", "native/borrow.c", "setup.py",
                   "probing/agent/probing-autostart.pth", "probing/bootstrap/attach.py",
                   "probing/cli/bin/probing-python", "native/front/main.c", "native/front/front.h",
                   "native/front/gen_tables.py"):  # fmt: skip
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


def test_requires_python_says_the_cli_floor() -> None:
    metadata = (ROOT / "pyproject.toml").read_text()
    floor = ".".join(map(str, CLI_FLOOR))
    assert re.search(rf'^requires-python = ">={re.escape(floor)}"$', metadata, re.MULTILINE)
    for version in CLI_VERSIONS:
        supported = tuple(map(int, version.split("."))) >= CLI_FLOOR
        classifier = f'"Programming Language :: Python :: {version}"'
        assert (classifier in metadata) == supported, classifier


# --- pip install, wheels only, on every interpreter (marker: install) -------------------------


def pip_environment(cache: Path) -> Dict[str, str]:
    """pip's cache in the test's temporary directory: nothing is kept between runs, so every
    run really asks the registry what a new user would get. Few retries: an unreachable
    registry is a skip, found out in seconds."""
    environment = dict(
        os.environ,
        PIP_CACHE_DIR=str(cache),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_RETRIES="2",
        PIP_DEFAULT_TIMEOUT="30",
    )
    environment.pop("PIP_REQUIRE_VIRTUALENV", None)
    environment.pop("PROBING", None)
    return environment


# What pip says when it cannot reach the registry at all (as opposed to finding no wheel).
UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Temporary failure in name resolution"
    r"|Name or service not known|Network is unreachable|ConnectTimeoutError|Read timed out"
)


def pip_or_skip(command: List[str], environment: Dict[str, str]) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """Run pip; skip the test, saying why, when the failure is that the registry is out of
    reach. Any other failure is the test's to judge."""
    result = subprocess.run(command, capture_output=True, text=True, env=environment, timeout=400)
    if result.returncode != 0:
        unreachable = UNREACHABLE.search(result.stderr)
        if unreachable:
            pytest.skip(f"the package registry cannot be reached ({unreachable.group(0)})")
    return result


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """probing built once as a wheel, as a release would upload it."""
    tmp = tmp_path_factory.mktemp("wheel")
    return build_wheel(source_copy(tmp), tmp / "dist")


@pytest.fixture(scope="module")
def pip_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by the interpreters of one run (the psutil, click and py-spy wheels are the same
    for all), and removed with the run's temporary directory."""
    return tmp_path_factory.mktemp("pip-cache")


# Every module of the installed package imports on the venv's Python: mypy checks the CLI as
# 3.10 (it cannot target 3.9), so this is what catches 3.10-only code on 3.9. __main__ would run
# the CLI and bootstrap/ starts agents; torch is not installed there.
IMPORT_EVERY_MODULE = """
import importlib, pkgutil, probing
failed = []
for module in pkgutil.walk_packages(probing.__path__, "probing."):
    if module.name.endswith("__main__") or module.name.startswith("probing.bootstrap"):
        continue
    try:
        importlib.import_module(module.name)
    except ModuleNotFoundError as error:
        # torch is the job's; the MCP SDK (and its anyio) is the probing[mcp] extra's.
        extra = module.name.startswith("probing.mcp.") and error.name in ("mcp", "anyio")
        optional = error.name == "torch" or extra
        if not optional:
            failed.append(f"{module.name}: {error!r}")
    except Exception as error:
        failed.append(f"{module.name}: {error!r}")
print("\\n".join(failed))
raise SystemExit(1 if failed else 0)
"""


def cli_interpreters() -> List[object]:
    return [param for param in interpreter_params() if param.id in CLI_VERSIONS]  # type: ignore[attr-defined]


def fresh_venv(python: str, where: Path) -> Path:
    subprocess.run([python, "-m", "venv", str(where)], check=True, capture_output=True, timeout=120)
    return where / "bin"


@pytest.mark.install
@pytest.mark.timeout(600)
@pytest.mark.parametrize("python", cli_interpreters())
def test_pip_install_takes_wheels_only(
    python: str, built_wheel: Path, pip_cache: Path, tmp_path: Path
) -> None:
    """What plain `pip install probing` resolves on this interpreter is wheels only; installing
    them with sdists forbidden works; the CLI it installs answers a query. An interpreter below
    the floor is refused by pip, naming requires-python, before anything is downloaded."""
    bin_dir = fresh_venv(python, tmp_path / "venv")
    environment = pip_environment(pip_cache)
    version = subprocess.run(
        [str(bin_dir / "python"), "-c", "import sys; print(sys.version_info[0], sys.version_info[1])"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if (int(version[0]), int(version[1])) < CLI_FLOOR:
        # --no-deps: the refusal is about probing itself and needs no registry.
        refused = subprocess.run(
            [str(bin_dir / "pip"), "install", "--no-deps", str(built_wheel)],
            capture_output=True, text=True, env=environment, timeout=300,
        )  # fmt: skip
        assert refused.returncode != 0
        assert "requires a different Python" in refused.stderr, refused.stderr
        assert ">=" + ".".join(map(str, CLI_FLOOR)) in refused.stderr
        return

    # Plain resolution, as a user's `pip install probing` does it: pip takes the newest release
    # that claims this Python, sdist or not, so this is where a compile would sneak in.
    report = tmp_path / "report.json"
    dry_run = pip_or_skip(
        [str(bin_dir / "pip"), "install", "--dry-run", "--quiet", "--report", str(report), str(built_wheel)],
        environment,
    )
    assert dry_run.returncode == 0, dry_run.stderr
    resolved = {
        item["metadata"]["name"].lower(): (item["metadata"]["version"], item["download_info"]["url"])
        for item in json.loads(report.read_text())["install"]
    }
    sdists = {name: url for name, (_, url) in resolved.items() if not url.endswith(".whl")}
    assert not sdists, f"plain pip install would build from source: {sdists}"

    installed = pip_or_skip(
        [str(bin_dir / "pip"), "install", "--only-binary=:all:", str(built_wheel)], environment
    )
    assert installed.returncode == 0, installed.stderr
    listed = subprocess.run(
        [str(bin_dir / "pip"), "list", "--format", "json"], capture_output=True, text=True, env=environment
    )
    versions = {package["name"].lower(): package["version"] for package in json.loads(listed.stdout)}
    for name, (wanted, _) in resolved.items():
        assert versions.get(name) == wanted, (name, versions.get(name), wanted)

    imported = subprocess.run(
        [str(bin_dir / "python"), "-c", IMPORT_EVERY_MODULE], capture_output=True, text=True, timeout=120
    )
    assert imported.returncode == 0, imported.stdout + imported.stderr

    # The installed CLI works on this Python (DuckDB, numpy and click as installed here): the
    # job runs with the agent from the same environment, the CLI queries it.
    with Target("sleeper.py", python=str(bin_dir / "python"), via="env") as job:
        answer = subprocess.run(
            [str(bin_dir / "probing"), str(job.pid), "query", "--format", "json",
             "SELECT func FROM python.backtrace WHERE depth = 0 ORDER BY func"],
            capture_output=True, text=True, env=environment, timeout=120,
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        assert [row["func"] for row in json.loads(answer.stdout)] == ["main_loop", "wait"]
        # The native front end, answering on its own, and the Python CLI agree.
        front = subprocess.run([str(bin_dir / "probing"), str(job.pid), "backtrace"], capture_output=True,
                               env=environment, timeout=60)  # fmt: skip
        python = subprocess.run([str(bin_dir / "probing"), str(job.pid), "backtrace"], capture_output=True,
                                env=dict(environment, PROBING_NATIVE_FRONT="0"), timeout=60)  # fmt: skip
        assert front.returncode == python.returncode == 0, front.stderr
        assert front.stdout == python.stdout
