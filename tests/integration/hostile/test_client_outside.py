"""Reading from outside (py-spy) fails in words a user can act on, never py-spy's raw error."""

from __future__ import annotations

from support import Target, probing


def test_native_backtrace_of_a_stack_py_spy_cannot_read_says_what_failed_and_what_to_do() -> None:
    with Target("deep_stack.py", via="plain") as job:
        result = probing(str(job.pid), "backtrace", "--native", timeout=60)
        answered = probing(str(job.pid), "--no-attach", "backtrace", timeout=60)
    assert result.returncode == 1, result
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"probing: error: py-spy could not read the stacks of PID {job.pid}"), lines
    assert (
        lines[1]
        == "  hint: without --native, `probing PID backtrace` reads the Python stacks through the agent"
    )
    assert len(lines) == 2 and "Stack backtrace" not in result.stderr
    # py-spy fails the same way without --native: the fallback says why in one line too.
    assert answered.returncode != 0 and "Stack backtrace" not in answered.stderr, answered
