"""The click command line. Thin: each command parses, then calls its function in actions.py."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import click

from .. import __version__
from ..errors import ExitCode, ProbingError
from . import actions, render
from .spec import BACKTRACE_OPTIONS, GLOBAL_OPTIONS, ROW_FORMATS, TARGET_OPTIONS, Option

# Commands that do not act on a target process.
TARGETLESS = ("list", "run")


def _exit_code_table() -> str:
    lines = ["\b", "Exit codes:"]
    for code, meaning in ExitCode.MEANINGS.items():
        lines.append(f"  {code:>3}  {meaning}")
    lines.append("  probing run exits with its command's status (128+N if signal N killed it).")
    return "\n".join(lines)


class ProbingGroup(click.Group):
    """`probing [OPTIONS] TARGET COMMAND`: a positional TARGET before the command.

    click has no notion of an argument in front of a subcommand, so the first positional word
    that is not a command is rewritten as `--target WORD`.
    """

    def parse_args(self, ctx: click.Context, args: List[str]) -> List[str]:
        rewritten: List[str] = []
        index = 0
        while index < len(args):
            arg = args[index]
            if arg == "--" or arg in self.commands:
                break
            if arg in TARGET_OPTIONS or arg.startswith("--target="):
                # Given as an option: a positional word after it is a (mistyped) command.
                return super().parse_args(ctx, args)
            if not arg.startswith("-"):
                rewritten += ["--target", arg]
                index += 1
                break
            rewritten.append(arg)
            index += 1
        return super().parse_args(ctx, rewritten + args[index:])

    def collect_usage_pieces(self, ctx: click.Context) -> List[str]:
        return ["[OPTIONS]", "TARGET", "COMMAND", "[ARGS]..."]

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ProbingError as error:
            ctx.exit(render.report_error(error))
        except BrokenPipeError:  # `probing PID query ... | head`: the reader has all it wants
            render.stdout_is_closed()
            ctx.exit(ExitCode.OK)


def _apply(options: Sequence[Option]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turn spec.Option declarations into click options (shared with the fast path)."""

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            names = [option.short, option.name] if option.short else [option.name]
            if option.flag:
                decorator = click.option(*names, is_flag=True, default=option.default, help=option.help)
            elif option.choices is not None:
                decorator = click.option(
                    *names, type=click.Choice(option.choices), default=option.default,
                    show_default=True, help=option.help,
                )  # fmt: skip
            else:
                value_type: Any = (
                    click.FloatRange(min=0, min_open=True) if option.value_type is float else str
                )
                decorator = click.option(
                    *names, type=value_type, default=option.default, metavar=option.metavar,
                    show_default=option.default is not None, help=option.help,
                )  # fmt: skip
            function = decorator(function)
        return function

    return decorate


def _context(ctx: click.Context) -> actions.Context:
    obj: actions.Context = ctx.find_object(actions.Context)  # type: ignore[assignment]
    return obj


@click.group(
    cls=ProbingGroup,
    epilog=_exit_code_table(),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.option("-t", "--target", metavar="TARGET", help="PID of the process, or the path of its agent socket.")
@_apply(GLOBAL_OPTIONS)
@click.version_option(__version__, prog_name="probing")
@click.pass_context
def cli(
    ctx: click.Context, target: Optional[str], verbose: bool, no_attach: bool, attach_timeout: float
) -> None:
    """Debug a live Python process: its stacks, its state, SQL over what it records.

    \b
      probing PID backtrace        where every thread is, right now
      probing PID eval "CODE"      run Python inside the process
      probing PID repl             an interactive console inside the process
      probing PID query "SQL"      DuckDB SQL over python.backtrace, python.threads, ...
      probing PID memory           RSS/USS, Python objects by type, torch memory, growth
      probing list                 Python processes, and which have an agent
      probing run -- CMD ...       start CMD with the agent in it

    A process without an agent is attached to first (unless --no-attach): one of its
    threads is borrowed for about a millisecond to load the agent; see `probing PID inject`.
    """
    ctx.obj = actions.Context(target, verbose, no_attach, attach_timeout)
    if ctx.invoked_subcommand not in TARGETLESS and target is None:
        raise click.UsageError("missing TARGET: probing PID COMMAND (or probing -t PID COMMAND)")
    if ctx.invoked_subcommand in TARGETLESS and target is not None:
        raise click.UsageError(f"'{ctx.invoked_subcommand}' takes no TARGET")
    if target is not None:
        actions.parse_target(target)  # a malformed TARGET is a usage error before any work


@cli.command()
@_apply(BACKTRACE_OPTIONS)
@click.pass_context
def backtrace(
    ctx: click.Context,
    locals: bool,
    thread: Optional[str],
    format: str,
    native: bool,
    children: bool,
    attach_children: bool,
    timeout: float,
) -> int:
    """Stack of every Python thread, main thread first, read like a traceback.

    When the agent cannot answer in time (a thread holds the GIL, the process cannot be
    attached), the stacks are read from outside with py-spy, and probing says why.
    """
    return actions.backtrace(
        _context(ctx), locals=locals, thread=thread, format=format, timeout=timeout, native=native,
        children=children, attach_children=attach_children,
    )  # fmt: skip


@cli.command()
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=10.0,
    show_default=True,
    metavar="S",
    help="Seconds to watch.",
)
@click.option(
    "--samples", type=click.IntRange(min=2), default=10, show_default=True, help="Stack samples to take."
)
@click.option("--format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=3.0,
    metavar="S",
    help="Seconds to wait for each sample from the agent before reading from outside.",
)
@click.pass_context
def hang(ctx: click.Context, duration: float, samples: int, format: str, timeout: float) -> int:
    """Watch every thread for a while: what moved, what did not, what each is doing.

    Exits 11 when the main thread neither moved nor used the CPU (a DataLoader wait leads to
    the worker that holds the batch), 0 when it progressed.
    """
    return actions.hang(_context(ctx), duration, samples, format, timeout)


