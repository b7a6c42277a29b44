"""Every command shown in a ```console block of docs/ runs against a real training job and
prints what the docs say it prints, so the docs cannot drift.

A block is a list of `$ command` lines, each followed by the output it prints (stdout, then
stderr). Matching normalises whitespace (runs of blanks become one, blank lines do not count);
`...` within a line stands for any text on that line, a line that is only `...` for any
number of lines, and a `...` that ends the block for the rest of the output. `echo $?`
checks the exit status of the previous command. A command that only sets a variable
(`$ RECORD=$(ls -t ... | head -1)`) prints nothing and sets it for the block's later commands.
Records that jobs write when they end go to a directory of this module's own
(PROBING_RECORD_DIR), which the docs' post-mortem blocks read.

Which job a block runs against:

- By default `$PID` is docs/examples/train.py started with `probing run` and `$PLAIN` the same
  script started plainly, shared by every unmarked block of every page. The unmarked blocks run
  first, in document order, and the two jobs end after the last of them.
- A marker line right above the block, `<!-- target: [plain] SCRIPT [ARGS...] -->`, gives the
  block a job of its own: SCRIPT (relative to the repository root) started with `probing run`,
  or plainly with `plain` (to show attaching). `$PID` is its PID. One job is started per
  distinct marker and shared by every block with that marker, in every page.
- Blocks that share a marked job run together, in document order (pages by name, then top to
  bottom), because state carries over from one to the next (`trace on`, `nan on`): running a block
  first runs the earlier blocks of its job that have not run yet, and a block whose
  predecessor failed fails too, naming it.
- `<!-- retry: WHY -->` above a block (with or without a target marker) runs each of its
  commands again until the output matches, for up to RETRY_S seconds: for output that
  appears once the job has taken a few more steps (rows of a trace). Only for commands that
  are safe to repeat.

Jobs print "ready" once they are in the state their page needs (tests/support.py waits for
it); each is killed with its whole process tree (DataLoader workers) once its last block has
run, or when the module ends.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import pytest

from probing.errors import ExitCode
from probing.schema.docgen import tables_markdown

from support import BIN, Target

# Not serial: the module runs beside other test files. The examples that list gc's objects give a
# --scan-budget whose GIL bound fits the oldest generation of a torch job on a loaded machine too.

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
# Bounds for what fails, not waits: beside the parallel workers and a CPU hog, a torch job took
# over 60 s to say ready, and `crash_at_step.py --crash-at 60` over 60 s to crash.
COMMAND_TIMEOUT_S = 180
READY_TIMEOUT_S = 180.0
# A block may start its job, then run its commands: more than pytest's 120 s a test.
pytestmark = pytest.mark.timeout(READY_TIMEOUT_S + 120)
RETRY_S = 45.0
MARKER = re.compile(r"^<!--\s*(target|retry)\s*(?::\s*(.*?))?\s*-->$")


class Example(NamedTuple):
    where: str  # page and line of the block, e.g. guide.md:42
    steps: List[Tuple[str, str]]  # (command, expected output)
    target: Optional[str]  # the target marker's text; None for the shared demo jobs
    retry: bool


def console_examples() -> List[Example]:
    """Every ```console block of docs/*.md, in document order."""
    examples = []
    for doc in sorted(DOCS.glob("*.md")):
        text = doc.read_text()
        for match in re.finditer(r"^```console\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            line = text[: match.start()].count("\n") + 1
            markers: Dict[str, str] = {}
            for above in reversed(text[: match.start()].splitlines()):
                marker = MARKER.match(above.strip())
                if marker is None:
                    break
                markers[marker.group(1)] = marker.group(2) or ""
            steps: List[Tuple[str, str]] = []
            for row in match.group(1).splitlines():
                if row.startswith("$ "):
                    steps.append((row[2:], ""))
                else:
                    assert steps, f"{doc.name}:{line}: output before the first `$ command`"
                    command, expected = steps[-1]
                    steps[-1] = (command, expected + row + "\n")
            examples.append(Example(f"{doc.name}:{line}", steps, markers.get("target"), "retry" in markers))
    return examples


EXAMPLES = console_examples()


def _normalised_lines(text: str) -> List[str]:
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def output_matches(expected: str, actual: str) -> bool:
    """Whitespace-normalised match; `...` is any text within a line, or any lines on its own."""
    lines = _normalised_lines(expected)
    pattern = []
    for line in lines:
        if line == "...":
            pattern.append(r"(?:[^\n]*\n)*?")
        else:
            pattern.append("[^\n]*?".join(re.escape(piece) for piece in line.split("...")) + r"\n")
    if lines and lines[-1].endswith("..."):
        pattern.append(r"(?:[^\n]*\n)*")  # as in doctest, a final `...` takes the rest
    text = "".join(line + "\n" for line in _normalised_lines(actual))
    return re.fullmatch("".join(pattern), text) is not None


