"""What many ranks answered (`--ranks`), for people and for scripts.

For people, answers that are the same on several ranks are shown once, headed by those ranks
("ranks 0,1,3"): in a stuck job of 64 ranks, 63 identical stacks and the one that differs is
the whole story. Ranks that gave no answer are named on stderr with why, after the answers.

For scripts, `--format json` is one object: {"job": {...}, "ranks": [...]}, one entry per
rank with `rank`, `local_rank`, `node`, `pid` and either the command's own JSON fields or
`error` and `exit_code`. Row formats gain `rank`, `local_rank` and `node` columns.
"""

from __future__ import annotations

import io
import sys
from typing import IO, TYPE_CHECKING, Any, Callable, Dict, List, Sequence, Tuple

from ...analysis.rank_ranges import rank_runs
from ...errors import RemoteError
from ...schema.rows import backtrace_values_of
from ...schema.tables import BACKTRACE, RANK_COLUMNS
from ...sql.session import with_columns
from . import inert, inert_lines
from .backtrace import write_thread
from .json_writer import write_json
from .memory import write_memory_answer
from .reports import switch_fields, write_switch, write_tables
from .rows import write_rows

if TYPE_CHECKING:
    from ...engine.backtrace import Stacks
    from ...engine.jobs.fanout import Gathered, Missing
    from ...engine.jobs.job import Job, Rank


def rank_ranges(ranks: Sequence[int]) -> str:
    """0,1,3 or 0-3: runs of three or more as ranges."""
    return rank_runs(ranks, 3)


def _pid_text(rank: Rank) -> str:
    """A local rank's PID; a remote one's with its node, where that PID is; ? where unknown."""
    if rank.unreachable is not None:
        return "?"
    if rank.remote:
        return f"{rank.pid} on {rank.host or rank.endpoint}"
    return str(rank.pid)


# Past this many ranks a heading counts their PIDs and nodes instead of listing them: a block
# of 1 000 ranks headed by 1 000 PIDs is a page nobody reads (`ranks` lists every PID).
HEADING_PIDS = 8


def heading(ranks: Sequence[Rank]) -> str:
    numbers = [rank.rank for rank in ranks]
    word = "rank" if len(numbers) == 1 else "ranks"
    if len(ranks) > HEADING_PIDS:
        nodes = len({rank.node for rank in ranks})
        return f"{word} {rank_ranges(numbers)} ({len(ranks)} ranks on {nodes} node{'s' if nodes > 1 else ''})"
    pids = ", ".join(_pid_text(rank) for rank in sorted(ranks))
    return f"{word} {rank_ranges(numbers)} (PID{'s' if len(ranks) > 1 else ''} {pids})"


def rank_fields(rank: Rank) -> Dict[str, Any]:
    fields: Dict[str, Any] = {
        "rank": rank.rank,
        "local_rank": rank.local_rank,
        "node": rank.node,
        "pid": rank.pid,
    }
    if rank.remote:
        fields.update(host=rank.host, endpoint=rank.endpoint)
    return fields


def job_fields(job: Job) -> Dict[str, Any]:
    return {"run_id": job.run_id, "launcher_pid": job.launcher, "rendezvous": job.master,
            "world_size": job.world_size}  # fmt: skip


def write_job_header(job: Job, gathered: Gathered, out: IO[str]) -> None:
    asked = len(gathered.answers) + len(gathered.missing)
    ranks = "rank" if asked == 1 else "ranks"
    out.write(f"Job: {inert(job.name())}; world size {job.world_size}, {asked} {ranks} asked here\n")


def write_missing(missing: List[Missing], err: IO[str] = sys.stderr) -> None:
    """The ranks that gave no answer, with why: ranks that gave the same reason together (a node
    that cannot be reached is one line, not one per rank), an eval that raised with its traceback."""
    reasons: Dict[Tuple[str, str], List[Missing]] = {}
    for each in missing:
        error = each.error
        if isinstance(error, RemoteError) and error.traceback:
            err.write(f"probing: {heading([each.rank])}: {inert(error.message)}\n")
            err.write(inert_lines(error.traceback, err))
            continue
        reasons.setdefault((error.message, error.hint or ""), []).append(each)
    for (message, hint), alike in reasons.items():
        err.write(f"probing: {heading([each.rank for each in alike])}: {inert(message)}\n")
        if hint:
            err.write(f"  hint: {inert(hint)}\n")
    err.flush()


def write_json_answers(job: Job, gathered: Gathered, fields: Callable[[Any], Dict[str, Any]]) -> None:
    entries = [
        {**rank_fields(rank), **fields(answer), **rank_fields(rank)} for rank, answer in gathered.answers
    ]
    for each in gathered.missing:
        error = {"error": each.error.message, "exit_code": int(each.error.exit_code)}
        entries.append(dict(rank_fields(each.rank), **error))
    entries.sort(key=lambda entry: entry["rank"])

    write_json({"job": job_fields(job), "ranks": entries})


def write_folded(blocks: List[Tuple[List[Rank], str]], out: IO[str]) -> None:
    """Text blocks each headed by the ranks it is true of."""
    for index, (ranks, text) in enumerate(blocks):
        out.write(f"{'' if index == 0 else chr(10)}── {heading(ranks)} ──\n")
        out.write(text)


def fold(answers: List[Tuple[Rank, str]]) -> List[Tuple[List[Rank], str]]:
    """Ranks with the same text together, in the order of their first rank."""
    blocks: Dict[str, List[Rank]] = {}
    for rank, text in sorted(answers, key=lambda pair: pair[0].rank):
        blocks.setdefault(text, []).append(rank)
    return [(ranks, text) for text, ranks in blocks.items()]


