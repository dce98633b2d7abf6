"""A paradigm's settings dataclass as the command line sees it: parse ``KEY=VALUE``, describe every field.

Pure: no Dask, no torch. The settings of a paradigm are a :mod:`dataclasses` dataclass whose
fields are typed (``int``, ``float``, ``str``, ``bool``, ``tuple[int, ...]`` and their ``| None``
forms) and documented in the class docstring's numpydoc ``Parameters`` or ``Attributes`` section,
one heading per field.

A field whose type is itself such a dataclass is a **group**: settings that form one unit (a
teacher model, a preset of pseudo-label settings). Its fields are named ``group.field`` wherever
settings are named by strings: ``-o pseudo.weight=2`` on the command line, ``{"pseudo.weight": 2}``
in a variant, the rows of ``--help``. A settings class may map names it had before to those it has
now in a ``renamed`` class attribute (``{"pseudo_weight": "pseudo.weight"}``): the old names keep
working everywhere a name is read, run folders written before included.

:func:`settings_from_options` turns ``-o key=value`` strings into a settings object,
:func:`settings_from_json` the ``settings`` a run folder recorded, :func:`describe_settings` lists every
field with its type, default and meaning (in plain words, for ``--help``), and :func:`check_settings`
is the validation every settings class runs in its ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

from carls_dask.errors import ConfigError

__all__ = ["SettingInfo", "check_settings", "describe_settings", "field_docs", "get_setting", "parse_setting",
           "plain_text", "settings_from_json", "settings_from_options", "settings_to_json",
           "settings_values", "strict_json"]

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


def check_settings(owner: str, checks: Iterable[tuple[bool, str]]) -> None:
    """Raise :class:`ConfigError` ``"<owner>: <message>"`` for the first ``(ok, message)`` check that failed.

    Settings classes build the list of their checks in ``__post_init__`` (each message names the
    setting, the value given and what was expected) and pass it here.
    """
    for ok, message in checks:
        if not ok:
            raise ConfigError(f"{owner}: {message}")


_ROLE = re.compile(r":[a-z]+:`~?(?:[^`<]*<)?([^`>]+)>?`")


def plain_text(text: str) -> str:
    """``text`` from a docstring in plain words: no reStructuredText roles or literal quotes.

    ``:func:`~a.b.name``` and ``:mod:`a.b.name``` become ``name``, double backquotes go.
    """
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("``", "")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _groups(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The init fields of ``cls`` whose type is a dataclass (its groups), by name."""
    hints = _hints(cls)
    return {f.name: f for f in dataclasses.fields(cls)
            if f.init and isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])}


def _leaves(cls: type) -> dict[str, tuple[type, str, Any]]:
    """Every settable name of ``cls`` (``group.field`` inside a group) -> ``(owner class, field name, hint)``."""
    hints = _hints(cls)
    groups = _groups(cls)
    out: dict[str, tuple[type, str, Any]] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name in groups:
            for sub, (owner, name, hint) in _leaves(hints[f.name]).items():
                out[f"{f.name}.{sub}"] = (owner, name, hint)
        else:
            out[f.name] = (cls, f.name, hints[f.name])
    return out


def get_setting(settings: Any, name: str) -> Any:
    """The value of setting ``name`` (``group.field`` reaches into a group) of a settings object."""
    value = settings
    for part in name.split("."):
        value = getattr(value, part)
    return value


def _canonical(cls: type, raw: object, owner: str, shown: str) -> str:
    """The setting name ``raw`` stands for: ``-`` read as ``_``, an old name (``cls.renamed``) as its new one.

    Raises
    ------
    ConfigError
        For a name ``cls`` does not know (the message lists the names it knows).
    """
    key = ".".join(part.replace("-", "_") for part in str(raw).split("."))
    key = dict(getattr(cls, "renamed", {})).get(key, key)
    leaves = _leaves(cls)
    if key not in leaves:
        raise ConfigError(f"{owner} setting {shown}: unknown; expected one of {sorted(leaves)}")
    return key


def settings_values(cls: type, values: Mapping[str, Any], *, owner: str = "") -> dict[str, Any]:
    """``values`` (typed) by the name of the setting of ``cls`` each is for.

    Old names (``cls.renamed``) become the new ones, ``-`` reads as ``_``, and a group given whole
    (a mapping of its settings, or a settings object) is spread into ``group.field`` entries.

    Raises
    ------
    ConfigError
        For a name ``cls`` does not know (the message lists the names it knows).
    """
    return _flatten(cls, values, owner or cls.__name__)


