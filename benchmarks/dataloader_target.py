"""A training-like loop fed by a DataLoader with 4 worker processes (for backtrace --children)."""

import time

import torch
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 10**9

    def __getitem__(self, index):
        time.sleep(0.01)
        return torch.randn(8)


if __name__ == "__main__":
    loader = DataLoader(Slow(), batch_size=4, num_workers=4)
    for step, batch in enumerate(loader):
        if step == 2:
            print("ready", flush=True)
        batch.sum()
