"""The native front end's copies of the CLI's rules, case by case against the Python functions:
thread states (analysis/states.py), `inert` (cli/render), source lines (engine/sources.py).

Its tables are generated from those modules at build time (native/front/gen_tables.py); this
test covers the C that walks them as the Python functions do. It compiles native/front/check.c, a driver that
answers one case a line, with the generator's header, into a temporary folder.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

import pytest

from probing.analysis import states
from probing.analysis.states import thread_state
from probing.cli.render import ESCAPED, inert
from probing.engine.sources import SourceLines

ROOT = Path(__file__).resolve().parents[2]
FRONT = ROOT / "native" / "front"
FALLBACK = "\x01FALLBACK"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("front-check")
    subprocess.run(
        [sys.executable, str(FRONT / "gen_tables.py"), str(ROOT), str(folder / "front_tables.h")], check=True
    )
    sources = [str(FRONT / name) for name in ("check.c", "json.c", "utf8.c", "states.c", "sources.c")]
    binary = folder / "check"
    subprocess.run(
        [compiler, "-O1", "-Wall", "-Wextra", "-Werror", "-I", str(folder), "-o", str(binary), *sources],
        check=True,
    )
    return binary


def answers(driver: Path, cases: List[Dict[str, Any]]) -> List[str]:
    lines = "".join(json.dumps(case) + "\n" for case in cases)
    result = subprocess.run([str(driver)], input=lines.encode(), capture_output=True, check=True)
    return [line.decode("utf-8", "surrogateescape") for line in result.stdout.split(b"\n")[:-1]]


def test_inert(driver: Path) -> None:
    texts = [chr(code) for code in ESCAPED] + [
        "plain", "tab\there", "é and 漢字 and 😀", "\x1b]0;title\x07", "\u202eevil\u2066", "a\udcffb\udc80",
        "MainThread\r\nThread 1", "\x9b31m", "",
    ]  # fmt: skip
    assert answers(driver, [{"inert": text} for text in texts]) == [inert(text) for text in texts]


def frame(file: str, func: str, lineno: Any = 1, frame_type: str = "Python") -> Dict[str, Any]:
    return {"file": file, "func": func, "lineno": lineno, "frame_type": frame_type}


LIB = "/usr/lib/python3.11"


def state_cases(sources: Path) -> List[List[Dict[str, Any]]]:
    cases: List[List[Dict[str, Any]]] = []
    mine = frame(str(sources), "main", 1)
    for part, funcs, _ in states.LIBRARY_CALLS:
        path = (
            f"{LIB}{part}x.py"
            if part.endswith("/")
            else (f"{LIB}{part}" if part.startswith("/") else f"/site/{part}")
        )
        if part.startswith("torch"):
            path = f"/site-packages/{part}"
        for func in funcs or ("anything",):
            cases.append([frame(path, func), mine])
            cases.append([frame(f"/home/me{part}", func), mine])  # not the standard library's
    cases.append([frame(f"{LIB}/threading.py", "wait"), frame(f"{LIB}/threading.py", "wait"), mine])
    cases.append([frame(f"{LIB}/threading.py", "acquire"), frame(f"{LIB}\\threading.py", "wait"), mine])
    for func in ("all_reduce", "barrier", *states.WRAPPERS):
        path = "/site-packages/torch/distributed/distributed_c10d.py"
        cases.append([frame(path, "wrapper"), frame(path, func), mine])
    for names, _ in states.NATIVE_CALLS:
        for name in names:
            cases.append([frame("libc.so.6", name, None, "Native"), mine])
            cases.append(
                [frame("libc.so.6", "0x7f00", None, "Native"), frame("libc.so.6", name, None, "Native")]
            )
    for name in ("take_gil", "PyEval_RestoreThread", "PyEval_AcquireThread", "unknown", ""):
        cases.append(
            [frame("libpython.so", "x", None, "Native"), frame("libpython.so", name, None, "Native")]
        )
    cases.append([frame(str(sources), "acquire", 1)])
    cases.append([frame("<frozen importlib._bootstrap>", "f", 3)])
    cases.append([frame(str(sources), "f", None)])
    lines = sources.read_text().splitlines()
    for lineno in range(0, len(lines) + 3):
        cases.append([frame(str(sources), "f", lineno)])
    return cases


CODE_LINES = [
    "lock.acquire()", "with lock:", "with self._lock as held:", "with open(path) as handle:",
    "with torch.no_grad():", "with  x :", "time.sleep(1)", "sock.recv(1024)", "conn.recv_into(buf)",
    "s.accept()", "sel.select(0.1)", "p.poll()", "select.select([a], [], [])", "for line in sys.stdin:",
    "name = input('> ')", "data = sys.stdin.read()", "f.read()", "f.readline()", "f.readinto(b)",
    "x = open(path)", "open(path)", "reopen(path)", "total += 1", "\u3000with lock:\u3000", "with lock: # x",
    "with\tlock:",
]  # fmt: skip


def test_thread_states(driver: Path, tmp_path: Path) -> None:
    sources = tmp_path / "job.py"
    sources.write_text("\n".join(CODE_LINES) + "\n")
    reader = SourceLines(None)
    cases = state_cases(sources)
    for owns_gil in (False, True):
        expected = [
            thread_state(case, lambda row: reader.line(row["file"], row["lineno"]), {"owns_gil": owns_gil})
            for case in cases
        ]
        assert answers(driver, [{"frames": case, "owns_gil": owns_gil} for case in cases]) == expected


SOURCE_FILES = {
    "crlf": b"a = 1\r\nb = 2\r\n\r\nc = 3",
    "cr-and-breaks": b"one\rtwo\x0bthree\x0cfour\x1cfive\x1dsix\x1eseven"
    b"\xc2\x85eight\xe2\x80\xa8nine\xe2\x80\xa9ten",
    "spaces": "\u3000  x = 1\u00a0\t\n\u2003y = 2 \u205f\n".encode(),
    "bad-bytes-elsewhere": b"good = 1\n\xff\xfe bad\nalso = 'fine'\n\xe2\x80\n",
    "empty": b"",
    "no-final-newline": b"first\nlast",
    "only-newlines": b"\n\n\n",
}


@pytest.mark.parametrize("name", sorted(SOURCE_FILES))
def test_source_lines(driver: Path, tmp_path: Path, name: str) -> None:
    path = tmp_path / f"{name}.py"
    path.write_bytes(SOURCE_FILES[name])
    reader = SourceLines(None)
    linenos = list(range(-1, 14))
    got = answers(driver, [{"file": str(path), "lineno": lineno} for lineno in linenos])
    for lineno, line in zip(linenos, got):
        expected = reader.line(str(path), lineno)
        if line == FALLBACK:  # only where Python shows a U+FFFD: the Python CLI prints those lines
            assert "\ufffd" in expected
        else:
            assert line == expected, lineno
    missing = answers(
        driver, [{"file": str(tmp_path / "gone.py"), "lineno": 1}, {"file": str(tmp_path), "lineno": 1}]
    )
    assert missing == ["", ""]


def test_column_types_are_the_protocols(driver: Path) -> None:
    """table.c reads its column types and encodings from the generated header, which holds
    protocol/tables.py ENCODING_OF_TYPE; none is written by hand in table.c."""
    import re

    from probing.protocol.tables import ENCODING_OF_TYPE

    header = (driver.parent / "front_tables.h").read_text()
    listed = header[header.index("COLUMN_TYPES[]") :].split(";", 1)[0]
    assert dict(re.findall(r'\{"([A-Z\[\]]+)", "([a-z0-9]+)"\}', listed)) == ENCODING_OF_TYPE
    table = (FRONT / "table.c").read_text()
    assert "COLUMN_TYPES" in table
    assert not any(f'"{kind}"' in table for kind in ENCODING_OF_TYPE)
