"""Every command of the debugging guide users arrive with, run verbatim on a real training job.

The guide is read at test time from `../shared/seeds/probing-debugging-guide.md` (beside the
repository): each ```bash block runs as written, with `bash`, `ENDPOINT` set to the PID of
tests/targets/seed_trainer.py (CPU torch: `model`, `optimizer` globals; `trainer` and
`train_loader` locals of main() and train(); `loss` a local of train() only), and must exit 0
with the output the guide implies. The ```sql block ("Find slowest operations") runs verbatim
through `probing $ENDPOINT query -` once `probing $ENDPOINT trace on` has traced some steps.

Where the guide says something that is not true of probing, a test below names it, and
docs/guide.md ("From the debugging guide") says what to write instead.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

from support import BIN, Target, probing, wait_until

REPOSITORY = Path(__file__).resolve().parents[2]
GUIDE = REPOSITORY.parent / "shared" / "seeds" / "probing-debugging-guide.md"

pytestmark = pytest.mark.skipif(
    not GUIDE.is_file(), reason=f"the seed guide is not at {GUIDE} (../shared/seeds/ beside the repository)"
)


def guide_blocks() -> List[Tuple[str, str, str]]:
    """(heading, language, code) of every fenced block of the guide, in order."""
    if not GUIDE.is_file():
        return []
    blocks: List[Tuple[str, str, str]] = []
    heading = ""
    language = None
    lines: List[str] = []
    for line in GUIDE.read_text().splitlines():
        if language is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.startswith("```") and line[3:].strip():
                language, lines = line[3:].strip(), []
        elif line.startswith("```"):
            blocks.append((heading, language, "\n".join(lines) + "\n"))
            language = None
        else:
            lines.append(line)
    return blocks


def block(heading: str, language: str = "bash") -> str:
    found = [code for title, lang, code in guide_blocks() if title == heading and lang == language]
    assert len(found) == 1, f"the guide has {len(found)} {language} blocks under {heading!r}"
    return found[0]


@pytest.fixture(scope="module")
def job() -> Iterator[Target]:
    with Target("seed_trainer.py") as started:
        yield started


def run_block(job: Target, code: str) -> subprocess.CompletedProcess[str]:
    """The block as a user pastes it: bash, ENDPOINT set, `probing` on the PATH."""
    environment: Dict[str, str] = dict(os.environ, ENDPOINT=str(job.pid))
    environment["PATH"] = f"{BIN}{os.pathsep}{environment.get('PATH', '')}"
    environment.pop("PROBING", None)
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=60, env=environment)


def ok(job: Target, heading: str) -> subprocess.CompletedProcess[str]:
    result = run_block(job, block(heading))
    assert result.returncode == 0, (
        f"{heading}: exit {result.returncode}\n{result.stdout}\n{result.stderr}\n{job.state()}"
    )
    return result


def test_the_guide_has_the_blocks_these_tests_run() -> None:
    """A new block in the guide needs a test here: this lists every one of them."""
    seen = [(heading, language) for heading, language, _ in guide_blocks()]
    assert seen == [
        ("Capture Current Stack", "bash"),
        ("Find Where Code Is Stuck", "bash"),
        ("Inspect Variables", "bash"),
        ("Check Thread State", "bash"),
        ("Monitor Training Progress", "bash"),
        ("Scenario 1: Training Hangs", "bash"),
        ("Scenario 2: NaN/Inf in Gradients", "bash"),
        ("Scenario 3: Slow Training", "sql"),
        ("Scenario 3: Slow Training", "bash"),
        ("Conditional Breakpoints (Conceptual)", "bash"),
        ("Data Pipeline Debugging", "bash"),
        ("Distributed Debugging", "bash"),
    ]


def test_capture_current_stack(job: Target) -> None:
    result = ok(job, "Capture Current Stack")
    assert "Thread" in result.stdout and "in train" in result.stdout
    assert re.search(r"^func +file +lineno +depth$", result.stdout, re.M), result.stdout
    # The innermost frames first: the stdin reader is always at depth 0 (the training loop may be
    # anywhere inside torch at that moment).
    assert re.search(r"^watch_stdin +\S*seed_trainer\.py +\d+ +0$", result.stdout, re.M), result.stdout


def test_the_columns_the_guide_lists_are_in_python_backtrace(job: Target) -> None:
    text = GUIDE.read_text()
    table = text[text.index("### Understanding Stack Frames") : text.index("### Find Where Code Is Stuck")]
    columns = re.findall(r"^\| `(\w+)` \|", table, re.M)
    assert columns == ["func", "file", "lineno", "depth", "frame_type"]
    sql = f"SELECT DISTINCT {', '.join(columns)} FROM python.backtrace ORDER BY depth"
    result = probing(str(job.pid), "query", "--format", "csv", sql)
    assert result.returncode == 0, result.stderr
    rows = [line.split(",") for line in result.stdout.splitlines()[1:]]
    assert {row[-1] for row in rows} <= {"Python", "Native"} and rows
    # depth 0 is where a thread is now: "0 = deepest" in the guide's words.
    assert any(row[0] in ("train", "watch_stdin") and row[3] == "0" for row in rows), rows


def test_find_where_code_is_stuck(job: Target) -> None:
    result = ok(job, "Find Where Code Is Stuck")
    # The top of each thread's stack: the training loop (in train or below it) and the stdin reader.
    assert re.search(r"^watch_stdin +\S*seed_trainer\.py +\d+$", result.stdout, re.M), result.stdout


def test_inspect_variables(job: Target) -> None:
    result = ok(job, "Inspect Variables")
    keys = result.stdout.splitlines()[0]
    assert keys.startswith("dict_keys([") and "'model'" in keys and "'optimizer'" in keys
    assert "<class 'torch.nn.modules.container.Sequential'> Sequential(" in result.stdout
    assert "0.weight: torch.Size([16, 8]), grad=True" in result.stdout
    assert "2.bias: torch.Size([1]), grad=True" in result.stdout


def test_check_thread_state(job: Target) -> None:
    result = ok(job, "Check Thread State")
    assert "MainThread: alive=True, daemon=False" in result.stdout
    assert "stdin-watcher: alive=True, daemon=True" in result.stdout
    # As the guide implies: probing's own threads are not threading's, not even the eval's.
    assert "probing" not in result.stdout, result.stdout


def test_monitor_training_progress_finds_the_trainer_in_the_training_function(job: Target) -> None:
    result = ok(job, "Monitor Training Progress")
    assert re.search(r"^Current step: [1-9]\d*$", result.stdout, re.M), result.stdout
    assert re.search(r"^Current loss: \d+\.\d+", result.stdout, re.M), result.stdout
    assert "Learning rate: 0.01\n" in result.stdout
    assert re.search(
        r"probing: trainer: local of train\(\) at seed_trainer\.py:\d+, MainThread", result.stderr
    )


def test_training_hangs(job: Target) -> None:
    result = ok(job, "Scenario 1: Training Hangs")
    assert "in train" in result.stdout and "MainThread: True" in result.stdout
    # Not a distributed job: the deadlock check prints nothing.
    assert "Rank:" not in result.stdout


def test_nan_in_gradients_reads_loss_from_the_training_function(job: Target) -> None:
    result = ok(job, "Scenario 2: NaN/Inf in Gradients")
    assert "gradient in" not in result.stdout  # a healthy job: no NaN or Inf gradient
    assert re.search(r"^Loss: \d+\.\d+\nIsNaN: False\nIsInf: False\n", result.stdout, re.M), result.stdout
    assert re.search(
        r"^probing: loss: local of train\(\) at seed_trainer\.py:\d+, MainThread$", result.stderr, re.M
    )


def test_slow_training_query_runs_verbatim_once_steps_are_traced(job: Target) -> None:
    assert probing(str(job.pid), "trace", "on").returncode == 0
    try:
        counted = "SELECT count(DISTINCT step) FROM python.torch_trace"
        assert wait_until(
            lambda: probing(str(job.pid), "query", "--format", "csv", counted).stdout.split()[-1:] >= ["7"],
            timeout=30,
        )
        # The block begins with a `--` comment. Pasted as the argument, on stdin, or after `--`,
        # it runs verbatim.
        sql = block("Scenario 3: Slow Training", "sql")
        result = probing(str(job.pid), "query", "-", input=sql)
        assert result.returncode == 0, result.stderr
        assert re.search(r"^module +stage +avg_time$", result.stdout, re.M), result.stdout
        assert re.search(r"^model +forward +\d", result.stdout, re.M), result.stdout
        again = probing(str(job.pid), "query", "--", sql)
        assert again.returncode == 0 and "avg_time" in again.stdout, again.stderr
        pasted = probing(str(job.pid), "query", sql, "--format", "csv")
        assert pasted.returncode == 0, pasted.stderr
        assert pasted.stdout.startswith("module,stage,avg_time\n"), pasted.stdout
    finally:
        probing(str(job.pid), "trace", "off")


def test_slow_training_gpu_check_prints_nothing_without_cuda(job: Target) -> None:
    result = ok(job, "Scenario 3: Slow Training")
    assert result.stdout == ""


def test_conditional_breakpoint_keeps_its_loss_out_of_main(job: Target) -> None:
    result = ok(job, "Conditional Breakpoints (Conceptual)")
    assert "ALERT" not in result.stdout  # the loss is small and finite
    assert "probing: trainer: local of train()" in result.stderr
    # `loss = trainer.last_loss` would hide train()'s loss from later evals: it stays in the eval.
    assert "probing: loss: the new value stays in this eval, not __main__" in result.stderr
    after = probing(str(job.pid), "eval", "type(loss).__name__")
    assert after.stdout == "'Tensor'\n", after.stderr


def test_data_pipeline_reads_the_loader_from_the_training_function(job: Target) -> None:
    result = ok(job, "Data Pipeline Debugging")
    assert result.stdout == "Batch shape: torch.Size([16, 8])\nBatch dtype: torch.float32\nHas NaN: False\n"
    assert "probing: train_loader: local of train()" in result.stderr


def test_distributed_debugging_prints_nothing_outside_a_distributed_job(job: Target) -> None:
    result = ok(job, "Distributed Debugging")
    assert result.stdout == ""


def test_the_job_trained_on_through_all_of_it(job: Target) -> None:
    def step() -> int:
        return int(probing(str(job.pid), "eval", "trainer.current_step").stdout)

    first = step()
    assert wait_until(lambda: step() > first, timeout=20)
