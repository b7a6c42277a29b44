"""The job bench_torch.py queries: a model of 100 small blocks trained as fast as the CPU goes,
so that tracing every module fills python.torch_trace's million rows in seconds. Each step
appends `<time> <seconds since the previous step began>` to the log file named on the command
line, which is how the benchmark sees the training thread stall.

    probing run -- python benchmarks/torch_target.py GAPS.log
"""

import sys
import time

import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(100)])
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
data, target = torch.randn(4, 8), torch.randn(4, 8)
print("ready", flush=True)
with open(sys.argv[1], "w", buffering=1 << 16) as log:
    previous = time.perf_counter()
    while True:
        loss = nn.functional.mse_loss(model(data), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        log.write(f"{time.time():.6f} {now - previous:.6f}\n")
        previous = now
        log.flush()
