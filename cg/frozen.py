"""`@frozen`: a record the type checker holds immutable, built as a plain slots dataclass.

Why: a frozen dataclass's `__init__` sets each field through `object.__setattr__`, several
times a plain slots dataclass's cost (the figures: docs/architecture.md, the layers), and a small
pass-through flow builds seven such records (its usage three times over). mypy, part of `make test`, refuses an assignment to
a field of a `@frozen` class as it does a frozen dataclass's (PEP 681's `frozen_default`); at
run time nothing stops one, and nothing in `cg` makes one. Equal records hash equal, as a
frozen dataclass's do (`unsafe_hash`). Views take the other way out, tuples
(`cg.wire.dialects.base.BlockView`); a record with arithmetic (`Usage.__add__`) or one read by
attribute everywhere keeps a dataclass's shape this way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar, dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True)
def frozen(cls: type[T]) -> type[T]:
    """`@dataclass(frozen=True, slots=True)` to mypy; `@dataclass(slots=True, unsafe_hash=True)`
    at run time."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
