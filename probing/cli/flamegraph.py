"""`probing PID flamegraph -o FILE`: where the process spends its time (sampled stacks of every
thread), or with --torch where a training step's time goes by module; as a page, SVG,
speedscope JSON or folded text."""

from __future__ import annotations

from typing import Iterable, Iterator, Optional

import click

from ..engine.flames.sampled import Flame
from ..engine.kinds import Ranks
from .invocation import Invocation
from .options import apply, pass_invocation
from .pictures.flame import folded_lines, speedscope_text, total_weight
from .pictures.flame_html import html_parts
from .pictures.flame_svg import svg_parts
from .render import inert_parts
from .render import notes as say_notes
from .render.files import check_output, counted, write_output, wrote
from .render.per_rank import write_missing
from .spec import RANKS, timeout

FORMATS = ("html", "svg", "speedscope", "folded")
HINTS = {
    "html": "open it in a browser (no network needed)",
    "svg": "open it in a browser",
    "speedscope": "open it in https://www.speedscope.app",
    "folded": "flamegraph.pl, inferno-flamegraph or speedscope read it",
}


def format_of(path: str, chosen: Optional[str]) -> str:
    """The format `--format` names, else the one the file's extension says."""
    if chosen is not None:
        return chosen
    lower = path.lower()
    for endings, kind in (((".html", ".htm"), "html"), ((".svg",), "svg"), ((".json",), "speedscope"),
                          ((".folded", ".txt", ".collapsed"), "folded")):  # fmt: skip
        if lower.endswith(endings):
            return kind
    raise click.UsageError(
        f"cannot tell the format from {path!r}: name it .html, .svg, .speedscope.json or .folded, "
        "or give --format html|svg|speedscope|folded"
    )


def _counted(value: object, noun: str) -> str:
    return counted(value, noun) if isinstance(value, int) else f"{value} {noun}s"


def figures_line(flame: Flame) -> str:
    figures = flame.figures
    if figures.get("ranks"):
        return _ranks_line(flame)
    if flame.unit == "seconds":
        return (
            f"{_counted(figures.get('modules'), 'module')}, mean of {_counted(figures.get('steps'), 'step')} "
            f"({figures.get('range')}); {total_weight(flame.stacks) * 1000:.3f} ms traced per step"
        )
    if figures.get("source") != "agent":
        return (
            f"{_counted(figures.get('samples'), 'thread sample')} in {figures.get('duration_s')} s "
            f"at {figures.get('rate_hz')} Hz from outside (py-spy)"
        )
    said = (
        f"{_counted(figures.get('samples'), 'sample')} in {figures.get('duration_s')} s "
        f"({figures.get('rate_hz')} Hz) from the agent"
    )
    if figures.get("cost_share") is not None:
        said += f"; sampling held the GIL {100 * float(figures['cost_share']):.3f}% of the time"
    return said


def _ranks_line(flame: Flame) -> str:
    """What `--ranks` drew: modules per rank, or how each rank was sampled."""
    figures = flame.figures
    ranks = counted(figures["ranks"], "rank")
    if not figures.get("sampled"):
        traced = total_weight(flame.stacks) * 1000 / figures["ranks"]
        return (
            f"{ranks}, {_counted(figures.get('modules'), 'module')} at most, mean of "
            f"{_counted(figures.get('steps'), 'step')} ({figures.get('range')}); "
            f"{traced:.3f} ms traced per step and rank"
        )
    outside = figures.get("outside") or []
    if not outside:
        source = "by their agents"
    elif len(outside) == figures["ranks"]:
        source = "from outside (py-spy)"
    else:
        named = ",".join(str(rank) for rank in outside)
        source = f"by their agents, {'rank' if len(outside) == 1 else 'ranks'} {named} from outside (py-spy)"
    said = f"{ranks} sampled for {figures.get('duration_s')} s at {figures.get('rate_hz')} Hz {source}"
    if figures.get("cost_share") is not None:
        said += f"; sampling held a rank's GIL {100 * float(figures['cost_share']):.3f}% of the time at most"
    return said


