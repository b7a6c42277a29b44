"""`probing PID memory`: where the process's memory is, what grew, a CUDA snapshot."""

from __future__ import annotations

from typing import Optional

import click

from ..engine.kinds import Ranks
from ..engine.kinds.record import FromRecord
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.memory import write_memory_answer
from .render.per_rank import write_job_memory
from .render.record import write_record_memory
from .spec import RANKS, TEXT_OR_JSON, scan_budget, timeout


@click.command(name="memory")
@click.option(
    "--growth", type=click.FloatRange(min=0.01, max=86400), metavar="S",
    help="Watch S seconds: the allocation sites (tracemalloc, on for the window only) and object types "
    "that grew, and CUDA allocator deltas.",
)  # fmt: skip
@click.option(
    "--cuda-snapshot", type=click.Path(dir_okay=False, writable=True), metavar="FILE",
    help="Save torch.cuda.memory._snapshot() to FILE, for https://pytorch.org/memory_viz.",
)  # fmt: skip
@click.option(
    "--interval", type=click.FloatRange(min=0, max=86400), metavar="S",
    help="Sample process.memory every S seconds from now on (0: stop sampling).",
)  # fmt: skip
@click.option("--top", type=click.IntRange(min=1), default=15, show_default=True, help="Rows per list.")
@apply(
    scan_budget(
        "Seconds each walk over the live objects may take; a generation of gc's objects is listed only "
        "if that holds the job's GIL at most S/100 at once (10 ms at least), else said and left out."
    ),
    TEXT_OR_JSON, timeout(10.0), RANKS,
)  # fmt: skip
@pass_invocation
def memory_command(
    invocation: Invocation, growth: Optional[float], cuda_snapshot: Optional[str], interval: Optional[float],
    top: int, scan_budget: float, format: str, timeout: float, ranks: Optional[str],
) -> int:  # fmt: skip
    """Where the process's memory is: RSS/USS, Python objects by type, torch's CPU and CUDA memory,
    growth since the agent started.

    \b
      probing PID memory                     the summary
      probing PID memory --growth 30         what grew in the next 30 s, and where it was allocated
      probing PID memory --cuda-snapshot F   CUDA allocator snapshot for PyTorch's memory viewer
    """
    chosen = [name for name, value in (("--growth", growth), ("--cuda-snapshot", cuda_snapshot),
                                       ("--interval", interval)) if value is not None]  # fmt: skip
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)} do not go together")
    if interval is not None and 0 < interval < 0.1:
        raise click.UsageError("--interval is 0 (stop sampling) or at least 0.1 s")
    if format == "json" and cuda_snapshot is not None:
        raise click.UsageError("--cuda-snapshot writes a file; --format json does not apply")
    if ranks is not None and cuda_snapshot is not None:
        raise click.UsageError(
            "--cuda-snapshot writes one rank's snapshot: give that rank's PID, not --ranks"
        )
    answer = invocation.kind(ranks).memory(
        growth, cuda_snapshot is not None, interval, top, timeout, scan_budget, chosen
    )
    if isinstance(answer, Ranks):
        write_job_memory(answer.job, answer.gathered, format)
    elif isinstance(answer.value, FromRecord):
        write_record_memory(answer.value.value, format)
    else:
        write_memory_answer(answer.value, format, cuda_snapshot)
    return answer.exit_code
