"""Terminal escape injection: every string the job controls (thread, function and file names,
reprs of locals, table values, eval output) is inert in output for people, and exact in JSON
and CSV. The target's names retitle the window, clear the screen, and forge a "MainThread"
line with CR and a newline (tests/targets/escapes.py).
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import time
from typing import Iterator

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "targets"))

from probing.cli.render import inert, inert_lines  # noqa: E402

from support import PROBING, Target, probing  # noqa: E402

EVIL = '\x1b]0;pwned\x07\x1b[2J\r\nThread 1 "MainThread", main thread: idle\x9b31m\u202e'
# What a terminal would act on: C0 controls but newline, DEL, C1, line separators, bidi overrides.
ACTIVE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


@pytest.fixture(scope="module")
def job() -> Iterator[Target]:
    with Target("escapes.py") as target:
        yield target


def assert_inert(text: str) -> None:
    found = ACTIVE.search(text)
    assert found is None, f"{found.group()!r} reached the terminal in: {text!r}"


def test_inert_makes_every_control_character_visible_text() -> None:
    assert inert("a\x1b[2J\r\n\t\x7f\x9b\u202eb") == "a\\x1b[2J\\r\\n\\t\\x7f\\x9b\\u202eb"
    assert inert("plain é ✓") == "plain é ✓"


def test_inert_lines_keep_newlines_and_tabs_on_a_terminal_only_escaping_the_rest() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert inert_lines("a\tb\n\x1b[2J\r", Terminal()) == "a\tb\n\\x1b[2J\\r"
    assert inert_lines("a\tb\n\x1b[2J\r", io.StringIO()) == "a\tb\n\x1b[2J\r"


def test_a_backtrace_shows_escape_sequences_in_names_as_text(job: Target) -> None:
    result = probing(str(job.pid), "backtrace", "--locals")
    assert result.returncode == 0, result.stderr
    assert_inert(result.stdout)
    assert_inert(result.stderr)
    # Two threads, two headers: the forged "MainThread" line stays inside its thread's name.
    assert len(re.findall(r"^Thread ", result.stdout, re.M)) == 2, result.stdout
    assert '"evil\\x1b]0;pwned\\x07\\x1b[2J\\r\\nThread 1 "MainThread"' in result.stdout
    assert "in wait\\x1b]0;pwned" in result.stdout
    assert 'File "evil\\x1b]0;pwned' in result.stdout
    assert "secret = '\\x1b]0;pwned\\x07" in result.stdout


def test_a_query_table_shows_job_values_inert_and_json_and_csv_keep_them_exact(job: Target) -> None:
    sql = "SELECT thread_name, func, file FROM python.backtrace ORDER BY thread_name, depth"
    table = probing(str(job.pid), "query", sql)
    assert table.returncode == 0, table.stderr
    assert_inert(table.stdout)
    rows = json.loads(probing(str(job.pid), "query", sql, "--format", "json").stdout)
    assert len(table.stdout.splitlines()) == 2 + len(rows), table.stdout  # header, rule, rows
    assert {"thread_name": "evil" + EVIL, "func": "wait" + EVIL, "file": "evil" + EVIL + ".py"} in rows
    # Bytes, not text mode: universal newlines would turn the value's CR LF into LF.
    raw = subprocess.run(
        [PROBING, str(job.pid), "query", sql, "--format", "csv"], capture_output=True, check=True
    )
    read = list(csv.reader(io.StringIO(raw.stdout.decode("utf-8"), newline="")))
    assert ["evil" + EVIL, "wait" + EVIL, "evil" + EVIL + ".py"] in read


def test_hang_shows_thread_names_and_places_inert(job: Target) -> None:
    result = probing(str(job.pid), "hang", "--duration", "0.3", "--samples", "2")
    assert result.returncode in (0, 11), result.stderr
    assert_inert(result.stdout)
    assert "evil\\x1b]0;pwned" in result.stdout


def _on_a_terminal(*args: str, timeout: float = 30.0) -> str:
    """`probing ARGS` with its stdout and stderr on a pseudo-terminal; what it wrote there."""
    master, slave = pty.openpty()
    process = subprocess.Popen([PROBING, *args], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    output = b""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if not select.select([master], [], [], max(0.0, deadline - time.monotonic()))[0]:
                break
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:  # EIO: the last writer closed the terminal
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(master)
        if process.poll() is None:
            process.kill()
        process.wait(10)
    return output.decode("utf-8", "replace").replace("\r\n", "\n")  # the terminal's ONLCR


def test_eval_output_on_a_terminal_shows_control_characters_as_text_but_newlines_and_tabs(
    job: Target,
) -> None:
    code = "print('a\\tb\\x1b]0;pwned\\x07\\rc'); print('line two')"
    shown = _on_a_terminal(str(job.pid), "eval", code)
    assert shown == "a\tb\\x1b]0;pwned\\x07\\rc\nline two\n", repr(shown)


def test_eval_output_to_a_pipe_is_the_exact_text_the_code_printed(job: Target) -> None:
    # Bytes, not text mode: universal newlines would turn the CR into LF.
    command = [PROBING, str(job.pid), "eval", "print('a\\x1b[2J\\rb')"]
    result = subprocess.run(command, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"a\x1b[2J\rb\n"
