"""A DataLoader with two workers; the worker given index 5 blocks forever in __getitem__."""

import threading

import torch
from torch.utils.data import DataLoader, Dataset


class Stuck(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, index):
        if index == 5:
            threading.Event().wait()  # this worker never returns index 5
        return torch.tensor([index])


if __name__ == "__main__":
    loader = DataLoader(Stuck(), batch_size=1, num_workers=2)
    print("ready", flush=True)
    for _batch in loader:
        pass
