"""What `flamegraph` writes when the job's names are hostile (terminal escapes, lone surrogates),
what it makes of a hostile agent's figures, and py-spy's text with long names."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from probing.cli.flamegraph import FORMATS, figures_line, for_output, parts_of
from probing.cli.render.files import write_output
from probing.engine.flames.sampled import Flame, flame_from_agent_answer, parse_pyspy_raw
from probing.errors import ProbingError

ESCAPES = "t\x1b]0;pwned\x07\x1b[2J\x9b"
SURROGATE = "bad\ud800name"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def flame(*names: str) -> Flame:
    stacks: List[Tuple[Tuple[str, ...], float]] = [
        ((name, f"f{n} (a.py:1)"), 3.0) for n, name in enumerate(names)
    ]
    return Flame(stacks, "samples", " ".join(names), [], {"source": "agent", "samples": 3})


@pytest.mark.parametrize("kind", FORMATS)
def test_names_reach_a_terminal_inert_and_a_file_exact(kind: str, monkeypatch: pytest.MonkeyPatch) -> None:
    picture = flame(ESCAPES)
    monkeypatch.setattr(sys, "stdout", Terminal())
    to_terminal = "".join(for_output(parts_of(picture, kind), "-"))
    assert "\x1b" not in to_terminal and "\x07" not in to_terminal and "\x9b" not in to_terminal
    assert "pwned" in to_terminal  # the name is still there, its escapes made visible or replaced
    to_file = "".join(for_output(parts_of(picture, kind), "cpu.out"))
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    to_pipe = "".join(for_output(parts_of(picture, kind), "-"))
    assert to_pipe == to_file == "".join(parts_of(picture, kind))


@pytest.mark.parametrize("kind", FORMATS)
def test_a_lone_surrogate_in_a_name_writes_with_a_replacement(
    kind: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    picture = flame(SURROGATE)
    size = write_output(str(tmp_path / "out"), for_output(parts_of(picture, kind), "x"))
    written = (tmp_path / "out").read_bytes()
    # SVG holds no character XML cannot (U+FFFD); the others show the surrogate escaped
    replaced = "\ufffd".encode() if kind == "svg" else b"\\ud800"
    assert size == len(written) and replaced in written
    write_output("-", for_output(parts_of(picture, kind), "-"))
    assert replaced.decode() in capfd.readouterr().out


def answer(**figures: Any) -> Dict[str, Any]:
    base: Dict[str, Any] = {"frames": [["f", "a.py", 1]], "stacks": [[1, "t", [0]]], "samples": 1}
    base.update({"rate_hz": 1.0, "duration_s": 1.0, "cost_share": 0.001, "ended": "done"})
    base.update(figures)
    return base


@pytest.mark.parametrize(
    "figures",
    [{"samples": "x"}, {"samples": 10**400}, {"samples": True}, {"cost_share": "x"}, {"rate_hz": 10**400},
     {"duration_s": float("nan")}, {"ended": ["done"]}, {"stacks": [[10**400, "t", [0]]]}],
)  # fmt: skip
def test_an_agents_figures_of_the_wrong_type_are_a_clear_error(figures: Dict[str, Any]) -> None:
    with pytest.raises(ProbingError):
        flame_from_agent_answer(answer(**figures), "t")


def test_one_sample_is_said_in_the_singular() -> None:
    said = figures_line(flame_from_agent_answer(answer(), "t"))
    assert said.startswith("1 sample in 1.0 s") and "0.100%" in said


def test_pyspy_text_with_a_long_name_full_of_parens_is_read_in_linear_time() -> None:
    name = " (" * 100_000
    started = time.perf_counter()
    stacks = parse_pyspy_raw(f"thread (7): {name};f (a.py:3) 2\n")
    assert time.perf_counter() - started < 1.0  # backtracking took 5 s on 64 k characters
    assert stacks == [((name, "f (a.py:3)"), 2.0)]