@cli.command(name="eval")
@click.argument("code")
@click.option(
    "--frame", metavar="THREAD:FUNCTION",
    help="Run with that frame's locals over its globals (e.g. MainThread:train).",
)  # fmt: skip
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
    metavar="S", help="Seconds the code may run; then it is interrupted.",
)  # fmt: skip
@click.option(
    "--force", is_flag=True,
    help="Let the code end the process (os._exit, os.abort, os.kill of itself, exec), refused otherwise.",
)  # fmt: skip
@click.pass_context
def eval_command(ctx: click.Context, code: str, frame: Optional[str], timeout: float, force: bool) -> int:
    """Run CODE in the process's __main__ namespace ('-' reads it from stdin).

    What the code prints comes back; a final expression's value is shown as the REPL would.
    """
    return actions.evaluate(_context(ctx), code, frame, timeout, force)


@cli.command()
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
    metavar="S", help="Seconds to wait for the agent to connect (statements may run as long as they like).",
)  # fmt: skip
@click.pass_context
def repl(ctx: click.Context, timeout: float) -> int:
    """Interactive Python console inside the process, as `python -i` would give.

    Names of the job's __main__ are visible (read live); names you assign stay in the session
    and never change the job's. Ctrl-C interrupts the running statement, Ctrl-D leaves; line
    editing and history (~/.probing_history, or $PROBING_HISTORY) when stdin is a terminal.
    Lines piped in run as a script would: exit 8 if any statement raised.
    """
    from .repl import run_repl

    return run_repl(_context(ctx), timeout)


@cli.command()
@click.argument("sql")
@click.option("--format", type=click.Choice(ROW_FORMATS), default="table", show_default=True)
@click.option(
    "--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
    metavar="S", help="Seconds to wait for each table.",
)  # fmt: skip
@click.option(
    "--scan-budget",
    type=click.FloatRange(min=0, min_open=True),
    default=1.0,
    show_default=True,
    metavar="S",
    help="Seconds the agent may spend walking live objects for python.tensors and python.gc.",
)
@click.option(
    "--step-wait", type=click.FloatRange(min=0, max=600), default=1.0, show_default=True, metavar="S",
    help="Seconds python.modules, python.tensors and python.optimizers wait for the job's next "
    "optimizer step, where gradients and tensor values are read.",
)  # fmt: skip
@click.pass_context
def query(
    ctx: click.Context, sql: str, format: str, timeout: float, scan_budget: float, step_wait: float
) -> int:
    """Run DuckDB SQL over the process's tables ('-' reads it from stdin)."""
    return actions.query(_context(ctx), sql, format, timeout, scan_budget, step_wait)


_SWITCH = click.Choice(("on", "off", "status"))


