"""One generic reader of settings: a YAML mapping validated against a dataclass.

A setting is declared once, as a dataclass field made with :func:`setting` (its default, its type
annotation and its doc, plus the range or choices it allows). :func:`read_settings` turns a
mapping into that dataclass: an unknown key is an error naming the file and the key (with the
closest known key as a hint), a wrong type or an out-of-range value is a one-line error naming the
file, the key, the value and what is allowed. Values of the form ``${ENV_VAR}`` or
``${ENV_VAR:-default}`` are read from the environment (how a cluster gives local checkpoint
paths). Relative paths are relative to the file's folder. A field whose type is a dataclass is a
nested section; one typed ``Mapping`` is kept raw (a later stage validates it).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_NO_DEFAULT = dataclasses.MISSING


class SettingsError(ValueError):
    """A setting is missing or wrong; the message names the file and the setting."""


@dataclass(frozen=True)
class Origin:
    """Where one setting's value was written, when not in the file being read: a parent profile
    (``extends``) or a command-line override (``--set``). It stands in for that file: an error names
    it (``str``) and a relative path is relative to its folder (``parent``)."""

    label: str
    parent: Path

    def __str__(self) -> str:
        return self.label

    @classmethod
    def file(cls, path: Path) -> Origin:
        return cls(str(path), path.parent)


def setting(
    default: Any = _NO_DEFAULT,
    doc: str = "",
    *,
    min: float | None = None,  # noqa: A002 - the natural name in a declaration
    max: float | None = None,  # noqa: A002
    above: float | None = None,
    below: float | None = None,
    choices: tuple[Any, ...] = (),
    parse: Callable[[str], Any] | None = None,
    yaml: bool = True,
    urls: bool = False,
) -> Any:
    """A dataclass field declaring one setting.

    ``min``/``max`` bound numbers (each element of a tuple) inclusively, ``above``/``below``
    exclusively; ``choices`` lists the
    allowed values; ``parse`` turns the YAML string into the field's type (raising ValueError);
    ``yaml=False`` marks a field the caller fills (never read from the file); ``urls`` lets a path
    setting name a URL (``s3://BUCKET/PREFIX``), kept as written (a str) instead of a path relative
    to the file.
    """
    meta = {"doc": doc, "min": min, "max": max, "above": above, "below": below, "choices": tuple(choices),
            "parse": parse, "yaml": yaml, "urls": urls}
    if isinstance(default, dict):  # a raw section: each instance gets its own copy
        return dataclasses.field(default_factory=lambda: dict(default), metadata=meta)
    if isinstance(default, (list, set)):
        raise TypeError("a list default: use a tuple")
    return dataclasses.field(default=default, metadata=meta)


def expand_env(value: Any, setting_name: str, source: Path | Origin) -> Any:
    """``${VAR}`` / ``${VAR:-default}`` in a string replaced by the environment's value."""
    if not isinstance(value, str):
        return value

    def substitute(match: re.Match[str]) -> str:
        var, default = match.group(1), match.group(2)
        if os.environ.get(var, "") != "":
            return os.environ[var]
        if default is not None:
            return default
        raise SettingsError(
            f"{source}: setting '{setting_name}' needs environment variable {var}: "
            f"export {var}=... or write the value into the file"
        )

    return _ENV_PATTERN.sub(substitute, value)


def read_settings(cls: type[T], data: Any, section: str, source: Path | Origin, given: Mapping[str, Any] | None = None,
                  origins: Mapping[str, Origin] | None = None) -> T:
    """Validate the mapping ``data`` (section ``section`` of the file ``source``) into ``cls``.

    ``given`` fills the fields declared with ``yaml=False``. A ``ValueError`` raised by the
    dataclass's own ``__post_init__`` (a rule between settings) is reported with the file.
    ``origins`` names, by dotted key, the settings written elsewhere than ``source`` (a parent
    profile, a ``--set``): their errors name that place and their paths are relative to it.
    """
    origins = origins or {}
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        where = f"section '{section}'" if section else "the file"
        raise SettingsError(f"{source}: {where} must be a mapping of settings, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.metadata.get("yaml", True)}  # type: ignore[arg-type]
    for key in data:
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1)
            hint = f" (did you mean '{_name(section, close[0])}'?)" if close else ""
            where = origins.get(_name(section, str(key)), source)
            raise SettingsError(f"{where}: unknown setting '{_name(section, str(key))}'{hint}")
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = dict(given or {})
    for name, field in fields.items():
        key = _name(section, name)
        kind = hints[name]
        raw = data.get(name)
        nested = _dataclass_type(kind) if field.metadata.get("parse") is None else None
        if nested is not None:
            values[name] = read_settings(nested, raw, key, origins.get(key, source), origins=origins)
            continue
        if raw is None:
            if field.default is _NO_DEFAULT and field.default_factory is _NO_DEFAULT:
                raise SettingsError(f"{source}: missing setting '{key}'")
            continue
        values[name] = _value(raw, kind, field.metadata, key, origins.get(key, source))
    try:
        return cls(**values)
    except SettingsError:
        raise
    except ValueError as err:
        where = f"section '{section}': " if section else ""
        raise SettingsError(f"{source}: {where}{err}") from None


def _name(section: str, key: str) -> str:
    return f"{section}.{key}" if section else key


def _dataclass_type(kind: Any) -> type | None:
    return kind if isinstance(kind, type) and dataclasses.is_dataclass(kind) else None


def _optional(kind: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(kind)) == 2:
            return args[0], True
    return kind, False


def _value(raw: Any, kind: Any, meta: Mapping[str, Any], key: str, source: Path | Origin) -> Any:
    raw = expand_env(raw, key, source)
    kind, _ = _optional(kind)
    parse = meta.get("parse")
    if parse is not None:
        # Strings, and YAML's true/false for settings whose parser gives them a meaning.
        if not isinstance(raw, (str, bool)):
            raise SettingsError(f"{source}: setting '{key}' must be a string, got {raw!r}")
        try:
            return parse(raw)
        except (ValueError, TypeError) as err:
            raise SettingsError(f"{source}: setting '{key}': {err}") from None
    if typing.get_origin(kind) is tuple:
        args = typing.get_args(kind)
        variadic = len(args) == 2 and args[1] is Ellipsis
        element = args[0]
        if not isinstance(raw, (list, tuple)) or (not variadic and len(raw) != len(args)):
            want = f"a list of {element.__name__}s" if variadic else f"a list of {len(args)} {element.__name__}s"
            raise SettingsError(f"{source}: setting '{key}' must be {want}, got {raw!r}")
        return tuple(_scalar(v, element, meta, key, source) for v in raw)
    if kind in (Mapping, dict) or typing.get_origin(kind) in (Mapping, dict):
        if not isinstance(raw, Mapping):
            raise SettingsError(f"{source}: section '{key}' must be a mapping, got {raw!r}")
        return dict(raw)
    return _scalar(raw, kind, meta, key, source)


def _scalar(raw: Any, kind: Any, meta: Mapping[str, Any], key: str, source: Path | Origin) -> Any:
    if kind is Path and meta.get("urls") and isinstance(raw, str) and _URL.match(raw):
        return raw
    value = _coerce(raw, kind)
    if value is None:
        raise SettingsError(f"{source}: setting '{key}' must be {_type_name(kind)}, got {raw!r}")
    if kind is Path:
        value = value.expanduser()
        value = value if value.is_absolute() else (source.parent / value).resolve()
    choices = meta.get("choices") or ()
    if choices and value not in choices:
        raise SettingsError(
            f"{source}: setting '{key}' is {value!r}; expected one of {', '.join(map(str, choices))}"
        )
    low, high = meta.get("min"), meta.get("max")
    if low is not None and value < low:
        raise SettingsError(f"{source}: setting '{key}' is {value!r}; it must be >= {low}")
    if high is not None and value > high:
        raise SettingsError(f"{source}: setting '{key}' is {value!r}; it must be <= {high}")
    above, below = meta.get("above"), meta.get("below")
    if above is not None and not value > above:
        raise SettingsError(f"{source}: setting '{key}' is {value!r}; it must be > {above}")
    if below is not None and not value < below:
        raise SettingsError(f"{source}: setting '{key}' is {value!r}; it must be < {below}")
    return value


_URL = re.compile(r"^[a-z][a-z0-9+.-]*://")
"""A URL (``s3://...``): a location that is not a path relative to anything."""


def _coerce(raw: Any, kind: Any) -> Any:
    """``raw`` as ``kind``, or None when it is not one (strings from the environment are parsed)."""
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("true", "false", "1", "0"):
            return raw.lower() in ("true", "1")
        return None
    if kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and re.fullmatch(r"-?\d+", raw.strip()):
            return int(raw)
        return None
    if kind is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, str):
            try:
                return float(raw)
            except ValueError:
                return None
        return None
    if kind is str:
        return raw if isinstance(raw, str) else None
    if kind is Path:
        return Path(raw) if isinstance(raw, str) and raw else None
    return raw if isinstance(raw, kind) else None


def _type_name(kind: Any) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string", Path: "a path"}.get(
        kind, getattr(kind, "__name__", str(kind))
    )


def settings_data(value: Any) -> Any:
    """A settings dataclass as the YAML data :func:`read_settings` reads back into an equal one: every
    setting (defaults included), paths absolute as they were resolved, parsed values in the form
    their parser reads (``str``), tuples as lists; fields the caller fills (``yaml=False``) left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f for f in dataclasses.fields(value) if f.metadata.get("yaml", True)]
        return {f.name: _plain(getattr(value, f.name), f.metadata.get("parse") is not None) for f in fields}
    return _plain(value, False)


def _plain(value: Any, parsed: bool) -> Any:
    if parsed:
        return None if value is None else str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return settings_data(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, False) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v, False) for k, v in value.items()}
    return value
