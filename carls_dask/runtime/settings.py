"""A paradigm's settings dataclass as the command line sees it: parse ``KEY=VALUE``, describe every field.

Pure: no Dask, no torch. The settings of a paradigm are a :mod:`dataclasses` dataclass whose
fields are typed (``int``, ``float``, ``str``, ``bool``, ``tuple[int, ...]`` and their ``| None``
forms) and documented in the class docstring's numpydoc ``Parameters`` or ``Attributes`` section.
:func:`settings_from_options` turns ``-o key=value`` strings into such an object, and
:func:`describe_settings` lists every field with its type, default and meaning, for ``--help``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

from carls_dask.errors import ConfigError

__all__ = ["SettingInfo", "describe_settings", "field_docs", "parse_setting", "settings_from_options",
           "settings_to_json", "strict_json"]

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_NONE = ("none", "null")


@dataclasses.dataclass(frozen=True)
class SettingInfo:
    """One field of a settings dataclass: its name, type as text, default and meaning."""

    name: str
    type: str
    default: Any
    meaning: str


def field_docs(cls: type) -> dict[str, str]:
    """The meaning of each field from the numpydoc ``Parameters``/``Attributes`` section of ``cls``'s docstring.

    A heading line names one field or several (``hidden, dropout, lr``); the indented lines under it
    are the meaning, joined into one line.
    """
    doc = cls.__doc__ or ""
    lines = doc.expandtabs().splitlines()
    out: dict[str, str] = {}
    in_section = False
    names: list[str] = []
    body: list[str] = []
    base_indent = None

    def flush() -> None:
        if names:
            text = " ".join(" ".join(body).split())
            for n in names:
                out[n] = text

    for i, line in enumerate(lines):
        stripped = line.strip()
        nxt = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if stripped in ("Parameters", "Attributes") and set(nxt) == {"-"}:
            flush()
            names, body, in_section, base_indent = [], [], True, None
            continue
        if not in_section or set(stripped) == {"-"}:
            continue
        if stripped and i + 1 < len(lines) and set(nxt) == {"-"} and nxt:
            flush()  # the next section's heading
            names, in_section = [], False
            continue
        indent = len(line) - len(line.lstrip())
        if stripped and (base_indent is None or indent <= base_indent):
            flush()
            base_indent = indent
            head = stripped.split(":")[0]
            names, body = [n.strip() for n in head.split(",") if n.strip()], []
        elif stripped:
            body.append(stripped)
    flush()
    return out


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _unwrap(hint: Any) -> tuple[Any, bool]:
    """``(inner type, allows None)`` of ``X | None`` or ``X``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else hint), len(args) < len(typing.get_args(hint))
    return hint, False


def type_text(hint: Any) -> str:
    """A short name of a field's type for ``--help`` (``int``, ``float or none``, ``ints a,b,c``...)."""
    inner, optional = _unwrap(hint)
    if typing.get_origin(inner) is tuple:
        elem = typing.get_args(inner)[0]
        text = f"{getattr(elem, '__name__', elem)}s a,b,..."
    else:
        text = getattr(inner, "__name__", str(inner))
    return f"{text} or none" if optional else text


def parse_setting(owner: str, key: str, text: str, hint: Any) -> Any:
    """Parse the string ``text`` of setting ``key`` as the type ``hint``.

    Raises
    ------
    ConfigError
        Naming the setting, the value given and what was expected.
    """
    inner, optional = _unwrap(hint)
    low = text.strip().lower()
    if optional and low in (*_NONE, ""):
        return None
    expected = type_text(hint)
    try:
        if inner is bool:
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError(text)
        if inner is int:
            return int(text)
        if inner is float:
            value = float(text)
            if math.isnan(value):
                raise ValueError(text)
            return value
        if inner is str:
            return text
        if typing.get_origin(inner) is tuple:
            elem = typing.get_args(inner)[0]
            return tuple(elem(v) for v in re.split(r"[,\s]+", text.strip()) if v)
    except ValueError:
        pass
    else:
        raise ConfigError(f"{owner} setting {key!r}: cannot read a value of type {expected}")
    raise ConfigError(f"{owner} setting {key}={text!r}: expected {expected}")


def settings_from_options(cls: type, options: Mapping[str, str], *, base: Mapping[str, Any] | None = None,
                          owner: str = "") -> Any:
    """Build a ``cls`` settings object from ``key=value`` strings over the values in ``base``.

    Keys are field names; ``-`` may stand for ``_``. The dataclass validates the result on
    construction (its ``__post_init__``).

    Raises
    ------
    ConfigError
        For an unknown key (the message lists the known ones) or a value that does not parse.
    """
    owner = owner or cls.__name__
    hints = _hints(cls)
    fields = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs: dict[str, Any] = dict(base or {})
    for raw, text in options.items():
        key = str(raw).replace("-", "_")
        if key not in fields:
            raise ConfigError(f"{owner} setting {raw!r}={text!r}: unknown; expected one of {sorted(fields)}")
        kwargs[key] = parse_setting(owner, key, str(text), hints[key])
    return cls(**kwargs)


def describe_settings(cls: type, defaults: Any | None = None) -> list[SettingInfo]:
    """Every init field of ``cls`` with its type, default (from ``defaults`` when given) and meaning."""
    hints = _hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if defaults is not None:
            default = getattr(defaults, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        out.append(SettingInfo(f.name, type_text(hints[f.name]), default, docs.get(f.name, "")))
    return out


def strict_json(value: Any) -> Any:
    """``value`` made strict JSON: NaN and infinities become ``None``, numpy numbers and arrays plain, tuples lists."""
    if isinstance(value, Mapping):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if hasattr(value, "tolist") and not isinstance(value, int | float):  # numpy scalars and arrays
        return strict_json(value.tolist())
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return strict_json(dataclasses.asdict(value))
    return str(value)


def settings_to_json(settings: Any) -> dict[str, Any]:
    """A settings dataclass as a strict-JSON dict (tuples as lists)."""
    out: dict[str, Any] = strict_json(dataclasses.asdict(settings))
    return out
