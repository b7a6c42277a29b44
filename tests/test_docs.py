"""Every command shown in a ```console block of docs/ runs against a real training job and
prints what the docs say it prints ("..." stands for any text), so the docs cannot drift."""

from __future__ import annotations

import doctest
import os
import re
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from probing.docgen import tables_markdown

from support import BIN, Target

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CHECKER = doctest.OutputChecker()
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def console_examples() -> List[Tuple[str, List[Tuple[str, str]]]]:
    """(doc and line, [(command, expected output), ...]) for every ```console block."""
    examples = []
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text()
        for match in re.finditer(r"```console\n(.*?)```", text, re.DOTALL):
            line = text[: match.start()].count("\n") + 1
            steps: List[Tuple[str, str]] = []
            for row in match.group(1).splitlines():
                if row.startswith("$ "):
                    steps.append((row[2:], ""))
                else:
                    command, expected = steps[-1]
                    steps[-1] = (command, expected + row + "\n")
            examples.append((f"{doc.name}:{line}", steps))
    return examples


@pytest.fixture(scope="module")
def demo_jobs() -> Iterator[Dict[str, Target]]:
    """$PID: the demo job started with `probing run`; $PLAIN: one started plainly."""
    pytest.importorskip("torch")
    script = str(ROOT / "docs" / "examples" / "train.py")
    with Target(script) as job, Target(script, via="plain") as plain:
        yield {"PID": job, "PLAIN": plain}


@pytest.mark.parametrize("where, steps", console_examples(), ids=[where for where, _ in console_examples()])
def test_documented_commands_print_what_the_docs_say(
    demo_jobs: Dict[str, Target], where: str, steps: List[Tuple[str, str]]
) -> None:
    pids = {name: str(job.pid) for name, job in demo_jobs.items()}
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", **pids)
    last_status = None
    for command, expected in steps:
        for name, pid in pids.items():
            expected = expected.replace(f"${name}", pid)
        if command == "echo $?":
            assert f"{last_status}\n" == expected, f"{where}: exit status of the previous command"
            continue
        result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=environment,
                                cwd=ROOT, timeout=60)  # fmt: skip
        last_status = result.returncode
        actual = result.stdout + result.stderr
        assert CHECKER.check_output(expected, actual, FLAGS), (
            f"{where}: `{command}` printed:\n{actual}\n--- the docs say:\n{expected}"
        )


def test_every_documented_command_runs_somewhere() -> None:
    commands = [command for _, steps in console_examples() for command, _ in steps]
    for needed in ("backtrace", "eval", "repl", "query", "tables", "list", "inject", "detach"):
        assert any(f"probing {needed}" in c or f" {needed}" in c for c in commands), needed


def test_the_table_reference_is_generated_from_the_agent() -> None:
    assert (DOCS / "tables.md").read_text() == tables_markdown(), "run `make docs`"