def for_output(parts: Iterable[str], output: str) -> Iterator[str]:
    """The picture's text as it may be written: a lone surrogate (a name of bytes that are not
    UTF-8) becomes `\\udcxx` rather than failing the write; to standard output on a terminal,
    every control character a job-chosen name holds is made visible (render.inert_parts). A
    file keeps the exact names."""
    safe = (
        part if part.isascii() else part.encode("utf-8", "backslashreplace").decode("utf-8") for part in parts
    )
    return inert_parts(safe) if output == "-" else safe


def parts_of(flame: Flame, kind: str) -> Iterator[str]:
    if kind == "folded":
        return folded_lines(flame.stacks)
    if kind == "speedscope":
        return iter([speedscope_text(flame.stacks, flame.title, flame.unit)])
    if kind == "svg":
        return svg_parts(flame.stacks, flame.title, flame.unit, flame.notes)
    return html_parts(flame.stacks, flame.title, flame.unit, flame.notes, figures_line(flame))


@click.command(name="flamegraph")
@click.option(
    "--duration", type=click.FloatRange(min=0.1, max=600), metavar="S",
    help="Seconds to sample (default 10).",
)  # fmt: skip
@click.option(
    "--rate", type=click.FloatRange(min=1, max=1000), default=100.0, show_default=True, metavar="HZ",
    help="Samples per second at most; fewer when sampling would cost the job more than 0.5 %.",
)  # fmt: skip
@click.option(
    "--outside", is_flag=True,
    help="Sample from outside with py-spy instead of the agent: no GIL needed, so a thread running "
    "pure Python is seen wherever it is, not where it lets go of the GIL.",
)  # fmt: skip
@click.option("--torch", "torch_modules", is_flag=True, help="The module hierarchy from python.torch_trace.")
@click.option("--steps", metavar="A:B", help="With --torch: only steps A to B (either end may be left out).")
@click.option(
    "-o", "--output", required=True, metavar="FILE", help="The file to write (`-`: standard output)."
)
@click.option(
    "--format", "kind", type=click.Choice(FORMATS), help="The format (default: from FILE's extension)."
)
@apply(timeout(10.0, "Seconds to wait for the agent, beyond the sampling."), RANKS)
@pass_invocation
def flamegraph(
    invocation: Invocation, duration: Optional[float], rate: float, outside: bool, torch_modules: bool,
    steps: Optional[str], output: str, kind: Optional[str], timeout: float, ranks: Optional[str],
) -> int:  # fmt: skip
    """A flame graph: sampled stacks of every thread, or (--torch) step time by module.

    \b
      probing PID flamegraph -o cpu.html                 10 s of samples, an interactive page
      probing PID flamegraph --duration 30 -o cpu.svg    also .speedscope.json and .folded
      probing PID flamegraph --torch -o modules.html     mean time per step by module (trace on first)
      probing FILE flamegraph --torch -o modules.html    the same from a record
      probing PID flamegraph --ranks all -o job.html     every rank sampled at once, side by side

    Samples are taken by the agent at up to --rate per second (fewer when a sample would cost
    the job more than 0.5 % of its time); when the agent cannot answer (a thread holds the GIL),
    py-spy samples from outside and the picture says so. With --ranks, every rank over the same
    window (or its module times), each under a root frame `rank N`.
    """
    chosen = format_of(output, kind)
    if steps is not None and not torch_modules:
        raise click.UsageError("--steps goes with --torch")
    if torch_modules and (duration is not None or outside):
        raise click.UsageError("--duration and --outside sample stacks; --torch draws what tracing measured")
    check_output(output)  # a path that cannot be written fails before the job is sampled
    target = invocation.kind(ranks)
    if torch_modules:
        answer = target.module_flame(steps, timeout)
    else:
        answer = target.sampled_flame(duration or 10.0, rate, timeout, outside)
    picture = answer.value
    say_notes(picture.notes)
    if not picture.stacks:
        say_notes(["no stacks were sampled: the picture is empty"])
    size = write_output(output, for_output(parts_of(picture, chosen), output))
    wrote(output, size, figures_line(picture), HINTS[chosen])
    if isinstance(answer, Ranks) and answer.gathered is not None:
        write_missing(answer.gathered.missing)
    return answer.exit_code
