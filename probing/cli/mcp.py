"""`probing mcp`: serve probing's tools to a coding assistant over the Model Context Protocol."""

from __future__ import annotations

import sys

import click

from ..errors import ExitCode, UsageError


@click.command(name="mcp")
@click.option(
    "--allow-changes", is_flag=True,
    help="Let the assistant run the tools that change the job (eval, trace on/off, nan on/off); "
    "each such call is logged to stderr.",
)  # fmt: skip
def mcp_command(allow_changes: bool) -> int:
    """An MCP server on stdin/stdout, for a coding assistant to start as a subprocess: its tools
    list processes and jobs, read stacks, run SQL, judge hangs and stragglers, read memory and
    records, and write a report. Tools that change the job refuse unless --allow-changes.

    Needs the MCP SDK (`pip install 'probing[mcp]'`, Python 3.10+). docs/mcp.md shows how to
    configure an assistant.
    """
    if sys.version_info < (3, 10):
        raise UsageError("probing mcp needs Python 3.10 or newer (the MCP SDK's)", hint="")
    try:
        from ..mcp.server import build_server
    except ImportError as error:
        raise UsageError(
            f"probing mcp needs the MCP SDK, which is not installed ({error})",
            hint="pip install 'probing[mcp]'",
        ) from None
    build_server(allow_changes).run("stdio")
    return ExitCode.OK
