"""The size of an axis derived from a ranged dim by windows (frontends/extent_dims.py): a convolution or pool sliding
along the dim gives (L + lo + hi - d(K-1) - 1) // s + 1 of its input's L, a pad L + lo + hi. Every chain of them is
one form, (n + b) // q + e of the dim's size n, since floor((floor((n + b) / q) + m) / s) = floor((n + b + m q) /
(q s)) for whole m. The compiler lays the axis out at its size at the dim's bound and runs its loops to the form's
value at the run's size; the manifest writes it in an output's shape as text ("(width+3)//4"), which the loader
reads back."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DimSize:
  """(n + b) // q + e of a ranged dim's size n, 0 <= b < q: n + b is never negative, so C's division, which
  truncates, floors."""

  b: int = 0
  q: int = 1
  e: int = 0

  def at(self, n: int) -> int:
    return (n + self.b) // self.q + self.e

  def padded(self, add: int) -> DimSize:
    return DimSize(self.b, self.q, self.e + add)

  def windowed(self, c: int, s: int) -> DimSize:
    """(self + c) // s + 1, its b brought into [0, q) (the form is then one per function, and n + b is never
    negative)."""
    b, q = self.b + (self.e + c) * self.q, self.q * s
    return DimSize(b % q, q, 1 + b // q) if q > 1 else DimSize(0, 1, b + 1)

  def text(self, name: str) -> str:
    """The form as an output's shape in the manifest writes it: name, name+3, name//4, (name+1)//2+1."""
    if self.q == 1:
      return f"{name}{self.b + self.e:+d}" if self.b + self.e else name
    return f"{f'({name}{self.b:+d})' if self.b else name}//{self.q}{f'{self.e:+d}' if self.e else ''}"

  def c(self, n: str) -> str:
    """The form as a C expression of the size n (an integer variable)."""
    if self.q == 1:
      return f"({n} + {self.b + self.e})" if self.b + self.e else n
    return f"(({n} + {self.b}) / {self.q} + {self.e})"


def size_of(text, sizes: dict[str, int]):
  """A shape entry of the manifest at the ranged dims' sizes (by name): an int as it is, a dim's name its size, a
  form of one (DimSize.text) its value; anything else as it is (a symbolic dim the artifact pins)."""
  if not isinstance(text, str):
    return text
  if text in sizes:
    return sizes[text]
  for name, n in sizes.items():
    x = re.escape(name)
    m = re.fullmatch(rf"(?:\({x}([+-]\d+)\)//(\d+)|{x}//(\d+)|{x})([+-]\d+)?", text)
    if m:
      b, q = int(m[1] or 0), int(m[2] or m[3] or 1)
      return (n + b) // q + int(m[4] or 0)
  return text
