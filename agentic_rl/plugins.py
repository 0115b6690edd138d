"""Classes and functions named by a dotted path in a config file: `package.module:Name` (`Name` may be nested,
`Outer.Inner`), with keyword arguments (`PluginRef`).

A training config names a user's environment, tools or agent this way. The module is imported as Python imports
it; when its top-level package is not found, the current directory is tried too (as `python -m` would), so a
config run from a project's root can name the project's own modules (e.g. `examples.guess_game:GuessEnvironment`).
A few built-in classes also have a short name (`SHORT_NAMES`: ``environment: workspace``).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentic_rl.errors import ConfigError

__all__ = ["SHORT_NAMES", "PluginRef", "load_object"]

SHORT_NAMES = {"workspace": "agentic_rl.environments.workspace:WorkspaceEnvironment"}
"""Built-in classes a config may name by a short name instead of `package.module:Name` (`PluginRef`, `load_object`)."""


def _split(path: str, what: str) -> tuple[str, str]:
    module, sep, name = path.partition(":")
    if not sep:
        raise ConfigError(f"{what} {path!r} has no ':' between the module and the name: write 'package.module:Name'")
    if not module or not name or " " in path:
        raise ConfigError(f"{what} {path!r} is not a 'package.module:Name' path")
    return module, name


def _import(module: str, what: str, path: str) -> Any:
    """Import `module`, retrying with the current directory on `sys.path` when its top-level package is missing."""
    try:
        return _import_module(module, what, path)
    except ModuleNotFoundError as exc:
        cwd = os.getcwd()
        top = module.split(".")[0]
        if exc.name != top or cwd in sys.path or "" in sys.path:
            raise ConfigError(f"{what} {path!r}: cannot import module {module!r}: {exc}") from None
        sys.path.insert(0, cwd)
        try:
            return _import_module(module, what, path)
        except ModuleNotFoundError as again:
            raise ConfigError(
                f"{what} {path!r}: cannot import module {module!r} (also tried from {cwd}): {again}"
            ) from None


def _import_module(module: str, what: str, path: str) -> Any:
    """`importlib.import_module(module)`; a `ModuleNotFoundError` passes through (the caller may retry).

    Raises:
        ConfigError: when the module raised while being imported, or exited (`SystemExit`: a script's top level
            calling `sys.exit()` or argparse's `parse_args()`). A `KeyboardInterrupt` stays an interrupt.
    """
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError:
        raise
    except SystemExit as exc:
        raise ConfigError(
            f"{what} {path!r}: importing module {module!r} exited (SystemExit: {exc.code!r}): its top level runs "
            'a script (sys.exit(), argparse\'s parse_args()); put that code under `if __name__ == "__main__":`'
        ) from None
    except Exception as exc:  # the module itself raised while being imported
        raise ConfigError(f"{what} {path!r}: importing module {module!r} failed: {type(exc).__name__}: {exc}") from exc


def load_object(path: str, *, what: str, base: type | None = None) -> Any:
    """The object `path` (`package.module:Name`) names.

    Args:
        path: `package.module:Name` (`Name` may be dotted: `Outer.Inner`), or a key of `SHORT_NAMES`.
        what: what the object is for, as the error messages name it (e.g. `"environment"`, `"tools[1]"`).
        base: when given, the object must be a subclass of it.

    Raises:
        ConfigError: naming `what`, the path and what is missing: a malformed path, a module that cannot be
            imported (or raised while importing), a missing attribute, or a class of the wrong kind.
    """
    module_name, name = _split(SHORT_NAMES.get(path, path), what)
    obj: Any = _import(module_name, what, path)
    for part in name.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{what} {path!r}: module {module_name!r} has no attribute {name!r}")
        obj = getattr(obj, part)
    if base is not None and not (isinstance(obj, type) and issubclass(obj, base)):
        kind = f"class {obj.__name__}" if isinstance(obj, type) else type(obj).__name__
        raise ConfigError(f"{what} {path!r} must name a subclass of {base.__name__}, got {kind}")
    return obj


class PluginRef(BaseModel):
    """A class named in a config, and the keyword arguments to build it with.

    Written as `{class: package.module:Name, kwargs: {...}}`, or as the bare string `package.module:Name` (no
    keyword arguments); a key of `SHORT_NAMES` may stand for `package.module:Name`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, serialize_by_alias=True)

    path: str = Field(alias="class", description="package.module:Name")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the class")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"class": value} if isinstance(value, str) else value

    @model_validator(mode="after")
    def _dotted(self) -> PluginRef:
        _split(SHORT_NAMES.get(self.path, self.path), "class")
        return self

    def load(self, *, what: str, base: type | None = None) -> Any:
        """The class (`load_object`). Raises `ConfigError` as `load_object` does."""
        return load_object(self.path, what=what, base=base)

    def build(self, *, what: str, base: type | None = None, **extra: Any) -> Any:
        """An instance: the class called with `extra` and this reference's `kwargs` (which win).

        Raises:
            ConfigError: as `load`, or naming the class and the error when its constructor raises.
        """
        cls = self.load(what=what, base=base)
        try:
            return cls(**{**extra, **self.kwargs})
        except Exception as exc:
            raise ConfigError(
                f"{what} {self.path!r} could not be built with kwargs {self.kwargs}: {type(exc).__name__}: {exc}"
            ) from exc
