"""The click command line: `probing [OPTIONS] TARGET COMMAND`, the global options, --help with
the exit codes, and every command's module registered. Each command lives in its own module
(cli/eval.py, cli/query.py, ...): parse, ask the engine, render."""

from __future__ import annotations

import importlib
from typing import Any, List, Optional

import click

from .. import __version__
from ..engine.kinds import names_a_file_kind
from ..engine.target import parse_address
from ..errors import ExitCode, ProbingError, UsageError
from .backtrace import backtrace as show_backtrace
from .invocation import Invocation
from .options import apply, pass_invocation
from .render import report_error, stdout_is_closed
from .spec import BACKTRACE_OPTIONS, ENDPOINTS, GLOBAL_OPTIONS, TARGET, names_target
from .spellings import Commands, foreign_spelling

# Every command but `backtrace` (below): its name -> "module:command", the module under
# probing/cli and the click command in it. A module is imported when its command runs, or when
# --help lists them all: `probing PID eval` loads eval's module and what it needs, no other.
COMMANDS = {
    "core": "core:core_command",
    "detach": "detach:detach_command",
    "eval": "eval:eval_command",
    "export": "export:export",
    "flamegraph": "flamegraph:flamegraph",
    "hang": "hang:hang",
    "inject": "inject:inject_command",
    "list": "list_processes:list_command",
    "listen": "listen:listen_command",
    "mcp": "mcp:mcp_command",
    "memory": "memory:memory_command",
    "nan": "switch:nan",
    "query": "query:query",
    "ranks": "ranks:ranks",
    "record": "record:record",
    "records": "records:records",
    "repl": "repl:repl",
    "report": "report:report",
    "run": "run:run",
    "stragglers": "stragglers:stragglers",
    "tables": "tables:tables",
    "top": "top:top",
    "trace": "switch:trace",
}
# Global options followed by their value: that word is no TARGET.
VALUED_OPTIONS = tuple(option.name for option in (*GLOBAL_OPTIONS, ENDPOINTS) if not option.flag)
# Commands that do not act on a target process.
TARGETLESS = ("list", "run", "core", "records", "mcp")
# Where parse_args keeps the command line as given, for a refusal to be read as a habit.
_GIVEN_ARGS = "probing.given_args"


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
        ctx.meta[_GIVEN_ARGS] = list(args)
        rewritten: List[str] = []
        index = 0
        while index < len(args):
            arg = args[index]
            if arg == "--" or arg in self.commands or arg in COMMANDS:
                break
            if names_target(arg):
                # Given as an option: a positional word after it is a (mistyped) command.
                return super().parse_args(ctx, args)
            if arg in VALUED_OPTIONS and index + 1 < len(args):
                rewritten += [arg, args[index + 1]]
                index += 2
                continue
            if not arg.startswith("-"):
                rewritten += [TARGET.name, arg]
                index += 1
                break
            rewritten.append(arg)
            index += 1
        return super().parse_args(ctx, rewritten + args[index:])

    def list_commands(self, ctx: click.Context) -> List[str]:
        return sorted({*self.commands, *COMMANDS})

    def get_command(self, ctx: click.Context, name: str) -> Optional[click.Command]:
        if name not in self.commands and name in COMMANDS:
            module, attribute = COMMANDS[name].split(":")
            self.add_command(getattr(importlib.import_module(f"{__package__}.{module}"), attribute), name)
        return self.commands.get(name)

    def collect_usage_pieces(self, ctx: click.Context) -> List[str]:
        return ["[OPTIONS]", "TARGET", "COMMAND", "[ARGS]..."]

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ProbingError as error:
            if isinstance(error, UsageError):  # `probing core CORE EXECUTABLE`, as pystack's
                error = foreign_spelling(ctx.meta.get(_GIVEN_ARGS, []), known_commands()) or error
            ctx.exit(report_error(error))
        except BrokenPipeError:  # `probing PID query ... | head`: the reader has all it wants
            stdout_is_closed()
            ctx.exit(ExitCode.OK)


