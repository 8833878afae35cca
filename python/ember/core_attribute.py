"""CoreAttribute: a read-only attribute of a Python class that is its C++ object's (self._core),
so a wrapper such as ember.Engine or ember.Embedder names and documents it in one line."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

T = TypeVar("T")


class CoreAttribute(Generic[T]):
    """`n_ctx = CoreAttribute[int]("Tokens one request may reach.")` in a class body reads
    self._core.n_ctx."""

    def __init__(self, doc: str = "") -> None:
        self.__doc__ = doc
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        if obj is None:
            return self  # type: ignore[return-value]  # the class's attribute: this descriptor
        value: T = getattr(obj._core, self.name)
        return value
