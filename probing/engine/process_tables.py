"""process.stats: a snapshot of the process taken from the CLI's side with psutil.

It needs nothing from the agent, so it answers even when the job's GIL is held or the agent cannot
be loaded; what /proc does not let this user read is NULL. psutil is imported here only.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from ..agent.columns import TableBuilder
from ..agent.tables import Column, Table
from ..errors import PermissionDenied, ProcessNotFound

MB = 1024.0 * 1024.0


def _unbuilt(server: Any, params: Dict[str, Any]) -> Any:
    raise RuntimeError("process.stats is taken by the CLI, not by the agent")


PROCESS_STATS = Table(
    "process.stats",
    "A snapshot of the process from outside (psutil, read by the CLI at the time of the query; "
    "needs no agent): memory including USS, CPU times, I/O, open files, connections, children. "
    "What this user may not read is NULL.",
    [
        Column("pid", "BIGINT", "process id"),
        Column("name", "VARCHAR", "process name"),
        Column("status", "VARCHAR", "running, sleeping, disk-sleep, stopped, zombie, ..."),
        Column("create_time", "TIMESTAMP", "when the process started (UTC)"),
        Column("rss_mb", "DOUBLE", "resident set size, MB"),
        Column("vms_mb", "DOUBLE", "virtual memory size, MB"),
        Column("uss_mb", "DOUBLE", "unique set size: MB that would be freed if the process exited"),
        Column("pss_mb", "DOUBLE", "proportional set size: shared pages divided among their users, MB"),
        Column("swap_mb", "DOUBLE", "MB swapped out"),
        Column("shared_mb", "DOUBLE", "resident MB that could be shared with other processes"),
        Column("cpu_user_s", "DOUBLE", "user CPU seconds of the process"),
        Column("cpu_system_s", "DOUBLE", "system CPU seconds of the process"),
        Column("children_user_s", "DOUBLE", "user CPU seconds of its waited-for children"),
        Column("children_system_s", "DOUBLE", "system CPU seconds of its waited-for children"),
        Column("num_threads", "BIGINT", "OS threads"),
        Column("num_fds", "BIGINT", "open file descriptors"),
        Column("ctx_switches_voluntary", "BIGINT", "voluntary context switches (waits)"),
        Column("ctx_switches_involuntary", "BIGINT", "involuntary context switches (preemptions)"),
        Column("io_read_bytes", "BIGINT", "bytes read from storage"),
        Column("io_write_bytes", "BIGINT", "bytes written to storage"),
        Column("io_read_count", "BIGINT", "read system calls"),
        Column("io_write_count", "BIGINT", "write system calls"),
        Column("open_files", "VARCHAR[]", "paths of the regular files it has open"),
        Column(
            "connections",
            "VARCHAR[]",
            "its sockets, e.g. 'tcp 127.0.0.1:29500 -> 127.0.0.1:41234 ESTABLISHED'",
        ),
        Column("children", "BIGINT[]", "PIDs of its child processes (DataLoader workers, ...)"),
    ],
    _unbuilt,
)

LOCAL_TABLES: Dict[str, Table] = {PROCESS_STATS.name: PROCESS_STATS}


def _address(address: Any) -> str:
    if not address:
        return ""
    if isinstance(address, tuple) and len(address) == 2:
        host, port = address
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(address)


def _connection(connection: Any) -> str:
    import socket

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


def build_local_table(name: str, pid: int) -> TableBuilder:
    builder = LOCAL_TABLES[name].new_builder()
    builder.append(stats_row(pid))
    return builder


def local_tables_described() -> List[Dict[str, Any]]:
    return [table.describe() for table in LOCAL_TABLES.values()]
