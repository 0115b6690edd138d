"""The one style of user-facing configuration: a pydantic model that rejects unknown fields and bad values.

Every settings object of the package (`SamplingConfig`, `VLLMEngineConfig`, `HarnessConfig`, `MemoryConfig`,
`GRPOConfig`, `TrainConfig` and its sections) is a `Config`: built with keyword arguments (or `model_validate` from
a dict, e.g. YAML), validated on construction and on every assignment, and any problem raises `ConfigError` naming
`ClassName.field`, the value and the rule, before anything starts.
"""

from __future__ import annotations

import os
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Self, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

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
        detail = f"={shown} is invalid: {err['msg'].removeprefix('Value error, ')}"
    return _error(owner, [field] if field else [], detail)


def _error(owner: str, path: list[str], detail: str) -> ConfigError:
    full = [owner, *path]
    return ConfigError(".".join(full) + detail, path=full, detail=detail)


def _numeric(annotation: Any) -> bool:
    """Whether a field of this annotation holds a number (int or float, possibly optional), not a boolean."""
    if get_origin(annotation) is Annotated:
        return _numeric(get_args(annotation)[0])
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        return bool(args) and all(_numeric(arg) for arg in args)
    return annotation in (int, float)


class Config(BaseModel):
    """Base of every settings object: unknown fields rejected, checked on assignment, errors as `ConfigError`.

    A boolean is refused where a number is expected (pydantic would read YAML's `true` as 1), and so is a float that
    is not finite (`.inf`, `.nan`: no option of the package means "unbounded" by infinity). An assignment that
    fails leaves the object as it was. Checks across fields run on construction and on assignment to the object
    itself; an assignment inside a nested section is checked against that section only (`checked` re-runs them all).

    Raises:
        ConfigError: on construction, `model_validate` or assignment, naming the first bad field.
    """

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, arbitrary_types_allowed=True, allow_inf_nan=False
    )

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        annotation = cls.model_fields[info.field_name].annotation
        if isinstance(value, bool) and _numeric(annotation):
            raise ValueError(f"a number is expected, not the boolean {value}")
        listed = get_args(annotation) if get_origin(annotation) is list else ()
        if listed and _numeric(listed[0]) and isinstance(value, list) and any(isinstance(v, bool) for v in value):
            raise ValueError(f"numbers are expected, not booleans: {value}")
        return value

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

    def checked(self) -> Self:
        """This config validated anew from its values, nested sections included: catches what assignments inside
        a section got past the checks of the sections around it.

        Raises:
            ConfigError: naming the first bad field or check.
        """
        return type(self).model_validate(self.model_dump())

    def __setattr__(self, name: str, value: Any) -> None:
        before, fields_set = dict(self.__dict__), set(self.__pydantic_fields_set__)
        try:
            super().__setattr__(name, value)
        except ValidationError as exc:  # a check across fields fails after pydantic set the value: put it back
            object.__setattr__(self, "__dict__", before)
            object.__setattr__(self, "__pydantic_fields_set__", fields_set)
            raise config_error(type(self).__name__, exc) from None
