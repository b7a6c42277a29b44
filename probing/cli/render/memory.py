"""How `probing PID memory` prints: the summary, the --growth report, the sampler's state."""

from __future__ import annotations

import sys
from typing import IO, Any, Dict, List, Optional, Tuple

from . import inert_stream, notes
from .json_writer import write_json

# The source line at each (file, line) of a growth report, as the engine read them.
Code = Dict[Tuple[str, int], str]


def size(mb: Optional[float], signed: bool = False) -> str:
    """MB as people read it: '812.4 MB', '+312 KB', '1.52 GB'."""
    if mb is None:
        return "?"
    sign = "+" if signed and mb >= 0 else "-" if mb < 0 else ""
    value = abs(mb)
    if value >= 1 << 30:
        # No machine has an exabyte: a job's (or a byte-swapped record's) figure, in few digits.
        return f"{sign}{value / 1024:.3g} GB"
    if value >= 1024:
        return f"{sign}{value / 1024:.2f} GB"
    if value >= 1 or value == 0:
        return f"{sign}{value:.1f} MB"
    if value >= 1 / 1024:
        return f"{sign}{value * 1024:.0f} KB"
    return f"{sign}{value * 1024 * 1024:.0f} B"


def _signed(count: Optional[float]) -> str:
    return "?" if count is None else f"{count:+,.0f}"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min {seconds % 60:.0f} s"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"


def _table(header: List[str], rows: List[List[str]], right: List[bool], out: IO[str]) -> None:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        cells = [cell.rjust(width) if r else cell.ljust(width) for cell, width, r in zip(row, widths, right)]
        out.write("  " + "  ".join(cells).rstrip() + "\n")


def write_memory(result: Dict[str, Any], command: str, out: IO[str]) -> None:
    outside = result.get("outside") or {}
    parts = [f"RSS {size(result['rss_mb'])} (peak {size(result.get('rss_peak_mb'))})"]
    if "uss_mb" in outside:
        parts += [
            f"USS {size(outside['uss_mb'])}",
            f"PSS {size(outside['pss_mb'])}",
            f"swap {size(outside['swap_mb'])}",
        ]
    out.write(f"PID {result['pid']} ({command}): {', '.join(parts)}; virtual {size(result['vms_mb'])}\n")
    out.write(f"  {result.get('num_threads')} threads, {result.get('num_fds')} open file descriptors\n")
    if "error" in outside:
        out.write(f"  USS unknown: {outside['error']}\n")
    growth, sampler = result.get("growth"), result.get("sampler")
    if growth is not None:
        changes = [f"RSS {size(growth['rss_mb'], True)}", f"gc objects {_signed(growth['gc_objects'])}"]
        if growth.get("cuda_allocated_mb") is not None:
            changes.append(f"CUDA allocated {size(growth['cuda_allocated_mb'], True)}")
        out.write(f"Since the agent started {duration(growth['seconds'])} ago: {', '.join(changes)}\n")
    if sampler is not None and sampler["running"]:
        used = f"{1000 * sampler['cpu_s']:.0f} ms of CPU ({100 * sampler['cpu_share']:.3f}% of a core)"
        out.write(
            f"  process.memory: a sample every {sampler['interval_s']:g} s, {sampler['rows']:,} kept; "
            f"sampling has used {used}\n"
        )
    elif sampler is not None and sampler.get("error"):
        out.write(f"  process.memory: sampling stopped: {sampler['error']}\n")
    else:
        out.write("  process.memory: sampling is off (probing PID memory --interval 1 turns it on)\n")
    gc = result["gc"]
    counted = "" if not gc["cut_short"] else f", {gc['counted']:,} of them"
    out.write(
        f"\nPython objects: {gc['objects']:,} tracked by gc{counted} counted in {gc['elapsed_s']:.2f} s; "
        f"collections by generation {' / '.join(str(c) for c in gc['collections'])}"
        f"{'' if gc['enabled'] else ' (gc is disabled)'}\n"
    )
    if any(entry["cuda_mb"] for entry in gc["types"]):
        rows = [
            [entry["type"], f"{entry['count']:,}", f"{entry['size_mb']:.1f}",
             "" if entry["cuda_mb"] is None else f"{entry['cuda_mb']:.1f}"]
            for entry in gc["types"]
        ]  # fmt: skip
        _table(["type", "count", "size_mb", "cuda_mb"], rows, [False, True, True, True], out)
    else:
        rows = [[entry["type"], f"{entry['count']:,}", f"{entry['size_mb']:.1f}"] for entry in gc["types"]]
        _table(["type", "count", "size_mb"], rows, [False, True, True], out)
    _write_torch(result.get("torch"), out)