@click.group(
    cls=ProbingGroup,
    epilog=_exit_code_table(),
    context_settings={"help_option_names": ["-h", "--help"]},
)
@apply(TARGET, *GLOBAL_OPTIONS, ENDPOINTS)
@click.version_option(__version__, prog_name="probing")
@click.pass_context
def cli(
    ctx: click.Context,
    target: Optional[str],
    verbose: bool,
    no_attach: bool,
    attach_timeout: float,
    endpoints: Optional[str],
) -> None:
    """Debug a live Python process: its stacks, its state, SQL over what it records.

    \b
      probing PID backtrace        where every thread is, right now
      probing PID eval "CODE"      run Python inside the process
      probing PID repl             an interactive console inside the process
      probing PID query "SQL"      DuckDB SQL over python.backtrace, python.threads, ...
      probing PID memory           RSS/USS, Python objects by type, torch memory, growth
      probing PID ranks            every rank of the torchrun job PID belongs to, at a glance
      probing PID report -o F.html one page of the job (stacks, verdict, step time, memory charts)
      probing PID flamegraph -o F.html   sampled stacks as a flame graph (--torch: by module)
      probing PID trace export -o F.json the traced steps as a timeline for ui.perfetto.dev
      probing PID hang --ranks all which rank of the job is stuck, and where (--ranks: most commands)
      probing PID stragglers       which rank the job waits for, in which phase, by how much
      probing PID top              a live view: each thread (--ranks: each rank), refreshed until q
      probing tcp://HOST:PORT ...  an agent on another node, over TCP (PROBING_LISTEN, PROBING_TOKEN)
      probing list                 Python processes by job, and which have an agent
      probing records              the records jobs left on this machine when they ended
      probing FILE backtrace       a record is a target: backtrace, query, tables, memory, hang, export
      probing run -- CMD ...       start CMD with the agent in it
      probing CORE backtrace       a core file is a target too: backtrace, query, tables
      probing mcp                  these tools served to a coding assistant (Model Context Protocol)

    A process without an agent is attached to first (unless --no-attach): one of its
    threads is borrowed for about a millisecond to load the agent; see `probing PID inject`.
    """
    ctx.obj = Invocation(target, verbose, no_attach, attach_timeout, endpoints)
    if ctx.invoked_subcommand not in TARGETLESS and target is None and endpoints is None:
        raise click.UsageError("missing TARGET: probing PID COMMAND (or probing -t PID COMMAND)")
    if ctx.invoked_subcommand in TARGETLESS and (target is not None or endpoints is not None):
        raise click.UsageError(f"'{ctx.invoked_subcommand}' takes no TARGET")
    if target is not None and endpoints is not None:
        raise click.UsageError("give either a TARGET or --endpoints, not both")
    if target is not None and not names_a_file_kind(target):
        parse_address(target)  # a malformed TARGET is a usage error before any work


@cli.command()
@apply(*BACKTRACE_OPTIONS)
@pass_invocation
def backtrace(
    invocation: Invocation,
    locals: bool,
    thread: Optional[str],
    format: str,
    native: bool,
    children: bool,
    attach_children: bool,
    timeout: float,
    ranks: Optional[str],
) -> int:
    """Stack of every Python thread, main thread first, read like a traceback.

    When the agent cannot answer in time (a thread holds the GIL, the process cannot be
    attached), the stacks are read from outside with py-spy, and probing says why. With
    --ranks, every rank of the job; a stack the same on several ranks is shown once.
    """
    return show_backtrace(
        invocation, locals=locals, thread=thread, format=format, timeout=timeout, native=native,
        children=children, attach_children=attach_children, ranks=ranks,
    )  # fmt: skip


def _values_not_options(args: List[str]) -> List[str]:
    """Words that begin with `--` and then a blank name no option: they are values the shell
    passed whole, such as SQL that opens with a comment (`query "-- Find slowest operations
    SELECT ..."`, as the debugging guide writes it) or `eval "-- 1"`. click would refuse each as
    an unknown option; a leading newline keeps the value's meaning and makes it an argument."""
    return [f"\n{arg}" if arg[:2] == "--" and arg[2:3].isspace() else arg for arg in args]


def known_commands() -> Commands:
    """probing's commands that act on a TARGET, each with its options that take a value."""
    on_target = {}
    context = click.Context(cli)
    for name in cli.list_commands(context):
        command = cli.get_command(context, name)
        if command is not None and name not in TARGETLESS:
            valued = [
                option.opts + option.secondary_opts
                for option in command.params
                if isinstance(option, click.Option) and not option.is_flag and not option.count
            ]
            on_target[name] = frozenset(flag for flags in valued for flag in flags)
    return Commands(on_target)


def run_click(args: List[str]) -> int:
    try:
        result = cli.main(args=_values_not_options(args), prog_name="probing", standalone_mode=False)
    except click.exceptions.Exit as exit_:
        return int(exit_.exit_code)
    except click.UsageError as error:
        # Refused: said in probing's words when another tool's habit explains it (spellings.py).
        mistaken = foreign_spelling(args, known_commands())
        if mistaken is not None:
            return report_error(mistaken)
        error.show()
        return int(error.exit_code)
    except click.ClickException as error:
        error.show()
        return int(error.exit_code)
    except click.exceptions.Abort:
        return 130
    return int(result) if isinstance(result, int) else ExitCode.OK
