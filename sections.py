"""Reads a config section (a plain mapping, as YAML gives it) into its dataclass, checking each
value against the field's annotation, so a wrong key or type fails naming the dotted setting.

A leaf module (no other shadowsync import): the run config (``pipelines.config``) reads every
section with it, and the model zoo reads a user builder's options with it, without the zoo
depending on the pipeline. A dataclass that defines its own ``config_class(raw, key)`` picks
the class a section is read into from the section itself (``model.name`` picks the model's
options class). The valid range of a numeric setting is a :class:`Range`, checked by
:func:`check_range` wherever a setting is checked (the run config, the synchronizer's).
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

__all__ = ["POSITIVE", "Range", "check_fields", "check_range", "read_section"]


@dataclasses.dataclass(frozen=True)
class Range:
    """A range of valid values; ``closed`` says which ends belong to it, ``words`` how an
    error names it (default: the bounds)."""

    low: float
    high: float = math.inf
    closed: tuple[bool, bool] = (True, True)
    words: str | None = None

    def __str__(self) -> str:
        if self.words is not None:
            return self.words
        if self.high == math.inf:
            return f"{'>=' if self.closed[0] else '>'} {self.low:g}"
        return (f"in {'[' if self.closed[0] else '('}{self.low:g}, {self.high:g}"
                f"{']' if self.closed[1] else ')'}")

    def __contains__(self, value: float) -> bool:
        above = value >= self.low if self.closed[0] else value > self.low
        below = value <= self.high if self.closed[1] else value < self.high
        return above and below


POSITIVE = Range(0, closed=(False, True), words="positive")


def check_range(key: str, value: float | None, valid: Range) -> None:
    """Raises ``ValueError`` naming ``key`` if ``value`` is outside ``valid``; None (a setting
    left unset) passes."""
    if value is not None and value not in valid:
        raise ValueError(f"{key} must be {valid}, got {value}")


def check_fields(section: object, prefix: str, ranges: Mapping[str, Range]) -> None:
    """:func:`check_range` on every field of the dataclass ``section`` that ``ranges`` has,
    naming ``prefix.<field>``."""
    for f in dataclasses.fields(section):  # type: ignore[arg-type]
        if f.name in ranges:
            check_range(f"{prefix}.{f.name}", getattr(section, f.name), ranges[f.name])


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Checks ``value`` against the annotation ``tp`` (recursing into dataclasses and lists)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping, got {value!r}")
        if "config_class" in vars(tp):  # its own, not a subclass's inherited one
            tp = typing.cast(Any, tp).config_class(value, key)
        return read_section(tp, value, key)
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise ValueError(f"{key}: must be one of {list(typing.get_args(tp))}, got {value!r}")
        return value
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(tp):
            if arm is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(value, arm, key)
            except ValueError:
                continue
        raise ValueError(f"{key}: {value!r} does not fit {_type_name(tp)}")
    if origin is list:
        if not isinstance(value, list):
            raise ValueError(f"{key}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)  # train.steps=1e4
    if tp is Any:
        return value
    if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
        raise ValueError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    return value


def read_section(cls: type, raw: dict[str, Any], prefix: str) -> Any:
    """``raw`` as an instance of the dataclass ``cls``; errors name ``prefix.<key>`` (the top
    level with ``prefix`` empty). A key that ``cls.MOVED`` (a mapping, if the class has one)
    lists fails naming where it went."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - names)
    if unknown:
        where = f"{prefix}." if prefix else ""
        moved = getattr(cls, "MOVED", {})
        if unknown[0] in moved:
            raise ValueError(f"{where}{unknown[0]} has moved: use {moved[unknown[0]]}")
        raise ValueError(
            f"unknown setting {where}{unknown[0]}; known under {prefix or 'the top level'}: "
            f"{sorted(names)}"
        )
    kwargs = {
        k: _coerce(v, hints[k], f"{prefix}.{k}" if prefix else k) for k, v in raw.items()
    }
    return cls(**kwargs)