def _write_torch(torch: Optional[Dict[str, Any]], out: IO[str]) -> None:
    """The tensors visible to Python, and each CUDA device's allocator figures."""
    if torch is None:
        out.write("\ntorch: not imported\n")
        return
    storage = ", ".join(f"{size(mb)} on {device}" for device, mb in torch["storage_mb"].items()) or "nothing"
    out.write(f"\ntorch: {torch['tensors']:,} tensors visible to Python hold at least {storage}\n")
    if not torch["cuda_initialised"]:
        out.write("  CUDA: not initialised in this process\n")
    for device in torch["cuda"]:
        out.write(
            f"  cuda:{device['device']}: allocated {size(device['allocated_mb'])} "
            f"(peak {size(device['max_allocated_mb'])}), reserved {size(device['reserved_mb'])} "
            f"(peak {size(device['max_reserved_mb'])}), {device['ooms']} OOMs, "
            f"{device['alloc_retries']} allocation retries\n"
        )


def _where(code: Code, file: Optional[str], line: Optional[int]) -> str:
    if file is None:
        return "?"
    text = code.get((file, line), "") if isinstance(file, str) and isinstance(line, int) else ""
    return f"{file}:{line}" + (f"  {text}" if text else "")


def write_growth(result: Dict[str, Any], code: Code, out: IO[str]) -> None:
    _write_growth_summary(result, out)
    if result.get("tensor_sites") is not None:  # an agent from before tensor sites has none
        _write_tensor_sites(result, code, out)
    _write_allocation_sites(result, code, out)
    out.write("\nObject types that grew:\n")
    rows = [
        [
            t["type"],
            f"{t['count_diff']:+,}",
            f"{t['count_before']:,} -> {t['count_after']:,}",
            size(t["size_diff_mb"], True),
        ]
        for t in result["types"]
    ]
    if rows:
        _table(["type", "count", "", "size"], rows, [False, True, True, True], out)
    else:
        out.write("  none\n")
    _write_growth_overhead(result["overhead"], out)


def _write_growth_summary(result: Dict[str, Any], out: IO[str]) -> None:
    """The window's first lines: RSS and gc objects, tensor storage and CUDA counters."""
    watched = result["watched_s"]
    ended = "" if result["completed"] else " (ended early)"
    before, after = result["rss_mb_before"], result["rss_mb_after"]
    change = None if before is None or after is None else after - before
    rss = f"RSS {size(before)} -> {size(after)} ({size(change, True)})"
    objects = result["objects_after"] - result["objects_before"]
    out.write(f"PID {result['pid']} watched for {watched:.1f} s{ended}: {rss}, gc objects {objects:+,}\n")
    storage = []
    old, new = result["tensor_storage_mb_before"], result["tensor_storage_mb_after"]
    for device in sorted(set(old) | set(new)):
        storage.append(f"{size(new.get(device, 0.0) - old.get(device, 0.0), True)} on {device}")
    if storage:
        out.write(f"  tensor storage: {', '.join(storage)}\n")
    for device in result["cuda"]:
        mb = 1024.0 * 1024.0
        out.write(
            f"  cuda:{device['device']}: allocated {size(device['allocated_bytes.all.current'] / mb, True)}, "
            f"reserved {size(device['reserved_bytes.all.current'] / mb, True)}, "
            f"{device['num_ooms']:+} OOMs, {device['num_alloc_retries']:+} allocation retries\n"
        )


def _write_allocation_sites(result: Dict[str, Any], code: Code, out: IO[str]) -> None:
    """tracemalloc's sites that grew, each at the job's own line that led there."""
    sites = result["sites"]
    out.write(f"\nAllocation sites that grew (tracemalloc, {result['overhead']['frames']} frames):\n")
    if not sites:
        out.write("  none: no Python allocation made in the window is still alive\n")
    for site in sites:
        out.write(f"  {size(site['size_diff_mb'], True):>10} {site['count_diff']:>+9,} blocks  ")
        job = (site["job_file"], site["job_line"])
        allocated = (site["file"], site["line"])
        if job[0] is None:
            out.write(f"{_where(code, *allocated)}\n")
            continue
        out.write(f"{_where(code, *job)}\n")
        if job != allocated:
            out.write(f"{'':>33}allocated at {_where(code, *allocated)}\n")
    if result["site_count"] > len(sites):
        out.write(f"  ... and {result['site_count'] - len(sites):,} more sites\n")


def _write_growth_overhead(overhead: Dict[str, Any], out: IO[str]) -> None:
    """What watching cost the job: tracemalloc's slowdown and memory, probing's CPU."""
    if overhead["tracemalloc_started"]:
        bare, traced = overhead["allocation_us"], overhead["traced_allocation_us"]
        cost = (
            f"it added {traced - bare:.2f} us to each Python allocation ({traced / bare:.0f}x a bare one), "
            if bare and traced
            else ""
        )
        on = overhead.get("tracemalloc_s")  # None from an agent that does not say
        out.write(
            f"\nOverhead: tracemalloc ran for this window only (started and stopped by probing): {cost}"
            f"its traces held {size(overhead['tracemalloc_mb'])}"
            f"{f' in the {on:.1f} s it was on' if on is not None else ''}; "
        )
    else:
        out.write(
            f"\nOverhead: tracemalloc was already running in the job and is left running; "
            f"its traces hold {size(overhead['tracemalloc_mb'])}; "
        )
    out.write(f"probing's object scans and snapshots used {overhead['agent_cpu_s']:.2f} s of CPU.\n")


