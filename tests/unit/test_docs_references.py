"""What docs/ and the README say that can be checked without running a job (issue 26): every file
they cite is in the repository (a clone has no design notes beside it, so citing them cites
nothing), every link and anchor leads somewhere, every exit code they name is one probing has,
and every example that shows a failure states its exit status, which tests/integration/test_docs.py
then checks against the command's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Set, Tuple

import pytest

from probing.errors import ExitCode

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
# Where the repository's own files live (its .venv, build/ and caches are not read).
SOURCE_DIRECTORIES = ("probing", "native", "tests", "docs", "benchmarks", "tools", ".ci")
EXTENSIONS = "py|md|c|h|sh|toml|cfg|in|json|png|svg|html|txt|yml|yaml|js"
# A path with at least one directory: `probing/engine/report/live.py`, or `engine/report/live.py` as the
# docs write a module of a part. `...`, `$VAR`, `~` and absolute paths are examples, not files.
PATH = re.compile(
    rf"(?<![\w./~$<-])((?:[A-Za-z0-9_.-]+/)+[A-Za-z0-9_-][A-Za-z0-9_.-]*\.(?:{EXTENSIONS}))(?![\w/-])"
)
PAGE_NAME = re.compile(r"(?<![\w./$-])([A-Za-z0-9_-]+\.md)\b")
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
# "exits with code 6", "fails with code 6", "exit code 15", "(exit 11)", "exits 14".
EXIT_CODE = re.compile(r"\b(?:exits? with code|fails with code|exit code|\(exit|exits) ([0-9]+)\b")
# Exit statuses the docs give that are not probing's own: `probing run` passes the job's on
# (137 after SIGKILL, 143 after SIGTERM in a shell, 126/127 when the command cannot run).
PASSED_ON = {126, 127, 137, 143}


def repository_files() -> List[str]:
    files = [path.name for path in ROOT.iterdir() if path.is_file()]
    for directory in SOURCE_DIRECTORIES:
        base = ROOT / directory
        if base.is_dir():
            files += [
                str(path.relative_to(ROOT))
                for path in base.rglob("*")
                if path.is_file() and "__pycache__" not in path.parts
            ]
    return files


FILES = repository_files()
# Stand-ins for a job's libraries (the scale harness's torch/distributed/distributed_c10d.py,
# whose path ends as torch's does) are not the repository's kind of directory: `torch/...` in
# the docs is the job's torch.
STAND_INS = "benchmarks/scale/stacks/"
DIRECTORY_NAMES: Set[str] = {
    part for name in FILES if not name.startswith(STAND_INS) for part in Path(name).parts[:-1]
}


def prose(text: str) -> str:
    """The page without its fenced blocks (a job's output names the job's own files)."""
    return FENCE.sub(lambda block: "\n" * block.group(0).count("\n"), text)


def cited_paths(text: str) -> Iterator[Tuple[int, str]]:
    """(line, path) of every path of the repository's kind the prose names: its first directory
    is one the repository has (a path into the job's libraries, `torch/autograd/graph.py`, or a
    placeholder, `DIR/record.json`, is not)."""
    for match in PATH.finditer(prose(text)):
        path = match.group(1)
        if path.split("/")[0] in DIRECTORY_NAMES:
            yield text[: match.start()].count("\n") + 1, path


def in_repository(path: str) -> bool:
    """The repository holds `path`, from its root or as the end of one of its paths (the docs
    name a module of a part as `engine/report/live.py`)."""
    path = path.lstrip("./") if path.startswith("./") else path
    return any(name == path or name.endswith("/" + path) for name in FILES)


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> Set[str]:
    return {slug(line.lstrip("#")) for line in prose(page.read_text()).splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_file_a_page_cites_is_in_the_repository(page: Path) -> None:
    text = page.read_text()
    missing = [f"{page.name}:{line}: {path}" for line, path in cited_paths(text) if not in_repository(path)]
    for match in PAGE_NAME.finditer(prose(text)):
        name = match.group(1)
        if not any(Path(each).name == name for each in FILES):
            missing.append(f"{page.name}:{text[: match.start()].count(chr(10)) + 1}: {name}")
    assert missing == [], "cited, but not in the repository (a clone has only what is in it):\n" + "\n".join(
        missing
    )


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_link_leads_to_a_file_and_a_heading_there(page: Path) -> None:
    text = prose(page.read_text())
    broken = []
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.name}")
    assert broken == [], f"{page.name}:\n" + "\n".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_every_exit_code_a_page_names_is_one_probing_has(page: Path) -> None:
    text = prose(page.read_text())
    unknown = sorted(
        {int(match.group(1)) for match in EXIT_CODE.finditer(text)} - set(ExitCode.MEANINGS) - PASSED_ON
    )
    assert unknown == [], f"{page.name} names exit codes probing does not have: {unknown}"


def console_steps(text: str) -> Iterator[Tuple[int, List[Tuple[str, str]]]]:
    for match in re.finditer(r"^```console\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
        steps: List[Tuple[str, str]] = []
        for row in match.group(1).splitlines():
            if row.startswith("$ "):
                steps.append((row[2:], ""))
            elif steps:
                steps[-1] = (steps[-1][0], steps[-1][1] + row + "\n")
        yield text[: match.start()].count("\n") + 1, steps


@pytest.mark.parametrize("page", PAGES, ids=[page.name for page in PAGES])
def test_an_example_that_fails_states_its_exit_status(page: Path) -> None:
    """A failing command's status is what a script branches on: the example says it with
    `echo $?`, and test_docs.py checks it against the command's."""
    unstated = []
    for line, steps in console_steps(page.read_text()):
        for index, (command, output) in enumerate(steps):
            failed = any(row.startswith("probing: error:") for row in output.splitlines())
            stated = index + 1 < len(steps) and steps[index + 1][0] == "echo $?"
            if failed and not stated:
                unstated.append(f"{page.name}:{line}: `{command}`")
    assert unstated == [], "failing examples without `echo $?` after them:\n" + "\n".join(unstated)


def test_the_checks_see_what_they_are_for() -> None:
    """The statements issue 26 found, as the checks read them."""
    assert [path for _, path in cited_paths("see tests/nosuch/thing.py and torch/autograd/graph.py")] == [
        "tests/nosuch/thing.py"
    ]
    assert not in_repository("tests/nosuch/thing.py") and in_repository("engine/report/tables.py")
    assert [match.group(1) for match in PAGE_NAME.finditer("the design notes (DESIGN.md)")] == ["DESIGN.md"]
    assert not any(Path(name).name == "DESIGN.md" for name in FILES)
    assert slug(" `--ranks`: every rank, one answer") == "--ranks-every-rank-one-answer"
    assert [int(match.group(1)) for match in EXIT_CODE.finditer("`--no-attach` fails with code 6")] == [6]
