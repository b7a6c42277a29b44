"""A training job that is slower than it should be: one submodule loops over every token.

    probing run -- python docs/examples/slow_module.py

A small text classifier over packed sequences (several documents per row, separated by
token 0). Its `positions` module numbers every token within its document, written as a
Python loop over the batch that indexes the tensor token by token: a few small tensor
operations per token, each costing microseconds of Python and dispatch overhead, on every
forward. The rest of the model takes a few milliseconds a step. It prints "ready" after its
first step and trains until you stop it (Ctrl-C).
"""

import torch
from torch import nn

SEPARATOR = 0  # the token between two packed documents


class PackedPositions(nn.Module):
    """Embed each token's position within its document (a separator starts a new one)."""

    def __init__(self, length: int, width: int) -> None:
        super().__init__()
        self.table = nn.Embedding(length, width)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.zeros_like(tokens)
        for sample in range(tokens.shape[0]):  # slow: a tensor operation per token
            for index in range(1, tokens.shape[1]):
                if tokens[sample, index] != SEPARATOR:
                    positions[sample, index] = positions[sample, index - 1] + 1
        return self.table(positions)


class Classifier(nn.Module):
    def __init__(self, vocabulary: int = 1000, length: int = 128, width: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocabulary, width)
        self.positions = PackedPositions(length, width)
        self.feed_forward = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head = nn.Linear(width, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.positions(tokens)
        x = x + self.feed_forward(x)
        return self.head(x.mean(dim=1))


def train() -> None:
    generator = torch.Generator().manual_seed(0)
    step = 0
    while True:
        tokens = torch.randint(0, 1000, (64, 128), generator=generator)
        labels = torch.randint(0, 4, (64,), generator=generator)
        loss = nn.functional.cross_entropy(model(tokens), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 0:
            print("ready", flush=True)
        step += 1


torch.manual_seed(0)
model = Classifier()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
train()