TENSOR_INDENT = " " * 17
TENSOR_HEADING = (
    "Tensor storage that grew (storages new in the window and still alive, at the line where "
    "tracemalloc saw their tensors made):"
)


def _write_tensor_sites(result: Dict[str, Any], code: Code, out: IO[str]) -> None:
    """The tensor storage new at the window's end by the line that made its tensors, and what
    holds it: the leak's line and its holder, which Python's allocations alone cannot show."""
    sites = result["tensor_sites"]
    unmeasured = result.get("tensor_storage_unmeasured")
    if unmeasured:
        out.write(f"\nTensor storage that grew: not measured: {unmeasured}\n")
        return
    if not sites:
        if result["tensor_storage_mb_after"]:  # the job has tensors
            out.write("\nTensor storage that grew: none (no storage made in the window is still alive)\n")
        return
    out.write(f"\n{TENSOR_HEADING}\n")
    for site in sites:
        _write_tensor_site(site, code, out)
    if result["tensor_site_count"] > len(sites):
        more = result["tensor_site_count"] - len(sites)
        out.write(f"  ... and {more:,} more {'line' if more == 1 else 'lines'}\n")


def _write_tensor_site(site: Dict[str, Any], code: Code, out: IO[str]) -> None:
    storages = f"{site['storages']:,} {'storage' if site['storages'] == 1 else 'storages'}"
    out.write(f"  {size(site['size_mb'], True):>10}  {storages} on {site['device']}  ")
    job = (site["job_file"], site["job_line"])
    made = (site["file"], site["line"])
    if made[0] is None:
        out.write(
            "line unknown: tracemalloc saw none of their tensors made in the window (gradients and "
            "others torch makes in C++ get a Python object later, or none)\n"
        )
    elif job[0] is None:
        out.write(f"{_where(code, *made)}\n")
    else:
        out.write(f"{_where(code, *job)}\n")
        if job != made:
            out.write(f"{TENSOR_INDENT}made at {_where(code, *made)}\n")
    for holder in site["holders"]:
        if holder["storages"] == 1:
            out.write(f"{TENSOR_INDENT}held by {holder['example']}\n")
        else:
            out.write(
                f"{TENSOR_INDENT}held by {holder['holder']}: {holder['storages']:,} storages, "
                f"{size(holder['size_mb'])} (e.g. {holder['example']})\n"
            )
    shown = sum(holder["storages"] for holder in site["holders"])
    if site["held"] > shown:
        out.write(f"{TENSOR_INDENT}and {site['held'] - shown:,} held elsewhere\n")
    unnamed = site["storages"] - site["held"]
    if unnamed:
        unnamed_mb = max(0.0, site["size_mb"] - site.get("held_mb", 0.0))
        out.write(
            f"{TENSOR_INDENT}{unnamed:,} ({size(unnamed_mb)}) not found from the job's variables "
            "(held in C++, by the autograd graph or a closure, or past the walk's bounds)\n"
        )


def write_sampler(result: Dict[str, Any], out: IO[str]) -> None:
    sampler = result.get("sampler")
    if sampler is None or not sampler["running"]:
        out.write("process.memory: sampling is off\n")
        return
    out.write(
        f"process.memory: a sample every {sampler['interval_s']:g} s; {sampler['rows']:,} samples kept\n"
    )


def write_cuda_snapshot(result: Dict[str, Any], path: str, out: IO[str]) -> None:
    history = (
        "with allocation stacks"
        if result["has_history"]
        else "without allocation stacks (the job has not called torch.cuda.memory._record_memory_history())"
    )
    out.write(
        f"PID {result['pid']}: wrote the CUDA memory snapshot ({result['segments']} segments, "
        f"{size(result['bytes'] / 1024.0 / 1024.0)}) {history} to {path}\n"
        "  open it at https://pytorch.org/memory_viz\n"
    )


def write_memory_answer(
    answer: Any, format: str, snapshot_path: Optional[str], to: Optional[IO[str]] = None
) -> None:
    """`probing PID memory` in all its forms; then the agent's notes (what it cut short).
    `to`: where the text goes (one rank's part of many), instead of stdout."""
    result = answer.result
    if snapshot_path is not None:
        with open(snapshot_path, "wb") as handle:
            handle.write(answer.snapshot)
        write_cuda_snapshot(result, snapshot_path, sys.stdout)
        return
    out = inert_stream(to or sys.stdout)
    if format == "json":
        write_json(result)
    elif answer.action == "growth":
        write_growth(result, answer.code, out)
    elif answer.action == "interval":
        write_sampler(result, out)
    else:
        write_memory(result, answer.command, out)
    notes(result.get("notes") or ())
