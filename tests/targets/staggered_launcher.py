"""A launcher that starts its ranks as torchrun does (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RUN_ID, MASTER_ADDR/PORT in each environment), but
the last one --late seconds after the others, as a loaded machine can: a watchdog that looked
early must still watch every rank. Each rank sleeps in wait_for_data(); the launcher waits for
them. Stdlib only."""

import argparse
import os
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--ranks", type=int, default=3)
parser.add_argument("--late", type=float, default=2.0)
options = parser.parse_args()

RANK_CODE = """
import time

def wait_for_data():
    time.sleep(3600)

wait_for_data()
"""

children = []
for rank in range(options.ranks):
    if rank == options.ranks - 1:
        time.sleep(options.late)
    environment = dict(
        os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(options.ranks),
        LOCAL_WORLD_SIZE=str(options.ranks), GROUP_RANK="0", TORCHELASTIC_RUN_ID=f"staggered-{os.getpid()}",
        MASTER_ADDR="127.0.0.1", MASTER_PORT="29999",
    )  # fmt: skip
    children.append(subprocess.Popen([sys.executable, "-c", RANK_CODE], env=environment))
for child in children:
    child.wait()