# --- backtrace --------------------------------------------------------------------------------


def _thread_blocks(stacks: Stacks) -> List[Tuple[Tuple[Any, ...], str, int]]:
    """Each thread of one rank as (what makes it the same as another rank's, its text, how many
    source lines the text shows). The same stack is the same thread whether or not its source
    lines could be read here (a rank of another node's files are not read), and the thread's
    number differs from rank to rank: neither is in the key."""
    blocks = []
    for thread in stacks.threads:
        buffer = io.StringIO()
        write_thread(thread, buffer, numbered=False)
        frames = tuple((frame.native, frame.func, frame.file, frame.lineno, tuple(frame.locals))
                       for frame in thread.frames)  # fmt: skip
        # An asyncio loop's thread is the same only with the same tasks, awaiting the same.
        tasks = tuple((task.name, task.coroutine, task.state, task.level,
                       tuple((frame.func, frame.file, frame.lineno) for frame in task.frames))
                      for task in thread.tasks)  # fmt: skip
        loop = (tasks, thread.task_count, thread.tasks_unread)
        key = (not thread.is_main, thread.name, thread.state, frames, loop)
        blocks.append((key, buffer.getvalue(), sum(1 for frame in thread.frames if frame.code)))
    return blocks


def write_job_stacks(job: Job, gathered: Gathered, format: str) -> None:
    """Every rank's threads; a thread whose stack (and state) is the same on several ranks is
    shown once, headed by them. Main threads first."""
    for rank, stacks in gathered.answers:
        for message in stacks.notes:
            sys.stderr.write(f"probing: {heading([rank])}: {inert(message)}\n")
    if format != "text":
        names = BACKTRACE.column_names()
        types = [column.type for column in BACKTRACE.columns + RANK_COLUMNS]
        every = [
            (*backtrace_values_of(row), rank.rank, rank.local_rank, rank.node)
            for rank, stacks in sorted(gathered.answers, key=lambda pair: pair[0].rank)
            for row in stacks.rows
        ]
        write_rows([*names, *(column.name for column in RANK_COLUMNS)], types, every, format)
        write_missing(gathered.missing)
        return
    out = sys.stdout
    write_job_header(job, gathered, out)
    by_key: Dict[Tuple[Any, ...], List[Rank]] = {}
    texts: Dict[Tuple[Any, ...], Tuple[int, str]] = {}
    for rank, stacks in sorted(gathered.answers, key=lambda pair: pair[0].rank):
        for key, text, lines in _thread_blocks(stacks):
            by_key.setdefault(key, []).append(rank)
            if lines > texts.get(key, (-1, ""))[0]:  # the text that shows the most of the source
                texts[key] = (lines, text)
    order = sorted(by_key, key=lambda key: (key[0], min(rank.rank for rank in by_key[key])))
    for key in order:
        # Threads of one rank with the same stack (a pool's idle workers) are one block too.
        ranks = sorted(set(by_key[key]))
        threads = len(by_key[key])
        each = f", {threads} threads" if threads > len(ranks) else ""
        out.write(f"\n── {heading(ranks)}{each} ──\n{texts[key][1]}")
    out.flush()
    write_missing(gathered.missing)


# --- eval, trace / nan, tables -----------------------------------------------------------------


def write_job_evals(job: Job, gathered: Gathered) -> None:
    """What the code printed and its value on each rank; ranks that printed the same shown once."""
    out = sys.stdout
    texts = []
    for rank, result in gathered.answers:
        text = result.get("stdout") or ""
        if result.get("stderr"):
            text += result["stderr"]
        if result.get("value") is not None:
            text += f"{result['value']}\n"
        texts.append((rank, inert_lines(text, out)))
    write_folded(fold(texts), out)
    out.flush()
    write_missing(gathered.missing)


def write_job_switches(job: Job, feature: str, action: str, gathered: Gathered, format: str) -> None:
    """`trace` / `nan` on many ranks: what each did and where it stands, the same shown once."""
    if format == "json":
        write_json_answers(job, gathered, switch_fields)
        write_missing(gathered.missing)
        return
    out = sys.stdout
    texts = []
    for rank, result in gathered.answers:
        buffer = io.StringIO()
        write_switch(feature, action, result, format, buffer)
        texts.append((rank, inert_lines(buffer.getvalue(), out)))
    write_folded(fold(texts), out)
    out.flush()
    write_missing(gathered.missing)


def write_job_memory(job: Job, gathered: Gathered, format: str) -> None:
    """`memory` on many ranks: each rank's report under its heading."""
    if format == "json":
        write_json_answers(job, gathered, lambda answer: dict(answer.result))
        write_missing(gathered.missing)
        return
    texts = []
    for rank, answer in gathered.answers:
        buffer = io.StringIO()
        write_memory_answer(answer, format, None, buffer)
        texts.append((rank, buffer.getvalue()))
    write_folded(fold(texts), sys.stdout)
    sys.stdout.flush()
    write_missing(gathered.missing)


def write_job_tables(gathered: Gathered, format: str) -> None:
    """`tables` on many ranks: the tables of the first rank that answered (every rank of a job
    runs the same code), each with the columns --ranks adds."""
    if gathered.answers:
        first = min(gathered.answers, key=lambda pair: pair[0].rank)[1]
        write_tables([with_columns(table, RANK_COLUMNS) for table in first], format)
        sys.stdout.flush()
    write_missing(gathered.missing)
