"""Options shared by several commands, and those of the fast path, declared once.

`probing PID backtrace` is timed against py-spy, and importing click alone costs more than a
whole py-spy dump. So backtrace is parsed without click when its command line is plain
(cli/fast.py); click builds the same command from these declarations (cli/options.py turns them
into click options), and handles everything else, including every error and --help.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Optional, Tuple


class Option:
    __slots__ = ("name", "help", "flag", "default", "choices", "value_type", "metavar", "short")

    def __init__(
        self,
        name: str,
        help: str,
        flag: bool = False,
        default: Any = None,
        choices: Optional[Tuple[str, ...]] = None,
        value_type: Any = str,
        metavar: Optional[str] = None,
        short: Optional[str] = None,
    ) -> None:
        self.short = short  # e.g. "-v"
        self.name = name  # the long flag, e.g. "--thread"
        self.help = help
        self.flag = flag
        self.default = default
        self.choices = choices
        self.value_type = value_type
        self.metavar = metavar

    @property
    def dest(self) -> str:
        return self.name.lstrip("-").replace("-", "_")


ROW_FORMATS = ("table", "json", "jsonl", "csv")


def timeout(default: float, help: str = "Seconds to wait for the agent.") -> Option:
    """--timeout: every command that asks an agent has one; its default and meaning vary."""
    return Option("--timeout", help, default=default, value_type=float, metavar="S")


TEXT_OR_JSON = Option(
    "--format", "Text for people, json for scripts.", default="text", choices=("text", "json")
)
ROWS_FORMAT = Option("--format", "How to print the rows.", default="table", choices=ROW_FORMATS)


def scan_budget(help: str) -> Option:
    return Option("--scan-budget", help, default=1.0, value_type=float, metavar="S")


RANKS = Option(
    "--ranks",
    "every rank of the distributed job TARGET belongs to (all), or some (0,2-3); TARGET may be any "
    "rank or the torchrun process",
    metavar="all|LIST",
)

# Global (before the command), for every --ranks command: the job is the agents at these
# endpoints, reached over TCP, and TARGET is left out.
ENDPOINTS = Option(
    "--endpoints",
    "the job's agents listening on TCP (HOST:PORT,... or @FILE, one per line), instead of TARGET: "
    "probing --endpoints h1:29600,h2:29600 COMMAND --ranks all",
    metavar="LIST|@FILE",
)

BACKTRACE_OPTIONS = (
    Option("--locals", "show each frame's local variables (bounded reprs)", flag=True, default=False),
    Option("--thread", "only the thread with this name, Python ident or native id", metavar="NAME|ID"),
    Option(
        "--format",
        "text reads like a traceback; the others give python.backtrace rows",
        default="text",
        choices=("text", *ROW_FORMATS),
    ),
    Option(
        "--native",
        "Python and native (C/C++) frames merged, read from outside with py-spy",
        flag=True,
        default=False,
    ),
    Option(
        "--children",
        "the process and all its descendants (DataLoader workers, torchrun ranks); those without "
        "an agent are read from outside",
        flag=True,
        default=False,
    ),
    Option(
        "--attach-children",
        "attach to descendants that have no agent (implies --children)",
        flag=True,
        default=False,
    ),
    timeout(
        3.0,
        "seconds to wait for the agent's answer; then the stacks are read from outside (py-spy), "
        "which gets as long again (at least 3 s)",
    ),
    RANKS,
)

GLOBAL_OPTIONS = (
    Option(
        "--verbose", "Say each step taken (socket, attach, timings).", flag=True, default=False, short="-v"
    ),
    Option(
        "--no-attach",
        "Never attach: fail (exit 6) when the process has no agent yet.",
        flag=True,
        default=False,
    ),
    Option(
        "--attach-timeout",
        "Seconds to wait for the agent to come up after attaching.",
        default=5.0,
        value_type=float,
        metavar="S",
    ),
)
# The target named as an option, where it is not the first word: `probing -t PID backtrace`,
# `--target=PID`. The native front end takes its spellings from here too (gen_tables.py).
TARGET = Option(
    "--target",
    "PID of the process, the path of its agent socket, tcp://HOST:PORT of an agent listening on TCP, "
    "a record file a job left (FILE.probing, FILE.fatal), or a core file.",
    metavar="TARGET",
    short="-t",
)


def names_target(arg: str) -> bool:
    """Whether a word of the command line is the target option: -t, --target or --target=X."""
    return arg in (TARGET.short, TARGET.name) or arg.startswith(TARGET.name + "=")
