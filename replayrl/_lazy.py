"""PEP 562 lazy exports: a package names what it offers; each name's module is imported on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, where `exports` maps a public name to its module."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        setattr(importlib.import_module(package), name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
