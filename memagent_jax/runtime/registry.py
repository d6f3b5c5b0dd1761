"""Name -> function registries that configs select from (advantages, losses, rewards)."""

from __future__ import annotations

import contextlib
from typing import Callable, Generic, Iterator, TypeVar

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
  """A dict of named functions; unknown names fail with the list of known ones, since a typo
  in a config should fail loudly, not train silently."""

  def __init__(self, kind: str):
    self.kind = kind
    self._fns: dict[str, F] = {}

  def register(self, name: str, fn: F | None = None):
    """`registry.register(name, fn)`, or `@registry.register(name)` as a decorator."""
    def add(f: F) -> F:
      if name in self._fns:
        raise ValueError(f"{self.kind} {name!r} is already registered")
      self._fns[name] = f
      return f
    return add if fn is None else add(fn)

  @contextlib.contextmanager
  def registered(self, name: str, fn: F) -> Iterator[F]:
    """fn under name for the length of a with-block (a notebook trial, a test), then gone again."""
    self.register(name, fn)
    try:
      yield fn
    finally:
      del self._fns[name]

  def get(self, name: str) -> F:
    try:
      return self._fns[name]
    except KeyError:
      raise KeyError(f"unknown {self.kind} {name!r}; known: {sorted(self._fns)}") from None

  def __contains__(self, name: str) -> bool:
    return name in self._fns

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._fns))
