"""Shared fixtures. Every target process started here is killed when its test ends."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Iterator, List, Optional, Set

import pytest

from tools import need

from support import Target

LAYERS = ("unit", "protocol", "integration")

# A shell without job control starts background commands (`make test &`, a CI step sent to the
# background) with SIGINT and SIGQUIT ignored, and an ignored signal stays ignored across exec:
# every process the tests start would be deaf to Ctrl-C, which the repl and `probing run` tests
# send. The tests stand for a user at a terminal, where both have their default action.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
# One intra-op thread for every torch job the tests start (as torchrun gives each of its ranks):
# torch's OpenMP pool otherwise keeps a thread per core spinning between a step's operations,
# for cores the other workers' jobs need. docs/examples/train.py took 8.0 s of CPU in 12 s with
# it and 3.8 s without, tests/targets/selfcheck.py --torch 16.6 s and 8.6 s (this 2-core box).
# No test is about torch's pool: probing shows Python's threads. A value given is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
TREE_AT_START = pytest.StashKey[Optional[Set[str]]]()


def tree_status() -> Optional[Set[str]]:
    """`git status` of the checkout, ignored files left out; None outside a git checkout."""
    try:
        result = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=all"],
            cwd=ROOT, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    return set(result.stdout.splitlines()) if result.returncode == 0 else None


def new_files(before: Set[str], after: Set[str]) -> List[str]:
    """Untracked files that appeared. Changes to tracked files are left to .ci/run's clean-tree
    check: here they are as likely a developer's edit made while the tests ran."""
    return sorted(line for line in after - before if line.startswith("??"))


def is_xdist_worker(config: pytest.Config) -> bool:
    """Under `pytest -n N` each worker runs a session of its own inside the controller's: the
    controller's starts before any worker's and ends after all of them."""
    return hasattr(config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    # The controller alone looks at the tree: a worker ending early would see a file another
    # worker's test has written and not yet removed.
    if not is_xdist_worker(session.config):
        session.config.stash[TREE_AT_START] = tree_status()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A test run writes nothing into the source tree (outside ignored paths such as .venv/ and
    __pycache__/): a file that appeared during the run fails the session, named."""
    before = session.config.stash.get(TREE_AT_START, None)
    if before is None:
        return
    after = tree_status()
    if after is None:
        return
    written = new_files(before, after)
    if os.environ.get("PROBING_SCREENSHOTS"):  # `make screenshots` writes the docs' pictures on purpose
        written = [line for line in written if not line.startswith("?? docs/images/")]
    if written:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "the test run wrote into the source tree", red=True)
            for line in written:
                reporter.write_line(f"  {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """Each test carries the marker of its layer, the folder it is in: `pytest -m unit` runs the
    pure functions alone (seconds), `-m protocol` the wire format against scripted peers."""
    tests = Path(__file__).resolve().parent
    for item in items:
        layer = Path(str(item.fspath)).resolve().relative_to(tests).parts[0]
        if layer in LAYERS:
            item.add_marker(getattr(pytest.mark, layer))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """`@pytest.mark.needs("torch", ...)`: the test is skipped, naming what installs the tool,
    before its fixtures start a target that could not run without it (tests/tools.py)."""
    for marker in item.iter_markers("needs"):
        need(*marker.args)


@pytest.fixture(scope="session", autouse=True)
def socket_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Agents of the test targets put their sockets here, not in the user's /tmp/probing-UID."""
    directory = str(tmp_path_factory.mktemp("sockets"))
    previous = os.environ.get("PROBING_SOCKET_DIR")
    os.environ["PROBING_SOCKET_DIR"] = directory
    yield directory
    if previous is None:
        os.environ.pop("PROBING_SOCKET_DIR", None)
    else:
        os.environ["PROBING_SOCKET_DIR"] = previous


@pytest.fixture
def sleeper() -> Iterator[Target]:
    with Target("sleeper.py") as target:
        yield target


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """PROBING_TEST_TIMES=FILE: each test's setup, call and teardown seconds appended to FILE, one
    line each, from every worker: where the suite's minutes go, summed by file in CONTRIBUTING.md."""
    path = os.environ.get("PROBING_TEST_TIMES")
    # Under xdist the controller gets each worker's report too (with `node` set): written once.
    if path and not hasattr(report, "node"):
        with open(path, "a") as out:
            out.write(f"{report.duration:.3f}\t{report.when}\t{report.nodeid}\n")
