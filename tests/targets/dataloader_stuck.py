"""A DataLoader with two workers; the worker given index 5 blocks forever in __getitem__.

"ready" once that worker is inside __getitem__(5) and the main thread has taken batches 0-4,
so that the next batch it waits for is the one that never comes. A short-lived thread says
it: the main thread cannot announce the wait it is in.
"""

import multiprocessing
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Stuck(Dataset):
    def __init__(self, stuck):
        self.stuck = stuck  # a multiprocessing.Event: the workers are forked with it

    def __len__(self):
        return 64

    def __getitem__(self, index):
        if index == 5:
            self.stuck.set()
            threading.Event().wait()  # this worker never returns index 5
        return torch.tensor([index])


def announce_once_stuck(stuck, taken):
    stuck.wait()
    while len(taken) < 5:
        time.sleep(0.001)
    print("ready", flush=True)


if __name__ == "__main__":
    stuck = multiprocessing.Event()
    taken = []
    loader = DataLoader(Stuck(stuck), batch_size=1, num_workers=2)
    threading.Thread(target=announce_once_stuck, args=(stuck, taken), daemon=True).start()
    for batch in loader:
        taken.append(batch)