def _flatten(cls: type, values: Mapping[str, Any], owner: str) -> dict[str, Any]:
    """:func:`settings_values` with the owner named."""
    groups = _groups(cls)
    out: dict[str, Any] = {}
    for raw, value in values.items():
        name = str(raw).replace("-", "_")
        if name in groups and not isinstance(value, str):
            if dataclasses.is_dataclass(value) and not isinstance(value, type):
                value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.init}
            if not isinstance(value, Mapping):
                raise ConfigError(f"{owner} setting {name!r}: got {value!r}; expected a mapping of its settings "
                                  f"or a {typing.get_type_hints(cls)[name].__name__}")
            out.update({f"{name}.{k}": v for k, v in value.items()})
        else:
            out[raw] = value
    return {_canonical(cls, k, owner, repr(k)): v for k, v in out.items()}


def _build(cls: type, flat: Mapping[str, Any]) -> Any:
    """A ``cls`` object from values by setting name (the others keep their defaults); groups are built first."""
    groups = _groups(cls)
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    inner: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        head, dot, rest = key.partition(".")
        if dot:
            inner.setdefault(head, {})[rest] = value
        else:
            kwargs[key] = value
    for name, sub in inner.items():
        f = groups[name]
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        elif f.default is not dataclasses.MISSING:
            default = f.default
        else:
            default = None
        built = _build(hints[name], {**_fields_of(default), **sub} if default is not None else sub)
        kwargs[name] = built
    return cls(**kwargs)


def _fields_of(obj: Any) -> dict[str, Any]:
    """The init fields of the dataclass object ``obj`` by setting name (groups spread)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out.update({f"{f.name}.{k}": v for k, v in _fields_of(value).items()})
        else:
            out[f.name] = value
    return out


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
            raise ConfigError(text)
        if inner is int:
            return int(text)
        if inner is float:
            value = float(text)
            if math.isnan(value):
                raise ConfigError(text)
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
    """Build a ``cls`` settings object from ``key=value`` strings over the typed values in ``base``.

    Keys are setting names (``group.field`` inside a group, an old name from ``cls.renamed``);
    ``-`` may stand for ``_``. ``base`` may also give a group whole, as a mapping of its settings or a
    settings object. The dataclass validates the result on construction (its ``__post_init__``).

    Raises
    ------
    ConfigError
        For an unknown key (the message lists the known ones) or a value that does not parse.
    """
    owner = owner or cls.__name__
    leaves = _leaves(cls)
    flat = _flatten(cls, base or {}, owner)
    for raw, text in options.items():
        key = _canonical(cls, raw, owner, f"{raw!r}={text!r}")
        flat[key] = parse_setting(owner, key, str(text), leaves[key][2])
    return _build(cls, flat)


def settings_from_json(cls: type, data: Mapping[str, Any], *, owner: str = "") -> Any:
    """Build a ``cls`` settings object from its :func:`settings_to_json` form (``RUN/request.json``'s settings).

    Lists become tuples where the field is a tuple, groups are nested mappings, and the flat old
    names of ``cls.renamed`` (run folders written before a setting joined a group) are read as the new ones.

    Raises
    ------
    ConfigError
        For a name ``cls`` does not know.
    """
    owner = owner or cls.__name__
    leaves = _leaves(cls)
    flat = _flatten(cls, data, owner)
    for key, value in flat.items():
        if isinstance(value, list) and typing.get_origin(_unwrap(leaves[key][2])[0]) is tuple:
            flat[key] = tuple(value)
    return _build(cls, flat)


def describe_settings(cls: type, defaults: Any | None = None) -> list[SettingInfo]:
    """Every setting of ``cls`` (``group.field`` inside a group) with its type, default and meaning.

    The default is the value in ``defaults`` (a settings object: what a run with those settings
    really uses) when given, else the field's default. The meaning is the field's docstring entry in
    plain words (:func:`plain_text`).
    """
    if defaults is None:
        defaults = _build(cls, {})
    docs: dict[type, dict[str, str]] = {}
    out = []
    for name, (owner, field, hint) in _leaves(cls).items():
        meaning = docs.setdefault(owner, field_docs(owner)).get(field, "")
        out.append(SettingInfo(name, type_text(hint), get_setting(defaults, name), plain_text(meaning)))
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
