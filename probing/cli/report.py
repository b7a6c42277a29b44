"""`probing PID report -o job.html`: one self-contained HTML page of a job (or of a record):
the process, every thread's stack, the hang verdict, step time, the slowest modules, memory
over time, NaN events, the largest object types and tensors."""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import click

from ..engine.kinds import Ranks
from .invocation import Invocation
from .options import apply, pass_invocation
from .pictures.report_job import job_report_page
from .render import notes
from .render.files import check_output, counted, write_output, wrote
from .render.per_rank import write_missing
from .spec import RANKS, timeout

if TYPE_CHECKING:
    from ..engine.report.job import JobReport
    from ..engine.report.live import Report


@click.command()
@click.option("-o", "--output", required=True, metavar="FILE", help="The HTML file to write (- for stdout).")
@click.option(
    "--hang-duration", type=click.FloatRange(min=0), default=2.0, show_default=True, metavar="S",
    help="Seconds the hang check watches the threads (0: no hang check).",
)  # fmt: skip
@click.option(
    "--hang-samples", type=click.IntRange(min=2), default=5, show_default=True, help="Stack samples it takes."
)
@click.option(
    "--no-tensors", "tensors", flag_value=False, default=True,
    help="List the largest object types instead of the largest tensors (the job's objects are walked once "
    "either way: about one step's worth of its time).",
)  # fmt: skip
@apply(timeout(5.0, "Seconds to wait for each answer from the agent."), RANKS)
@pass_invocation
def report(
    invocation: Invocation,
    output: str,
    hang_duration: float,
    hang_samples: int,
    tensors: bool,
    timeout: float,
    ranks: Optional[str] = None,
) -> int:
    """One HTML page of the job to open offline or attach to an incident: the process, every
    thread's stack with its state, the hang verdict, step time, the slowest modules, memory
    over time, NaN events, the largest object types and tensors.

    \b
      probing PID report -o job.html          a live job (the hang check watches it 2 s)
      probing FILE report -o crash.html       a record: why it was written and the exception first
      probing PID report --ranks all -o job.html   every rank of the job on one page

    Sections that do not apply (no torch, no traced steps) are left out. When the agent cannot
    answer (a thread holds the GIL), the stacks are read from outside and the page says so.
    Threads with the same stack are drawn once, and at most 200 stacks are drawn.

    Exit status: 0 when the page is whole (a "Hung" verdict is on the page, not in the status:
    `probing PID hang` exits 11); 14 (partial) when a part failed, the target exited during
    the report included: the page is still written with what was read, and says what is
    missing at the top; an error, and no file, when nothing could be read. The directory of
    FILE is checked before the job is probed (exit 2 when it cannot be written). The file is
    made readable by its owner only (0600).

    With --ranks, one page of the whole job: the job's hang verdict (which ranks are behind, who
    waits in what), a row per rank, step time and memory with a line per rank, and every rank's
    threads (the same stack on several ranks drawn once, headed by them). Exit status 14 when
    some ranks gave no answer: they are named at the top of the page and on stderr.
    """
    check_output(output)
    if ranks is not None and not tensors:
        raise click.UsageError("--no-tensors goes without --ranks: the job's page lists no objects")
    answer = invocation.kind(ranks).report(timeout, hang_duration, hang_samples, tensors)
    if isinstance(answer, Ranks):
        _write_job_page(output, answer.value)
    else:
        _write_process_page(output, answer.value)
    return answer.exit_code


def _write_job_page(output: str, gathered: JobReport) -> None:
    """The job's page (--ranks), then the ranks that gave no answer on stderr."""
    written = write_output(output, [job_report_page(gathered)])
    shown = f"{counted(len(gathered.ranks), 'rank')}, {counted(gathered.thread_count, 'thread')}"
    took = gathered.timings.get("total_s", 0.0)
    wrote(output, written, f"{shown}, gathered in {took:.1f} s", "open it in a browser")
    write_missing(gathered.missing)


def _write_process_page(output: str, gathered: Report) -> None:
    """The page of a process or a record, then what a partial one left out on stderr."""
    from .pictures.report import report_page  # as job_report_page, above

    written = write_output(output, [report_page(gathered)])
    threads = counted(gathered.thread_count or len(gathered.threads), "thread")
    sections = f"{threads}, {counted(len(gathered.steps), 'step')}"
    took = gathered.timings.get("total_s", 0.0)
    wrote(output, written, f"{sections}, gathered in {took:.1f} s", "open it in a browser")
    if gathered.failures:
        notes(
            [
                ("the process exited during the report; " if gathered.gone else "")
                + "the page is partial: "
                + "; ".join(gathered.failures)
            ]
        )
