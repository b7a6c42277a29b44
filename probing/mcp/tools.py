"""The tools `probing mcp` serves: each a `probing` command line with `--format json`, answered
with the CLI's JSON as structured data and one short sentence for the assistant to read first.

TARGET is what the CLI takes: a PID (any rank of a torchrun job, or torchrun itself), an agent's
socket path, tcp://HOST:PORT, a record file a job left, or a core file. Reading tools never change
the job; the tools that do (`eval`, `trace`, `nan`) refuse unless the server was started with
--allow-changes, and then each call is logged to the server's stderr.
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tempfile
import time
from typing import Any, Awaitable, Callable, Dict, List, Literal, Optional

from .calls import DEADLINE_MARGIN_S, CliAnswer, run_cli
from .folding import backtrace_summary, fold_stacks

Call = Callable[..., Awaitable[Any]]
# The exit codes that are an answer, not a failure: a verdict (hung, straggler) or a partial one.
ANSWERS = (0, 11, 14, 20)
QUERY_ROWS = 200


# A report's file name: no folder of its own, so that no call writes outside the reports folder.
REPORT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,120}\.html")
# The longest watch a call may ask for (hang, stragglers) and the longest wait (eval, ranks).
MAX_SECONDS = 600.0


def reports_folder() -> str:
    """This user's folder for the reports the server writes: made private, and refused when
    someone else made it first (a folder of the same name in /tmp, or a link)."""
    folder = os.path.join(tempfile.gettempdir(), f"probing-reports-{os.getuid()}")
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    found = os.lstat(folder)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise ValueError(
            f"{folder} is not a private folder of this user's: remove it, and probing makes it anew"
        )
    return folder


def bounded(seconds: float, what: str) -> float:
    if not 0 < seconds <= MAX_SECONDS:
        raise ValueError(f"{what} must be more than 0 and at most {MAX_SECONDS:.0f} seconds, not {seconds:g}")
    return seconds


class Refused(Exception):
    """A tool that changes the job, called on a server started without --allow-changes."""


def target_arguments(target: str, command: List[str]) -> List[str]:
    """TARGET as `--target=…`: a value beginning with `-` stays a value, never an option."""
    target = str(target).strip()
    if not target:
        raise ValueError(
            "target is empty: give a PID, a socket path, tcp://HOST:PORT, a record or a core file"
        )
    return [f"--target={target}", *command]


def with_ranks(command: List[str], ranks: Optional[str]) -> List[str]:
    return [*command, f"--ranks={ranks}"] if ranks else command


def answered(answer: CliAnswer, summary: str, value: Any = None) -> Dict[str, Any]:
    """The tool's result: structured data (the CLI's JSON, or `value`) and the sentence."""
    data = answer.value if value is None else value
    failed = answer.exit_code not in ANSWERS or data is None and answer.exit_code != 0
    text = answer.said if failed else summary
    if not failed and answer.exit_code != 0:
        text += f" (exit {answer.exit_code}: {answer.meaning})"
    return {
        "text": text or answer.meaning,
        "is_error": failed,
        "structured": {
            "command": "probing " + " ".join(answer.command),
            "exit_code": answer.exit_code,
            "meaning": answer.meaning,
            "result": None if failed else data,
            "said": answer.said,
        },
    }


async def list_processes() -> Dict[str, Any]:
    """This machine's Python processes you can see: PID, user, Python version, whether each has
    a probing agent, and the torchrun job and rank each belongs to (a job's ranks together)."""
    answer = await run_cli(["list", "--format", "json"], DEADLINE_MARGIN_S)
    rows = answer.value or []
    jobs = {row.get("job") for row in rows if row.get("job")}
    agents = sum(1 for row in rows if row.get("agent"))
    summary = f"{len(rows)} Python processes ({agents} with an agent), {len(jobs)} distributed jobs"
    return answered(answer, summary, {"processes": rows})


async def ranks(target: str, timeout: float = 5.0) -> Dict[str, Any]:
    """Every rank of the torchrun job TARGET belongs to: rank, local rank, node, PID, whether its
    agent answers, its main thread's state and where it is."""
    command = target_arguments(
        target, ["ranks", "--format", "json", f"--timeout={bounded(timeout, 'timeout')}"]
    )
    answer = await run_cli(command, timeout + DEADLINE_MARGIN_S)
    value = answer.value if isinstance(answer.value, dict) else {}
    rows = value.get("ranks") or []
    job = value.get("job") or {}
    where = f" of job {job.get('run_id')}" if isinstance(job, dict) and job.get("run_id") else ""
    return answered(answer, f"{len(rows)} ranks{where}")


async def backtrace(
    target: str, ranks: Optional[str] = None, locals: bool = False, native: bool = False
) -> Dict[str, Any]:
    """Where every thread is right now (most recent call last). With ranks ("all" or "0,3-5"),
    every rank of the job, identical stacks folded into one with the ranks that share it."""
    command = [
        "backtrace",
        "--format",
        "json",
        *(["--locals"] if locals else []),
        *(["--native"] if native else []),
    ]
    answer = await run_cli(target_arguments(target, with_ranks(command, ranks)), DEADLINE_MARGIN_S)
    if not isinstance(answer.value, list):
        return answered(answer, "")
    threads = fold_stacks(answer.value)
    return answered(answer, backtrace_summary(threads), {"threads": threads})


async def query(
    target: str, sql: str, ranks: Optional[str] = None, max_rows: int = QUERY_ROWS
) -> Dict[str, Any]:
    """Read-only DuckDB SQL over the job's tables (python.backtrace, python.threads,
    python.torch_trace, python.collectives, process.memory, ...; `SELECT * FROM tables` lists them).
    With ranks, every rank's rows with rank, local_rank and node columns. Files are out of reach
    of the SQL: it reads the tables and nothing else."""
    command = with_ranks(["query", "--format", "json"], ranks)
    answer = await run_cli(target_arguments(target, [*command, "--", sql]), DEADLINE_MARGIN_S)
    rows = answer.value if isinstance(answer.value, list) else []
    kept = rows[: max(0, max_rows)]
    summary = f"{len(rows)} rows" + (
        f" (the first {len(kept)} given: max_rows)" if len(kept) < len(rows) else ""
    )
    value = {"rows": kept, "row_count": len(rows), "rows_left_out": len(rows) - len(kept)}
    return answered(answer, summary, value if answer.value is not None else None)


async def hang(target: str, ranks: Optional[str] = None, duration: float = 10.0) -> Dict[str, Any]:
    """Watch every thread (with ranks, every rank) for DURATION seconds: is the job hung, which
    rank and thread stopped, and where; the collective the others wait in."""
    command = with_ranks(["hang", "--format", "json", f"--duration={bounded(duration, 'duration')}"], ranks)
    answer = await run_cli(target_arguments(target, command), duration + DEADLINE_MARGIN_S)
    value = answer.value if isinstance(answer.value, dict) else {}
    summary = str(
        value.get("summary") or value.get("verdict") or ("hung" if value.get("hung") else "not hung")
    )
    return answered(answer, summary)


async def stragglers(target: str, duration: float = 10.0) -> Dict[str, Any]:
    """Which rank the whole job waits for (a job that is slow, not stuck): each rank's arrivals
    at the collectives over DURATION seconds, by how much it is late and in which phase."""
    command = ["stragglers", "--format", "json", f"--duration={bounded(duration, 'duration')}"]
    answer = await run_cli(target_arguments(target, command), duration + DEADLINE_MARGIN_S)
    value = answer.value if isinstance(answer.value, dict) else {}
    return answered(answer, str(value.get("summary") or ""))


async def memory(target: str, ranks: Optional[str] = None) -> Dict[str, Any]:
    """Where the memory is: RSS and its growth, Python objects by type, torch's CPU and CUDA
    memory, the largest tensors and who holds them."""
    answer = await run_cli(target_arguments(target, with_ranks(["memory", "--format", "json"], ranks)), 70.0)
    value = answer.value if isinstance(answer.value, dict) else {}
    rss = value.get("rss_mb")
    return answered(answer, f"RSS {rss:.0f} MB" if isinstance(rss, (int, float)) else "memory read")


async def records() -> Dict[str, Any]:
    """The records jobs left on this machine when they ended (or were written on demand), newest
    first; each record's path is a TARGET for backtrace, query, hang and memory."""
    answer = await run_cli(["records", "--format", "json"], DEADLINE_MARGIN_S)
    rows = answer.value if isinstance(answer.value, list) else []
    return answered(answer, f"{len(rows)} records", {"records": rows} if answer.value is not None else None)


async def report(target: str, ranks: Optional[str] = None, name: Optional[str] = None) -> Dict[str, Any]:
    """Write one HTML page of the job (stacks, hang verdict, stragglers, step times, memory
    charts) into this server's reports folder and return its path, for the person to open in a
    browser. NAME: the file's name (letters, digits, `.`, `-`, `_`; ending .html), else one made
    of the target and the time."""
    if name is None:
        stem = "".join(c if c.isalnum() else "-" for c in str(target))[-40:]
        name = f"report-{stem}-{time.strftime('%Y%m%d-%H%M%S')}.html"
    if not REPORT_NAME.fullmatch(name):
        raise ValueError(
            f"name must be a file name ending .html (letters, digits, '.', '-', '_'), not {name!r:.80}"
        )
    output = os.path.join(reports_folder(), name)
    command = target_arguments(target, with_ranks(["report", f"--output={output}"], ranks))
    answer = await run_cli(command, 120.0 + DEADLINE_MARGIN_S, parse_json=False)
    written = answer.exit_code in ANSWERS and os.path.isfile(output)
    value = {"path": output, "bytes": os.path.getsize(output)} if written else None
    return answered(answer, f"wrote {output}", value)


async def eval_code(
    target: str, code: str, ranks: Optional[str] = None, timeout: float = 10.0
) -> Dict[str, Any]:
    """Run Python CODE in the job's __main__ namespace and return what it printed and its value
    (changes the job: off unless the server was started with --allow-changes)."""
    command = with_ranks(["eval", f"--timeout={bounded(timeout, 'timeout')}"], ranks)
    answer = await run_cli(
        target_arguments(target, [*command, "--", code]), timeout + DEADLINE_MARGIN_S, False
    )
    value = {"output": answer.stdout} if answer.exit_code == 0 else None
    return answered(answer, answer.stdout.strip()[-2000:] or "(no output)", value)


async def trace(
    target: str, action: Literal["on", "off", "status"], ranks: Optional[str] = None
) -> Dict[str, Any]:
    """Time the job's modules and optimizer steps into python.torch_trace: on, off or status
    (on and off change the job: off unless the server was started with --allow-changes)."""
    answer = await run_cli(
        target_arguments(target, with_ranks(["trace", action, "--format", "json"], ranks)), 70.0
    )
    return answered(answer, f"trace {action}")


async def nan(
    target: str, action: Literal["on", "off", "status"], stop: bool = False, ranks: Optional[str] = None
) -> Dict[str, Any]:
    """Check module outputs and gradients for NaN/Inf into python.nan_events: on (with stop, raise
    in the training thread at the first one), off or status (on and off change the job: off
    unless the server was started with --allow-changes)."""
    command = ["nan", action, "--format", "json", *(["--stop"] if stop else [])]
    answer = await run_cli(target_arguments(target, with_ranks(command, ranks)), 70.0)
    return answered(answer, f"nan {action}" + (" --stop" if stop else ""))


READING: List[Call] = [list_processes, ranks, backtrace, query, hang, stragglers, memory, records, report]
CHANGING: Dict[str, Call] = {"eval": eval_code, "trace": trace, "nan": nan}


def changes_the_job(name: str, arguments: Dict[str, Any]) -> bool:
    """Whether a call of a CHANGING tool changes the job (`status` only reads)."""
    return name == "eval" or arguments.get("action") != "status"


def log_change(name: str, arguments: Dict[str, Any]) -> None:
    shown = ", ".join(f"{key}={value!r}"[:300] for key, value in arguments.items() if value is not None)
    print(f"probing mcp: {name}({shown})", file=sys.stderr, flush=True)
