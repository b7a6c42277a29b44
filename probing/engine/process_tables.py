"""process.stats: a snapshot of the process taken from the CLI's side with psutil.

It needs nothing from the agent, so it answers even when the job's GIL is held or the agent cannot
be loaded; what /proc does not let this user read is NULL. psutil is imported here only.
"""

from __future__ import annotations

import socket
from typing import Any, Callable, Dict, List, Optional, Tuple

from ..errors import PermissionDenied, ProcessNotFound
from ..schema.tables import CLI_TABLES

MB = 1024.0 * 1024.0


LOCAL_TABLES = CLI_TABLES


def _address(address: Any) -> str:
    if not address:
        return ""
    if isinstance(address, tuple) and len(address) == 2:
        host, port = address
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


def _connection(connection: Any) -> str:
    kinds = {
        (socket.AF_INET, socket.SOCK_STREAM): "tcp",
        (socket.AF_INET6, socket.SOCK_STREAM): "tcp6",
        (socket.AF_INET, socket.SOCK_DGRAM): "udp",
        (socket.AF_INET6, socket.SOCK_DGRAM): "udp6",
        (socket.AF_UNIX, socket.SOCK_STREAM): "unix",
        (socket.AF_UNIX, socket.SOCK_DGRAM): "unix-dgram",
    }
    text = kinds.get((connection.family, connection.type), "socket")
    local, remote = _address(connection.laddr), _address(connection.raddr)
    if local:
        text += f" {local}"
    if remote:
        text += f" -> {remote}"
    if connection.status and connection.status != "NONE":
        text += f" {connection.status}"
    return text


def stats_row(pid: int) -> Tuple[Any, ...]:
    """One row of process.stats for `pid`; raises ProcessNotFound / PermissionDenied."""
    import psutil

    try:
        process = psutil.Process(pid)
        name = process.name()
    except psutil.NoSuchProcess:
        raise ProcessNotFound(f"no process with PID {pid}") from None
    except psutil.AccessDenied:
        raise PermissionDenied(f"not allowed to read PID {pid}") from None

    def read(get: Callable[[], Any]) -> Any:
        try:
            return get()
        except (psutil.AccessDenied, psutil.ZombieProcess, NotImplementedError, OSError):
            return None

    with process.oneshot():
        status, created = read(process.status), read(process.create_time)
        memory = read(process.memory_full_info) or read(process.memory_info)
        times, threads, fds = read(process.cpu_times), read(process.num_threads), read(process.num_fds)
        switches, io = read(process.num_ctx_switches), read(process.io_counters)
    files = read(process.open_files)
    # net_connections() is psutil 6's name for connections().
    connections = read(lambda: (getattr(process, "net_connections", None) or process.connections)(kind="all"))
    children = read(lambda: process.children(recursive=True))

    def field(record: Any, attribute: str, scale: float = 1.0) -> Optional[float]:
        value = getattr(record, attribute, None) if record is not None else None
        return None if value is None else value / scale

    def count(record: Any, attribute: str) -> Optional[int]:
        value = getattr(record, attribute, None) if record is not None else None
        return None if value is None else int(value)

    return (
        pid, name, status, created,
        field(memory, "rss", MB), field(memory, "vms", MB), field(memory, "uss", MB),
        field(memory, "pss", MB), field(memory, "swap", MB), field(memory, "shared", MB),
        field(times, "user"), field(times, "system"), field(times, "children_user"),
        field(times, "children_system"), threads, fds,
        count(switches, "voluntary"), count(switches, "involuntary"),
        count(io, "read_bytes"), count(io, "write_bytes"), count(io, "read_count"), count(io, "write_count"),
        None if files is None else sorted(entry.path for entry in files),
        None if connections is None else [_connection(entry) for entry in connections],
        None if children is None else sorted(child.pid for child in children),
    )  # fmt: skip


def local_rows(name: str, pid: int) -> List[Tuple[Any, ...]]:
    """The rows of the CLI-side table `name` for `pid`, in the order of its columns."""
    return [stats_row(pid)]


def local_tables_described() -> List[Dict[str, Any]]:
    return [table.describe() for table in LOCAL_TABLES.values()]
