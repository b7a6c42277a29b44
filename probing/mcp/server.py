"""`probing mcp`: the tools of tools.py served over the Model Context Protocol on stdio, with the
official SDK (`mcp`, the `probing[mcp]` extra)."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Dict

from . import tools

INSTRUCTIONS = """\
probing debugs live Python processes, above all PyTorch training jobs under torchrun, without
restarting them: where every thread of every rank is, SQL over their tables, whether the job is
hung or has a straggler, its memory. Start with list_processes (or ranks of a job's PID), then
backtrace (ranks="all" for every rank), hang, stragglers, query, memory. A TARGET is a PID (any
rank of a job, or torchrun), tcp://HOST:PORT of an agent, a record file (records lists them) or a
core file. eval, trace and nan change the job and are off unless the server was started with
--allow-changes."""


def build_server(allow_changes: bool) -> Any:
    """The MCP server with every tool; the changing ones refuse unless `allow_changes`."""
    from mcp.server import MCPServer
    from mcp.types import ToolAnnotations

    from .. import __version__

    server = MCPServer(name="probing", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING")
    for call in tools.READING:
        server.add_tool(
            _as_result(call, call.__name__, None),
            name=call.__name__,
            annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False, open_world_hint=False),
        )
    for name, call in tools.CHANGING.items():
        gate = _gate(name, allow_changes)
        server.add_tool(
            _as_result(call, name, gate),
            name=name,
            description=(call.__doc__ or "").strip(),
            annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
        )
    return server


def _gate(name: str, allow_changes: bool) -> Any:
    def check(arguments: Dict[str, Any]) -> None:
        if not tools.changes_the_job(name, arguments):
            return
        if not allow_changes:
            raise tools.Refused(
                f"{name} changes the job, and this server was started without --allow-changes: "
                "restart it as `probing mcp --allow-changes` to let the assistant do that"
            )
        tools.log_change(name, arguments)

    return check


def _as_result(call: tools.Call, name: str, gate: Any) -> Any:
    """`call`, its dictionary answer made a CallToolResult (structured content and its text);
    the signature kept, for the SDK to make the tool's input schema of."""
    from mcp.types import CallToolResult, TextContent

    signature = inspect.signature(call, eval_str=True)

    @functools.wraps(call)
    async def tool(**arguments: Any) -> CallToolResult:
        try:
            if gate is not None:
                gate(arguments)
            answer = await call(**arguments)
        except (tools.Refused, ValueError) as error:
            return CallToolResult(content=[TextContent(type="text", text=str(error))], is_error=True)
        return CallToolResult(
            content=[TextContent(type="text", text=answer["text"])],
            structured_content=answer["structured"],
            is_error=answer["is_error"],
        )

    tool.__signature__ = signature.replace(return_annotation=CallToolResult)  # type: ignore[attr-defined]
    tool.__name__ = name
    return tool
