"""faulthandler's text as 3.14 and later write it: each thread's OS name after its id, as the job
set it (any byte but NUL), and the C stack of the current thread after its Python frames."""

from __future__ import annotations

from probing.engine.fatal_text import FAULTING_THREAD, OTHER_THREAD, SIGNALLED_THREAD, parse_faulthandler

# What CPython 3.14.10 wrote at a SIGSEGV of a job with the agent in it (paths shortened).
TEXT_OF_3_14 = """Fatal Python error: Segmentation fault

Thread 0x00007f5e2f5fe6c0 [probing-agent] (most recent call first):
  File "/usr/lib/python3.14/selectors.py", line 398 in select
  File "/venv/lib/python3.14/site-packages/probing/agent/server.py", line 90 in serve
  File "/usr/lib/python3.14/threading.py", line 1023 in run
  File "/usr/lib/python3.14/threading.py", line 1081 in _bootstrap_inner
  File "/usr/lib/python3.14/threading.py", line 1043 in _bootstrap

Thread 0x00007f5e2fdff6c0 [data loader] (most recent call first):
  File "/job/data.py", line 5 in idle
  File "/usr/lib/python3.14/threading.py", line 1023 in run
  File "/usr/lib/python3.14/threading.py", line 1043 in _bootstrap

Current thread 0x00007f5e30a8a740 [python3.14] (most recent call first):
  File "/usr/lib/python3.14/ctypes/__init__.py", line 613 in string_at
  File "/job/train.py", line 8 in crash
  File "/job/train.py", line 9 in <module>

Current thread's C stack trace (most recent call first):
  Binary file "/usr/bin/python3.14", at _Py_DumpStack+0x4a [0x4a12b9]
  Binary file "/usr/lib/x86_64-linux-gnu/libc.so.6", at +0x406b0 [0x7f5e30ad56b0]
  <truncated rest of calls>

Extension modules: _cffi_backend (total: 1)
"""


def stacks(rows: list) -> dict:  # type: ignore[type-arg]
    """thread_id -> [(func, lineno, thread_name)], in depth order."""
    by_thread: dict = {}  # type: ignore[type-arg]
    for row in rows:
        by_thread.setdefault(row["thread_id"], []).append((row["func"], row["lineno"], row["thread_name"]))
    return by_thread


def test_the_text_of_3_14_with_thread_names_is_read_whole() -> None:
    message, rows = parse_faulthandler(TEXT_OF_3_14, 7)
    assert message == "Segmentation fault"
    by_thread = stacks(rows)
    assert rows[0]["thread_id"] == 0x00007F5E30A8A740
    # The C stack's lines are no Python frames; the agent's own thread is left out.
    assert by_thread == {
        0x00007F5E30A8A740: [("string_at", 613, FAULTING_THREAD), ("crash", 8, FAULTING_THREAD),
                             ("<module>", 9, FAULTING_THREAD)],
        0x00007F5E2FDFF6C0: [("idle", 5, OTHER_THREAD), ("run", 1023, OTHER_THREAD),
                             ("_bootstrap", 1043, OTHER_THREAD)],
    }  # fmt: skip


def test_a_thread_name_may_hold_brackets_the_header_s_own_words_and_control_characters() -> None:
    names = ["worker [1]", "x] (most recent call first):", "\x1b[31mred\x1b[0m", "\u00e9t\u00e9\ufffd",
             "a\x1cb\x85c"]  # fmt: skip
    text = "".join(
        f"Thread 0x{index:016x} [{name}] (most recent call first):\n"
        f'  File "/job/t{index}.py", line {index} in f\n\n'
        for index, name in enumerate(names, 1)
    )
    text += "Current thread 0x00000000000000ff [main] (most recent call first):\n"
    text += '  File "/job/m.py", line 1 in <module>\n'
    _, rows = parse_faulthandler(text, 1)
    assert stacks(rows) == {
        0xFF: [("<module>", 1, SIGNALLED_THREAD)],  # no "Fatal Python error": a SIGTERM's dump
        **{index: [("f", index, OTHER_THREAD)] for index in range(1, len(names) + 1)},
    }
    assert {row["file"] for row in rows} == {"/job/m.py", *(f"/job/t{index}.py" for index in range(1, 6))}


def test_a_newline_in_a_thread_name_splits_its_header_and_the_lines_are_joined_again() -> None:
    # prctl(PR_SET_NAME, "a\nb](x)") and faulthandler writes the bytes as they are.
    text = (
        "Fatal Python error: Aborted\n\n"
        "Thread 0x00000000000000aa [a\nb](x)\n] (most recent call first):\n"
        '  File "/job/loader.py", line 3 in wait\n\n'
        "Current thread 0x00000000000000bb [\n] (most recent call first):\n"
        '  File "/job/train.py", line 4 in <module>\n'
    )
    message, rows = parse_faulthandler(text, 1)
    assert message == "Aborted"
    assert stacks(rows) == {0xBB: [("<module>", 4, FAULTING_THREAD)], 0xAA: [("wait", 3, OTHER_THREAD)]}


def test_a_header_that_never_closes_is_no_header_and_the_lines_after_it_are_read_as_themselves() -> None:
    never_closed = "Thread 0x00000000000000aa [no end\n" + "x\n" * 100
    current = "Current thread 0x00000000000000bb [main] (most recent call first):\n"
    current += '  File "/job/t.py", line 2 in f\n'
    _, rows = parse_faulthandler("Fatal Python error: Aborted\n\n" + never_closed + current, 1)
    assert stacks(rows) == {0xBB: [("f", 2, FAULTING_THREAD)]}
    # A name longer than faulthandler could write does not swallow the frames after it either.
    too_long = "Thread 0x00000000000000aa [" + "y" * 300 + "\n] (most recent call first):\n"
    _, rows = parse_faulthandler(too_long + '  File "/job/u.py", line 1 in g\n' + current, 1)
    assert stacks(rows) == {0xBB: [("f", 2, SIGNALLED_THREAD)]}
