"""`probing FILE query` on a record against the same query on the live job, in the same run.

A job started with `probing run` (benchmarks/torch_target.py) is traced until python.torch_trace
holds a million rows; its tables are then fetched from its agent and written as a record (here,
by this script, with protocol.records.write_record: what the agent's own writer puts in the file
is the same tables in the same format). The seed query then runs through the CLI, end to end
(a new `probing` process each time), alternately on the live job and on the record; reported:
the median of each and their ratio, and the record's size and the time it took to fetch and write.

    .venv/bin/python benchmarks/bench_record_query.py [--repeats 5] [--rows 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
PROBING = [sys.executable, "-m", "probing"]
SEED_QUERY = (
    "SELECT module, stage, avg(duration) as avg_time FROM python.torch_trace "
    "WHERE step > (SELECT max(step) - 5 FROM python.torch_trace) "
    "GROUP BY module, stage ORDER BY avg_time DESC LIMIT 10;"
)
TABLES = ("python.backtrace", "python.threads", "process.info", "python.torch_trace", "process.memory")


def _probing(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PROBING, *args], capture_output=True, text=True, timeout=timeout)


def write_record_of(pid: int, directory: str) -> Dict[str, Any]:
    """The job's tables fetched from its agent and written as a record; how long each took."""
    from probing.client.connection import Client
    from probing.client.discovery import locate_socket
    from probing.protocol.records import write_record

    started = time.monotonic()
    fetched = []
    with Client(locate_socket(pid, lambda message: None), 60.0, lambda message: None, pid=pid) as client:
        client.call("ping")
        argv = list(client.info.get("argv") or [])
        for name in TABLES:
            result, payload = client.call("table", {"name": name}, timeout=120.0)
            fetched.append((result["table"], [bytes(payload)]))
    fetch_s = time.monotonic() - started
    reason = {"kind": "on_demand", "message": "bench_record_query", "signal": None, "exit_status": None}
    header = {
        "probing_version": "bench", "pid": pid, "argv": argv, "python_version": None,
        "written_at": time.time(), "reason": reason, "exception": None, "rank": None,
        "tables": [descriptor["name"] for descriptor, _ in fetched], "notes": [],
    }  # fmt: skip
    started = time.monotonic()
    path = write_record(directory, f"torch_target-{pid}.probing", header, fetched)
    return {
        "path": path,
        "fetch_seconds": round(fetch_s, 3),
        "write_seconds": round(time.monotonic() - started, 3),
    }


def run(repeats: int, rows_wanted: int) -> Dict[str, Any]:
    log = os.path.join(tempfile.gettempdir(), f"bench_record_gaps_{os.getpid()}.log")
    directory = tempfile.mkdtemp(prefix="bench_record_")
    job = subprocess.Popen(
        [*PROBING, "run", "--", sys.executable, os.path.join(HERE, "torch_target.py"), log],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert job.stdout is not None and job.stderr is not None
        pid = int(job.stderr.readline().split()[3].rstrip(":"))  # probing: started PID N: ...
        job.stdout.readline()  # ready
        capacity = str(max(1000, rows_wanted + rows_wanted // 10))
        status = _probing(str(pid), "trace", "on", "--every", "1", "--capacity", capacity, "--format", "json")
        if status.returncode != 0:
            raise SystemExit(f"trace on failed: {status.stderr}")
        started = time.monotonic()
        while True:
            rows = json.loads(_probing(str(pid), "trace", "status", "--format", "json").stdout)["rows"]
            if rows >= rows_wanted or time.monotonic() - started > 300:
                break
            time.sleep(1.0)
        fill_s = time.monotonic() - started
        written = write_record_of(pid, directory)
        record = written["path"]
        live: List[float] = []
        on_record: List[float] = []
        for _ in range(repeats):
            for target, times in ((str(pid), live), (record, on_record)):
                begin = time.monotonic()
                result = _probing(target, "query", SEED_QUERY)
                times.append(time.monotonic() - begin)
                if result.returncode != 0:
                    raise SystemExit(f"query on {target} failed: {result.stderr}")
        counted = _probing(record, "query", "SELECT count(*) FROM python.torch_trace", "--format", "csv")
        record_rows = int(counted.stdout.splitlines()[1])
        size = os.path.getsize(record)
    finally:
        job.terminate()
        job.wait(timeout=10)
        for path in (log,):
            if os.path.exists(path):
                os.unlink(path)
        shutil.rmtree(directory, ignore_errors=True)
    live_s, record_s = statistics.median(live), statistics.median(on_record)
    return {
        "record_rows": record_rows,
        "record_mb": round(size / 1048576, 1),
        "fill_seconds": round(fill_s, 1),
        "fetch_seconds": written["fetch_seconds"],
        "write_seconds": written["write_seconds"],
        "live_query_s": [round(value, 3) for value in live],
        "record_query_s": [round(value, 3) for value in on_record],
        "live_median_s": round(live_s, 3),
        "record_median_s": round(record_s, 3),
        "record_over_live": round(record_s / live_s, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    result = run(args.repeats, args.rows)
    print(json.dumps(result, indent=2))
    print(
        f"seed query over {result['record_rows']:,} torch_trace rows: record {result['record_median_s']} s, "
        f"live {result['live_median_s']} s (ratio {result['record_over_live']}); record "
        f"{result['record_mb']} MB, fetched in {result['fetch_seconds']} s, "
        f"written in {result['write_seconds']} s"
    )


if __name__ == "__main__":
    main()
