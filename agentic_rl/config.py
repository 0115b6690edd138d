"""The one style of user-facing configuration: a pydantic model that rejects unknown fields and bad values.

Every settings object of the package (`SamplingConfig`, `VLLMEngineConfig`, `HarnessConfig`, `MemoryConfig`,
`GRPOConfig`, `TrainConfig` and its sections) is a `Config`: built with keyword arguments (or `model_validate` from
a dict, e.g. YAML), validated on construction and on every assignment, and any problem raises `ConfigError` naming
`ClassName.field`, the value and the rule, before anything starts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agentic_rl.errors import ConfigError

__all__ = ["Config", "Weight", "config_error"]

#: A finite number >= 0 for a settings field that weighs something: a reward weight or penalty, a loss weight.
Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def config_error(owner: str, exc: ValidationError) -> ConfigError:
    """A `ConfigError` naming `owner.field`, the offending value and pydantic's rule, for the first error of `exc`.

    A nested `Config` that already raised `ConfigError` keeps its message, with the outer path put in front.
    """
    err = exc.errors()[0]
    field = ".".join(str(part) for part in err["loc"])
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, ConfigError) and inner.path:
        return _error(owner, [*([field] if field else []), *inner.path[1:]], inner.detail)
    if not field:  # a check across fields (a model validator)
        detail = f" is invalid: {err['msg'].removeprefix('Value error, ')}"
    elif err["type"] == "missing":
        detail = " is required"
    elif err["type"] == "extra_forbidden":
        detail = " is not a known field"
    else:
        value = err.get("input")
        shown = repr(value) if len(repr(value)) <= 80 else f"{type(value).__name__} {repr(value)[:60]}..."
        detail = f"={shown} is invalid: {err['msg']}"
    return _error(owner, [field] if field else [], detail)


def _error(owner: str, path: list[str], detail: str) -> ConfigError:
    full = [owner, *path]
    return ConfigError(".".join(full) + detail, path=full, detail=detail)


class Config(BaseModel):
    """Base of every settings object: unknown fields rejected, checked on assignment, errors as `ConfigError`.

    Raises:
        ConfigError: on construction, `model_validate` or assignment, naming the first bad field.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, arbitrary_types_allowed=True)

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error(type(self).__name__, exc) from None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> Any:
        if isinstance(obj, dict) and not kwargs:
            return cls(**obj)
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise config_error(cls.__name__, exc) from None

    @classmethod
    def from_yaml(cls, path: str | os.PathLike[str] | None, overrides: Sequence[str] = ()) -> Self:
        """Read the config from a YAML mapping (None: the defaults), then apply `KEY=VALUE` overrides (`a.b=3`;
        values parsed as YAML).

        Raises:
            ConfigError: naming the file, the bad override or the bad field.
            FileNotFoundError: if `path` does not exist.
        """
        import yaml

        raw = {} if path is None else yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: the config must be a YAML mapping")
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--set needs KEY=VALUE, got {item!r}")
            node = raw
            *parents, leaf = key.split(".")
            for part in parents:
                node = node.setdefault(part, {})
                if not isinstance(node, dict):
                    raise ConfigError(f"--set {key}: {part!r} is not a section")
            node[leaf] = yaml.safe_load(value)
        return cls.model_validate(raw)

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:
            raise config_error(type(self).__name__, exc) from None