class Jobs:
    """The jobs of the marked blocks, started when a block first needs one."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.started: Dict[str, Target] = {}
        self.count = 0

    def get(self, marker: str) -> Target:
        if marker not in self.started:
            words = shlex.split(marker)
            plain = bool(words) and words[0] == "plain"
            if plain:
                words = words[1:]
            assert words, f"<!-- target: {marker} --> names no script"
            script = ROOT / words[0]
            assert script.is_file(), f"<!-- target: {marker} -->: no such script {script}"
            self.count += 1
            scratch = self.scratch / f"job{self.count}"
            scratch.mkdir()
            # TMPDIR: whatever the job writes in its temporary directory is removed with pytest's.
            self.started[marker] = Target(
                str(script),
                via="plain" if plain else "run",
                args=words[1:],
                env={"TMPDIR": str(scratch)},
                ready_timeout=READY_TIMEOUT_S,
            )
        return self.started[marker]

    def release(self, marker: str) -> None:
        """Kill a job whose last block has run: it would only take CPU from the others."""
        job = self.started.pop(marker, None)
        if job is not None:
            job.kill()  # with its descendants (DataLoader workers)

    def close(self) -> None:
        for marker in list(self.started):
            self.release(marker)


@pytest.fixture(scope="module", autouse=True)
def record_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """PROBING_RECORD_DIR for every job and command of this module: the post-mortem blocks
    list and read the records their jobs leave, and no other run's records are among them."""
    directory = tmp_path_factory.mktemp("records")
    directory.chmod(0o700)
    before = os.environ.get("PROBING_RECORD_DIR")
    os.environ["PROBING_RECORD_DIR"] = str(directory)
    try:
        yield directory
    finally:
        if before is None:
            del os.environ["PROBING_RECORD_DIR"]
        else:
            os.environ["PROBING_RECORD_DIR"] = before


class DemoJobs:
    """$PID: the demo job started with `probing run`; $PLAIN: one started plainly. Started when
    an unmarked block first needs them, killed once the last one has run."""

    def __init__(self) -> None:
        self.started: Dict[str, Target] = {}

    def pids(self) -> Dict[str, int]:
        # Each on its own: a job that did not start is started again by the next block, not left
        # out of its commands ($PLAIN unreplaced).
        script = str(ROOT / "docs" / "examples" / "train.py")
        if "PID" not in self.started:
            self.started["PID"] = Target(script, ready_timeout=READY_TIMEOUT_S)
        if "PLAIN" not in self.started:
            self.started["PLAIN"] = Target(script, via="plain", ready_timeout=READY_TIMEOUT_S)
        return {name: job.pid for name, job in self.started.items()}

    def close(self) -> None:
        for job in self.started.values():
            job.kill()
        self.started.clear()


@pytest.fixture(scope="module")
def demo_jobs() -> Iterator[DemoJobs]:
    pytest.importorskip("torch")
    jobs = DemoJobs()
    try:
        yield jobs
    finally:
        jobs.close()


@pytest.fixture(scope="module")
def marked_jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Jobs]:
    pytest.importorskip("torch")
    jobs = Jobs(tmp_path_factory.mktemp("doc-jobs"))
    try:
        yield jobs
    finally:
        jobs.close()


