"""The fuzz layer's harness: property-based tests (hypothesis) for every decoder of bytes a job
controls, under one contract, with a fixed budget and a seed corpus kept in the repo.

The contract, for every input: the decoder returns an answer, or raises the documented refusal
(for the CLI: a ProbingError, whose exit code `probing --help` lists and whose message prints as
one line of at most MAX_MESSAGE_CHARS characters); never another exception; within TIME_LIMIT_S
(10 s) and MEMORY_LIMIT_BYTES (500 MB of resident memory above what the process held before).
A broken contract fails the test with ContractBroken naming the input: its repr (cut at
REPR_CHARS) and a temporary file holding all of it, with the command that keeps it in the corpus.

Writing a fuzz test for another decoder (records, `.fatal` text, ...)
----------------------------------------------------------------------

    from harness import BYTES, fuzzes, frames

    @fuzzes("records", examples=150, mutations=BYTES + (frames(prefix=8),))
    def test_record_files(tmp_path_factory, data: bytes) -> object:
        '''A record file as `probing FILE backtrace` reads it.'''
        path = written(tmp_path_factory, data)
        return read_record_as_the_cli_does(path)

- The decorated function is the adapter: it runs the decoder on one input exactly as the CLI
  does and returns the answer. Its last parameter is `data` (bytes); any before it are pytest
  fixtures (module- or session-scoped: hypothesis runs many inputs in one test call).
- `corpus`: the folder tests/fuzz/corpus/<corpus>/ holding real captured inputs, one a file
  (capture_corpus.py says how each was made). Every file there runs first, as an explicit
  example, so a crasher kept there stays covered; then `examples` generated inputs, each either
  a seed changed by one to four `mutations` or drawn from scratch (`scratch`).
- `mutations` (mutations.py; every name there can be imported from here): BYTES (bit flips,
  truncation, splicing, huge lengths, lone surrogates, NaN and 1e308 written into the text, deep
  nesting) for any format; json_values() for inputs that are one JSON document; frames(prefix)
  for streams of protocol frames (a record file: prefix=8, its magic); sealed(...) for sealed TCP
  records; text_values() for text. `scratch`: SCRATCH_BYTES, json_texts(), frame_streams(),
  sealed_streams(side).
- `allowed`: the refusals of this decoder (default ProbingError). `answer`: a function that
  checks the answer and returns what is wrong with it, or None.
- `pattern`: which seed files (a glob, or a tuple of them: `("backtrace-*", "crash-*")`) when an
  adapter reads only some of the folder's.
- An adapter that runs a program (a native decoder) checks what only it can see (a signal, a
  sanitizer's report, the child's peak memory: `child_memory_problem`) and raises Broken.

The budget: all fuzz tests together take at most 60 s on a 2-core machine (`pytest tests/fuzz`,
timed in docs/decisions.md). Runs are derandomized: CI sees the same inputs every time, and no
example database is written (hypothesis would put one in .hypothesis/ in the source tree).
PROBING_FUZZ_SCALE=N runs N times as many examples; PROBING_FUZZ_SEED=S draws other inputs
(seeded, with an in-memory database), for a longer search by hand.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import signal
import tempfile
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type, Union

import mutations
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st
from hypothesis.database import InMemoryExampleDatabase
from mutations import BYTES, SCRATCH_BYTES, Mutation, inputs

from probing.cli.render import inert
from probing.errors import ExitCode, ProbingError

CORPUS = Path(__file__).resolve().parent / "corpus"
TIME_LIMIT_S = 10.0
MEMORY_LIMIT_BYTES = 500 << 20
REPR_CHARS = 400
# A refusal's message is one sentence for a person, whatever the input quoted in it.
MAX_MESSAGE_CHARS = 10_000
SCALE = float(os.environ.get("PROBING_FUZZ_SCALE", "1"))
SEED = os.environ.get("PROBING_FUZZ_SEED")


class ContractBroken(AssertionError):
    """A decoder broke the contract on an input; the message names the input."""


class Broken(Exception):
    """Raised by an adapter that saw the contract broken where only it can see (a native
    decoder killed by a signal, a sanitizer's report, a child over its memory)."""


class _TimedOut(BaseException):
    """The decoder ran past TIME_LIMIT_S. A BaseException, so that no `except Exception` in a
    decoder swallows it."""


# --- the seed corpus -------------------------------------------------------------------------


def load_corpus(folder: str, pattern: Union[str, Tuple[str, ...]] = "*") -> List[Tuple[str, bytes]]:
    """(name, bytes) of each seed file in tests/fuzz/corpus/<folder>/ matching `pattern` (or one
    of the patterns)."""
    directory = CORPUS / folder
    if not directory.is_dir():
        return []
    patterns = (pattern,) if isinstance(pattern, str) else pattern
    paths = sorted({path for each in patterns for path in directory.glob(each) if path.is_file()})
    return [(path.name, path.read_bytes()) for path in paths]


# --- the contract ------------------------------------------------------------------------------


class PeakMemory:
    """Resident memory this process gained at its peak while a decoder ran: the kernel's
    high-water mark, reset by writing 5 to /proc/self/clear_refs (Linux 4.0+). It counts what
    native code allocates as well as Python. Where the reset is refused, tracemalloc's peak."""

    def __init__(self) -> None:
        self._tracing = False
        self._start = 0

    @staticmethod
    def _status(field: str) -> int:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(field.encode() + b":"):
                    return int(line.split()[1]) * 1024
        raise OSError(f"no {field} in /proc/self/status")

    def __enter__(self) -> PeakMemory:
        try:
            with open("/proc/self/clear_refs", "w") as clear:
                clear.write("5")
            self._start = self._status("VmRSS")
        except OSError:
            import tracemalloc

            tracemalloc.start()
            self._tracing = True
        return self

    def __exit__(self, *exc: Any) -> None:
        pass

    def grown(self) -> int:
        if self._tracing:
            import tracemalloc

            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            return peak
        return max(0, self._status("VmHWM") - self._start)


def child_memory_problem(rusage: Any) -> Optional[str]:
    """What is wrong with a child's peak memory (os.wait4's rusage), or None."""
    peak = int(rusage.ru_maxrss) * 1024
    return f"the decoder's process peaked at {peak >> 20} MiB" if peak > MEMORY_LIMIT_BYTES else None


def is_utf8_text(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def rows_problem(columns: Sequence[Tuple[str, str]], rows: Sequence[Any]) -> Optional[str]:
    """What is wrong with `rows` (dicts) as rows of a table of these (name, type) columns, or None:
    each row has exactly those keys, each value NULL or of its column's type as DuckDB takes it
    (an int of 64 bits, a bool, text that is UTF-8: a lone surrogate fails the load)."""
    names = [name for name, _ in columns]
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or list(row) != names:
            return f"row {index} is not a row of the table: {str(row)[:200]}"
        for name, kind in columns:
            value = row[name]
            if value is None:
                continue
            if kind == "BIGINT":
                fits = isinstance(value, int) and not isinstance(value, bool) and -(2**63) <= value < 2**63
            elif kind == "BOOLEAN":
                fits = isinstance(value, bool)
            elif kind in ("DOUBLE", "TIMESTAMP"):
                fits = isinstance(value, (int, float)) and not isinstance(value, bool)
            else:
                fits = is_utf8_text(value)
            if not fits:
                return f"row {index}: {name} ({kind}) holds {type(value).__name__} {str(value)[:80]!r}"
    return None


def refusal_problem(error: BaseException) -> Optional[str]:
    """What is wrong with an allowed refusal, or None. A ProbingError must carry a documented
    exit code and a message the CLI prints as one line."""
    if not isinstance(error, ProbingError):
        return None
    if error.exit_code not in ExitCode.MEANINGS:
        return f"{type(error).__name__} has exit code {error.exit_code}, which `probing --help` does not list"
    message = error.message
    if not isinstance(message, str) or not message.strip():
        return f"{type(error).__name__} has no message: {message!r}"
    if len(message) > MAX_MESSAGE_CHARS:
        return f"{type(error).__name__}'s message has {len(message)} characters: {message[:200]!r}..."
    shown = inert(message)
    if "\n" in shown or "\r" in shown:
        return f"{type(error).__name__}'s message does not print as one line: {shown[:200]!r}"
    return None


def _on_alarm(signum: int, frame: Optional[FrameType]) -> None:
    raise _TimedOut


_kept_inputs: Optional[Path] = None


def keep_input(corpus: str, data: bytes) -> Path:
    """A temporary file holding `data`, named by its hash, for the failure message."""
    global _kept_inputs
    if _kept_inputs is None:
        _kept_inputs = Path(tempfile.mkdtemp(prefix="probing-fuzz-"))
    path = _kept_inputs / f"{corpus}-{hashlib.sha256(data).hexdigest()[:16]}.bin"
    path.write_bytes(data)
    return path


def describe_failure(corpus: str, data: bytes, problem: str) -> str:
    shown = repr(data)
    if len(shown) > REPR_CHARS:
        shown = shown[:REPR_CHARS] + f"... ({len(data)} bytes)"
    path = keep_input(corpus, data)
    keep = f"cp {path} tests/fuzz/corpus/{corpus}/crash-{path.stem.rsplit('-', 1)[-1]}.bin"
    return f"{problem}\n  input: {shown}\n  all of it: {path}\n  to keep it in the corpus: {keep}"


def check_contract(
    corpus: str,
    data: bytes,
    decode: Callable[[bytes], Any],
    allowed: Tuple[Type[BaseException], ...],
    answer: Optional[Callable[[Any], Optional[str]]],
) -> None:
    """Run `decode(data)` under the contract; ContractBroken naming `data` if it breaks it."""
    problem: Optional[str] = None
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    started = time.monotonic()
    with PeakMemory() as memory:
        try:
            result = decode(data)
        except _TimedOut:
            problem = f"the decoder ran past {TIME_LIMIT_S:g} s"
        except Broken as broken:
            problem = str(broken)
        except allowed as refusal:
            problem = refusal_problem(refusal)
        except (Exception, SystemExit):
            problem = "the decoder raised where it should have refused:\n" + traceback.format_exc()
        else:
            try:
                problem = answer(result) if answer is not None else None
            except Exception:  # noqa: BLE001 - an answer the check cannot even read is malformed
                problem = "the answer is not of the shape the CLI reads:\n" + traceback.format_exc()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        took = time.monotonic() - started
        grown = memory.grown()
    if problem is None and took > TIME_LIMIT_S:
        problem = f"the decoder took {took:.1f} s"
    if problem is None and grown > MEMORY_LIMIT_BYTES:
        problem = f"the decoder's process grew by {grown >> 20} MiB at its peak"
    if problem is not None:
        raise ContractBroken(describe_failure(corpus, data, f"{corpus}: {problem}"))


def fuzzes(
    corpus: str,
    *,
    examples: int,
    mutations: Sequence[Mutation] = BYTES,
    scratch: st.SearchStrategy[bytes] = SCRATCH_BYTES,
    allowed: Tuple[Type[BaseException], ...] = (ProbingError,),
    answer: Optional[Callable[[Any], Optional[str]]] = None,
    pattern: Union[str, Tuple[str, ...]] = "*",
) -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """The decorator that makes an adapter (module docstring) a fuzz test."""
    seeds = load_corpus(corpus, pattern)

    def decorate(adapter: Callable[..., Any]) -> Callable[..., None]:
        parameters = list(inspect.signature(adapter).parameters.values())
        if not parameters or parameters[-1].name != "data":
            raise TypeError(f"{adapter.__name__}: an adapter's last parameter is `data`")

        signature = inspect.Signature(parameters)

        def test(*args: Any, **kwargs: Any) -> None:
            given_now = dict(signature.bind(*args, **kwargs).arguments)
            data = given_now.pop("data")
            check_contract(corpus, data, lambda each: adapter(**given_now, data=each), allowed, answer)

        test.__name__ = adapter.__name__
        test.__qualname__ = adapter.__qualname__
        test.__doc__ = adapter.__doc__
        test.__module__ = adapter.__module__
        test.__signature__ = signature  # type: ignore[attr-defined]
        strategy = inputs([data for _, data in seeds], mutations, scratch)
        fuzzed: Callable[..., None] = given(data=strategy)(test)
        for _, data in reversed(seeds):
            fuzzed = example(data=data)(fuzzed)
        fuzzed = settings(
            max_examples=max(1, round(examples * SCALE)),
            deadline=None,  # the contract's own limit (TIME_LIMIT_S), not hypothesis' flaky one
            derandomize=SEED is None,
            database=None if SEED is None else InMemoryExampleDatabase(),
            suppress_health_check=list(HealthCheck),
            print_blob=False,
        )(fuzzed)
        if SEED is not None:
            fuzzed = seed(int(SEED))(fuzzed)
        return fuzzed

    return decorate


def __getattr__(name: str) -> Any:
    """Every name of mutations.py is one of this module's too: a fuzz test imports from one place."""
    return getattr(mutations, name)
