"""Reference models built in code with seeded weights, each with its pinned kernel count."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

import numpy as np

from aot.errors import InvalidValueError

NAMES = ("mlp", "mnist", "resnet18", "transformer")


@dataclass(frozen=True)
class ReferenceModel:
  name: str
  forward: Callable  # Tensor program: forward(*inputs: aot.Tensor) -> aot.Tensor
  inputs: tuple  # ((name, shape, numpy dtype), ...) in call order
  reference: Callable  # numpy forward: reference(*arrays) -> np.ndarray, written independently of aot
  expected_kernels: int  # pinned kernel count on every target

  def example_inputs(self, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _, shape, dtype in self.inputs]


def get(name: str) -> ReferenceModel:
  if name not in NAMES:
    raise InvalidValueError(f"unknown reference model {name!r}; the bundled models are: {', '.join(NAMES)}")
  return importlib.import_module(f"aot.models.{name}").build()