@pytest.fixture(scope="module")
def working_directory(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the documented commands run: a directory of the test's own holding `docs` (a link
    to the repository's), so `python docs/examples/...` runs as written, and a picture written
    with `-o step.json` lands there instead of in the source tree."""
    directory = tmp_path_factory.mktemp("docs-cwd")
    (directory / "docs").symlink_to(DOCS)
    return directory


ASSIGNMENT = re.compile(r"^([A-Z_][A-Z0-9_]*)=(\S.*)$")


def run_steps(example: Example, pids: Dict[str, int], cwd: Path) -> None:
    """Run a block's commands in order; fail at the first whose output differs from the docs."""
    environment = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
    environment.update({name: str(pid) for name, pid in pids.items()})
    last_status, previous = None, ""
    for command, expected in example.steps:
        for name, pid in pids.items():
            expected = expected.replace(f"${name}", str(pid))
        if command == "echo $?":
            assert f"{last_status}\n" == expected, f"{example.where}: exit status of `{previous}`"
            continue
        assignment = ASSIGNMENT.match(command)
        if assignment is not None and not expected:
            shell = ["bash", "-c", 'eval "$1" && printf %s "${!2}"', "bash", command, assignment.group(1)]
            value = subprocess.run(shell, capture_output=True, text=True, env=environment, cwd=cwd,
                                   timeout=COMMAND_TIMEOUT_S, check=True).stdout  # fmt: skip
            assert value, f"{example.where}: `{command}` set nothing"
            environment[assignment.group(1)] = value
            continue
        deadline = time.monotonic() + (RETRY_S if example.retry else 0.0)
        while True:
            # Through eval, so that bash does not exec a lone command: `$$` is the shell, as it
            # is for a reader typing the command.
            shell = ["bash", "-c", 'eval "$1"', "bash", command]
            result = subprocess.run(shell, capture_output=True, text=True, env=environment, cwd=cwd,
                                    timeout=COMMAND_TIMEOUT_S)  # fmt: skip
            actual = result.stdout + result.stderr
            if output_matches(expected, actual) or time.monotonic() > deadline:
                break
            time.sleep(0.2)  # a retried command waits for the job's next steps
        last_status, previous = result.returncode, command
        assert output_matches(expected, actual), (
            f"{example.where}: `{command}` printed:\n{actual}\n--- the docs say:\n{expected}"
        )


# Outcome of each marked block that has run: None for passed, else why it failed.
OUTCOMES: Dict[str, Optional[str]] = {}


def job_state(job: Optional[Target]) -> str:
    return "--- its job never started" if job is None else job.state()


def run_in_order(example: Example, jobs: Jobs, cwd: Path) -> None:
    """Run the earlier blocks of the example's job first (once each), then the example."""
    assert example.target is not None
    sharing = [other for other in EXAMPLES if other.target == example.target]
    for block in sharing[: sharing.index(example) + 1]:
        if block.where not in OUTCOMES:
            try:
                run_steps(block, {"PID": jobs.get(example.target).pid}, cwd)
                OUTCOMES[block.where] = None
            except (AssertionError, subprocess.TimeoutExpired, RuntimeError) as failure:
                OUTCOMES[block.where] = f"{failure}\n{job_state(jobs.started.get(example.target))}"
    if all(block.where in OUTCOMES for block in sharing):
        jobs.release(example.target)
    # This block's own outcome, else the first earlier block on the same job that failed (its
    # job may be left in another state than the docs assume).
    outcome = OUTCOMES[example.where]
    if outcome is not None:
        pytest.fail(outcome, pytrace=False)
    for block in sharing[: sharing.index(example)]:
        failed = OUTCOMES[block.where]
        if failed is not None:
            first_line = failed.splitlines()[0] if failed else ""
            pytest.fail(f"{example.where} runs after {block.where} on the same job, which failed: "
                        f"{first_line}", pytrace=False)  # fmt: skip


def running_order(examples: List[Example]) -> List[Example]:
    """The unmarked blocks first, then each marked job's blocks together, each in document
    order: the demo jobs are gone once the unmarked blocks have run, and one marked job at a
    time takes the CPU (a job runs until its last block, and the module runs beside others)."""
    marked: Dict[str, List[Example]] = {}
    for example in examples:
        if example.target is not None:
            marked.setdefault(example.target, []).append(example)
    unmarked = [example for example in examples if example.target is None]
    return unmarked + [example for blocks in marked.values() for example in blocks]


ORDER = running_order(EXAMPLES)
LAST_UNMARKED = max((i for i, example in enumerate(ORDER) if example.target is None), default=-1)


@pytest.mark.parametrize("example", ORDER, ids=[example.where for example in ORDER])
def test_documented_commands_print_what_the_docs_say(
    example: Example, request: pytest.FixtureRequest, working_directory: Path
) -> None:
    if example.target is not None:
        run_in_order(example, request.getfixturevalue("marked_jobs"), working_directory)
        return
    demo: DemoJobs = request.getfixturevalue("demo_jobs")
    try:
        run_steps(example, demo.pids(), working_directory)
    finally:
        if ORDER.index(example) == LAST_UNMARKED:
            demo.close()


def test_every_documented_command_runs_somewhere() -> None:
    commands = [command for example in EXAMPLES for command, _ in example.steps]
    for needed in (
        "backtrace",
        "hang",
        "eval",
        "repl",
        "query",
        "trace",
        "nan",
        "memory",
        "tables",
        "list",
        "inject",
        "detach",
    ):
        assert any(f"probing {needed}" in c or f" {needed}" in c for c in commands), needed


def test_the_table_reference_is_generated_from_the_agent() -> None:
    assert (DOCS / "tables.md").read_text() == tables_markdown(), "run `make docs`"


def _exit_code_table(page: str) -> Dict[int, str]:
    """The `| code | meaning | ...` table of a page: {code: meaning}."""
    codes = {}
    for line in (DOCS / page).read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0].isdigit():
            codes[int(cells[0])] = cells[1]
    return codes


def test_the_exit_codes_in_troubleshooting_are_those_of_the_code() -> None:
    assert _exit_code_table("troubleshooting.md") == ExitCode.MEANINGS


def test_the_command_reference_lists_every_exit_code() -> None:
    assert set(_exit_code_table("commands.md")) == set(ExitCode.MEANINGS)


def test_the_matcher() -> None:
    """`...` is any text within a line, any lines on a line of its own, the rest at the end."""
    assert output_matches("a  b\n...\nc ...\n", "a b\nx\n\ny\n  c   12\n")
    assert output_matches("a ...\n", "a 1\nb\n")
    assert not output_matches("a ...\nc\n", "a 1\nb\nc\n")  # within a line, not beyond it
    assert not output_matches("a\n", "a\nb\n")
    assert output_matches("", "")
    ranking = "module stage avg_time\nmodel forward ...\nmodel.positions forward ...\n...\n"
    assert output_matches(ranking, "module stage avg_time\nmodel forward 1\nmodel.positions forward 0.5\n")
    assert not output_matches(
        ranking, "module stage avg_time\nmodel forward 1\nopt 0.7\nmodel.positions forward 0.5\n"
    )
