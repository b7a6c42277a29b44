"""A training job that hangs: one DataLoader worker never comes back from reading a sample.

    probing run -- python docs/examples/stuck_loader.py

The samples are small files in a directory. Sample 37 stands for a file on a network mount
that stopped answering: it is a named pipe that nobody writes to, so opening it never
returns. The job prints its steps until it needs the batch that holds sample 37, then waits
for it forever. The worker prints "ready" as it starts that read, so that the test which
runs the user guide knows when to look. Stop the job with Ctrl-C.
"""

import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

STALLED = 37  # the sample on the mount that stopped answering


class SampleFiles(Dataset):
    """Sample i is the file <directory>/<i>.bin: 16 float32 features, then the target."""

    def __init__(self, directory: str, count: int) -> None:
        self.paths = [os.path.join(directory, f"{index:05}.bin") for index in range(count)]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int):
        path = self.paths[index]
        if index == STALLED:
            os.write(1, b"ready\n")  # one write, not inside a step's line (print writes twice)
        with open(path, "rb") as sample:
            values = torch.frombuffer(bytearray(sample.read()), dtype=torch.float32)
        return values[:-1], values[-1:]


def write_samples(directory: str, count: int) -> None:
    generator = torch.Generator().manual_seed(0)
    for index in range(count):
        path = os.path.join(directory, f"{index:05}.bin")
        if index == STALLED:
            os.mkfifo(path)
            continue
        with open(path, "wb") as sample:
            sample.write(torch.randn(17, generator=generator).numpy().tobytes())


def train(loader: DataLoader, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    for step, (inputs, targets) in enumerate(loader):
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        os.write(1, f"step {step}: loss {loss.item():.4f}\n".encode())  # one write: a worker writes too


if __name__ == "__main__":
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        write_samples(directory, 64)
        dataset = SampleFiles(directory, 64)
        loader = DataLoader(dataset, batch_size=4, num_workers=2)
        model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        train(loader, model, optimizer)
