"""TorchScript models with two inputs and two outputs, for tests/test_torch_io.py:
a module of their own so that collecting the tests (the fast loop) does not
import torch, 1.2 s a worker. The width of their tensors is the tests' own
(`build`'s argument)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn


class Mix(nn.Module):
    """The head of the chain: a linear layer on `a`, plus `b`."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.lin(a) + b


class Split(nn.Module):
    """The chain's last layer: two outputs from one tensor."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x + 1.0, x * 2.0


class Chain(nn.Module):
    """Children called one after another: staged after `mix`."""

    def __init__(self, width: int, depth: int) -> None:
        super().__init__()
        self.mix = Mix(width)
        self.body = nn.Sequential(*(nn.Sequential(nn.Linear(width, width), nn.Tanh())
                                    for _ in range(depth)))  # fmt: skip
        self.split = Split()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.split(self.body(self.mix(a, b)))


class SumProduct(nn.Module):
    """a + b and a * b after a linear layer (on a): not a chain, unstaged."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.lin(a)
        return h + b, h * b


class ByName(nn.Module):
    """Dicts in and out, keyed by tensor name."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        h = self.lin(inputs["a"])
        return {"product": h * inputs["b"], "sum": h + inputs["b"]}


def save(module: nn.Module, path: Path) -> Path:
    with warnings.catch_warnings():  # TorchScript is deprecated in torch 2.13, still supported
        warnings.simplefilter("ignore", DeprecationWarning)
        torch.jit.save(torch.jit.script(module.eval()), str(path))
    return path


def build(kind: str, width: int, seed: int = 0) -> nn.Module:
    """A model of the class named `kind` on tensors [n, width], its weights
    from `seed`."""
    torch.manual_seed(seed)
    cls = {"Chain": Chain, "SumProduct": SumProduct, "ByName": ByName}[kind]
    return Chain(width, 3) if cls is Chain else cls(width)


def eager(module: nn.Module, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """The module's own outputs, by name."""
    with torch.inference_mode():
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        if isinstance(module, ByName):
            return {k: v.numpy() for k, v in module({"a": ta, "b": tb}).items()}
        s, p = module(ta, tb)
        return {"sum": s.numpy(), "product": p.numpy()}
