"""`probing PID trace` and `probing PID nan`: turn a torch feature of the agent on or off, or
report on it."""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

import click

from ..engine.kinds import Ranks
from ..engine.requests import switch
from ..engine.timeline import StepRange
from .invocation import Invocation
from .options import apply, pass_invocation
from .render.per_rank import write_job_switches
from .render.reports import write_switch
from .spec import RANKS, TEXT_OR_JSON, timeout
from .trace_export import export_trace, steps_option

ACTION = click.Choice(("on", "off", "status"))
TRACE_ACTION = click.Choice(("on", "off", "status", "export"))


def _switch(
    invocation: Invocation,
    feature: str,
    params: Dict[str, Any],
    format: str,
    timeout: float,
    ranks: Optional[str],
) -> int:
    answer = invocation.kind(ranks).each(
        lambda target: switch(target, feature, params, timeout), timeout + 1.0
    )
    if isinstance(answer, Ranks):
        write_job_switches(answer.job, feature, params["action"], answer.gathered, format)
    else:
        write_switch(feature, params["action"], answer.value, format)
    return answer.exit_code


@click.command()
@click.argument("action", type=TRACE_ACTION, default="status")
@click.option(
    "--every", type=click.IntRange(min=1), metavar="N",
    help="Trace one step in N. Default: chosen after each traced step so that tracing costs under 1% "
    "of the step time.",
)  # fmt: skip
@click.option("--backward", is_flag=True, help="Time each module's backward pass too.")
@click.option(
    "--modules", "patterns", multiple=True, metavar="GLOB",
    help="Only modules whose qualified name matches, e.g. 'model.layers.*' (repeatable).",
)  # fmt: skip
@click.option(
    "--depth", type=click.IntRange(min=0), metavar="D",
    help="Only modules at most D levels below a top-level module (0: the models themselves).",
)  # fmt: skip
@click.option(
    "--capacity", type=click.IntRange(min=1000), metavar="ROWS",
    help="Rows python.torch_trace keeps, newest first out last.  [default: 1000000]",
)  # fmt: skip
@click.option(
    "-o", "--output", metavar="FILE",
    help="export: the Chrome trace event JSON file to write (replaced if it exists); - for stdout.",
)  # fmt: skip
@click.option(
    "--steps", callback=steps_option, metavar="A:B",
    help="export: only steps A to B, both included (A:, :B, or one step N). Default: every step traced.",
)  # fmt: skip
@apply(TEXT_OR_JSON, timeout(10.0), RANKS)
@pass_invocation
def trace(
    invocation: Invocation, action: str, every: Optional[int], backward: bool, patterns: Sequence[str],
    depth: Optional[int], capacity: Optional[int], output: Optional[str], steps: Optional[StepRange],
    format: str, timeout: float, ranks: Optional[str],
) -> int:  # fmt: skip
    """Time the job's modules and optimizer steps into python.torch_trace: on, off or status;
    export writes the traced steps as a timeline.

    \b
      probing PID trace on                        hook the live job's models and optimizers
      probing PID trace on --every 10 --backward  every 10th step, backward timed too
      probing PID trace status
      probing PID trace off                       every hook removed
      probing PID trace export -o step.json       open it in ui.perfetto.dev or chrome://tracing
      probing PID trace export --ranks all --steps 100:110 -o job.json
      probing FILE trace export -o step.json      from a record
    """
    options = (("--every", every), ("--backward", backward or None), ("--modules", patterns or None),
               ("--depth", depth), ("--capacity", capacity))  # fmt: skip
    given = [name for name, value in options if value is not None]
    if given and action != "on":
        raise click.UsageError(f"{', '.join(given)} only go with 'trace on'")
    exported = [name for name, value in (("--output", output), ("--steps", steps)) if value is not None]
    if exported and action != "export":
        raise click.UsageError(f"{', '.join(exported)} only go with 'trace export'")
    if action == "export":
        source = click.get_current_context().get_parameter_source("format")
        if source is not None and source.name not in ("DEFAULT", "DEFAULT_MAP"):
            raise click.UsageError("--format does not go with 'trace export' (it writes Chrome trace JSON)")
        if output is None:
            raise click.UsageError("'trace export' needs -o/--output FILE (- for stdout)")
        return export_trace(invocation, output, steps, timeout, ranks)
    params = {"action": action, "every": every, "backward": backward, "modules": list(patterns) or None,
              "depth": depth, "capacity": capacity}  # fmt: skip
    return _switch(invocation, "trace", params, format, timeout, ranks)


@click.command()
@click.argument("action", type=ACTION, default="status")
@click.option(
    "--stop", is_flag=True,
    help="Raise NonFiniteError in the training thread at the first NaN/Inf, so the job's own error "
    "handling and checkpointing run.",
)  # fmt: skip
@apply(TEXT_OR_JSON, timeout(10.0), RANKS)
@pass_invocation
def nan(
    invocation: Invocation, action: str, stop: bool, format: str, timeout: float, ranks: Optional[str]
) -> int:
    """Check module outputs and gradients for NaN/Inf into python.nan_events: on, off or status.

    Each step, the first module whose output (or input gradient) holds NaN or Inf is recorded,
    with whether its inputs and its own weights were finite. Every weight is checked once when
    the checks begin, so weights already NaN/Inf then are named (the cause is earlier).
    PROBING_NAN=1 in the job's environment (with PROBING=1) checks from its first step.
    """
    if stop and action != "on":
        raise click.UsageError("--stop only goes with 'nan on'")
    return _switch(invocation, "nan", {"action": action, "stop": stop}, format, timeout, ranks)