@cli.command()
@click.argument("action", type=_SWITCH, default="status")
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
@click.option("--format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, metavar="S")
@click.pass_context
def trace(
    ctx: click.Context, action: str, every: Optional[int], backward: bool, patterns: Sequence[str],
    depth: Optional[int], capacity: Optional[int], format: str, timeout: float,
) -> int:  # fmt: skip
    """Time the job's modules and optimizer steps into python.torch_trace: on, off or status.

    \b
      probing PID trace on                        hook the live job's models and optimizers
      probing PID trace on --every 10 --backward  every 10th step, backward timed too
      probing PID trace status
      probing PID trace off                       every hook removed
    """
    options = (("--every", every), ("--backward", backward or None), ("--modules", patterns or None),
               ("--depth", depth), ("--capacity", capacity))  # fmt: skip
    given = [name for name, value in options if value is not None]
    if given and action != "on":
        raise click.UsageError(f"{', '.join(given)} only go with 'trace on'")
    params = {"action": action, "every": every, "backward": backward, "modules": list(patterns) or None,
              "depth": depth, "capacity": capacity}  # fmt: skip
    return actions.switch(_context(ctx), "trace", params, format, timeout)


@cli.command()
@click.argument("action", type=_SWITCH, default="status")
@click.option(
    "--stop", is_flag=True,
    help="Raise NonFiniteError in the training thread at the first NaN/Inf, so the job's own error "
    "handling and checkpointing run.",
)  # fmt: skip
@click.option("--format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, metavar="S")
@click.pass_context
def nan(ctx: click.Context, action: str, stop: bool, format: str, timeout: float) -> int:
    """Check module outputs and gradients for NaN/Inf into python.nan_events: on, off or status.

    Each step, the first module whose output (or input gradient) holds NaN or Inf is recorded.
    """
    if stop and action != "on":
        raise click.UsageError("--stop only goes with 'nan on'")
    return actions.switch(_context(ctx), "nan", {"action": action, "stop": stop}, format, timeout)


@cli.command()
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
@click.option(
    "--scan-budget", type=click.FloatRange(min=0, min_open=True), default=1.0, show_default=True,
    metavar="S", help="Seconds each walk over the live objects may take.",
)  # fmt: skip
@click.option("--format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, metavar="S")
@click.pass_context
def memory(
    ctx: click.Context, growth: Optional[float], cuda_snapshot: Optional[str], interval: Optional[float],
    top: int, scan_budget: float, format: str, timeout: float,
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
    return actions.memory(_context(ctx), growth, cuda_snapshot, interval, top, format, timeout, scan_budget)


@cli.command()
@click.option("--format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=10.0, metavar="S")
@click.pass_context
def tables(ctx: click.Context, format: str, timeout: float) -> int:
    """Every table with its columns, types and what each column means."""
    return actions.tables(_context(ctx), format, timeout)


@cli.command()
@click.option(
    "--method", type=click.Choice(("auto", "ptrace", "gdb", "pyrasite")), default="auto", show_default=True,
    help="auto = ptrace; gdb stops every thread; pyrasite is unsafe (see docs/attach.md).",
)  # fmt: skip
@click.option("--format", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.pass_context
def inject(ctx: click.Context, method: str, format: str) -> int:
    """Put the agent into the process now; say how, and how long any thread was stopped."""
    return actions.inject(_context(ctx), method, format)


@cli.command()
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=5.0, metavar="S")
@click.pass_context
def detach(ctx: click.Context, timeout: float) -> int:
    """Stop the agent: its threads, hooks and socket go; the job runs on."""
    return actions.detach(_context(ctx), timeout)


@cli.command(name="list")
@click.option("--format", type=click.Choice(ROW_FORMATS), default="table", show_default=True)
def list_command(format: str) -> int:
    """Python processes you can see, and whether each has an agent."""
    return actions.list_processes(format)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--hang-timeout", type=click.FloatRange(min=0, min_open=True), metavar="S",
    help="CI watchdog: if the main thread's stack has not changed for S seconds, print every "
    "stack of the process tree, end the tree and exit 11.",
)  # fmt: skip
@click.option(
    "--report", type=click.Path(dir_okay=False), metavar="FILE", help="With --hang-timeout: a JSON report."
)
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def run(ctx: click.Context, hang_timeout: Optional[float], report: Optional[str], command: List[str]) -> int:
    """Run COMMAND with the agent in every Python process it starts.

    Prints the child's PID on stderr, forwards signals, exits with the child's status.
    """
    if report is not None and hang_timeout is None:
        raise click.UsageError("--report goes with --hang-timeout")
    return actions.run(list(command), _context(ctx).verbose, hang_timeout, report)


def run_click(args: List[str]) -> int:
    try:
        result = cli.main(args=args, prog_name="probing", standalone_mode=False)
    except click.exceptions.Exit as exit_:
        return int(exit_.exit_code)
    except click.ClickException as error:
        error.show()
        return int(error.exit_code)
    except click.exceptions.Abort:
        return 130
    return int(result) if isinstance(result, int) else ExitCode.OK
