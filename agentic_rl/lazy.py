"""Names a package exports but loads on first use, so that importing the package loads none of their modules (torch
and vLLM among them): `agentic-rl plan` reads a config and answers without importing torch."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, origins: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module-level `__getattr__` and `__dir__` (PEP 562) for the names in `origins`.

    Args:
        package: the package's `__name__`.
        origins: each exported name -> the module it is defined in.

    Returns:
        `__getattr__`, which imports a name's module on first use and binds the name on the package (later reads
        are plain attribute reads), and `__dir__`.

    Raises:
        AttributeError: from `__getattr__`, for a name not in `origins`.
    """
    module = importlib.import_module(package)

    def __getattr__(name: str) -> Any:
        if name not in origins:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(origins[name]), name)
        setattr(module, name, value)
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(module), *origins})

    return __getattr__, __dir__
