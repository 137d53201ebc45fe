"""Reading configs: strict YAML, typed values, dotted overrides, and back to plain dicts and files.

Unknown keys, wrong types and YAML mistakes raise :class:`ConfigError` with one line that names the
file (or the ``--set``), the key and what to change; values then go through :func:`validate`.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import math
import os
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from transformer_mt.config.checks import CHOICES, ConfigError, quote, validate
from transformer_mt.config.sections import Config

_SECTION_TYPES = get_type_hints(Config)
MAX_CONFIG_BYTES = (
    1 << 20
)  # a config states a few dozen values; a larger file is not one (and YAML parsing grows with it)
MAX_INT = (1 << 63) - 1  # every integer setting is a count, a size or an id: anything beyond int64 is a mistake


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping with the same key twice (PyYAML silently keeps the last), a key that
    is a list or a mapping, and a value its constructors cannot build (an integer of more digits than Python reads,
    the 13th month), each naming its line."""

    def construct_mapping(self, node, deep=False):  # PyYAML's signature
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if isinstance(key, (list, dict)):
                what = "a list" if isinstance(key, list) else "a mapping"  # built empty here (filled later): say which
                raise ConfigError(f"line {line}: a key must be a name, not {what}; write key: value")
            if key in seen:
                raise ConfigError(f"line {line}: key {quote(key)} appears twice in one section; keep one of them")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node, deep=False):  # PyYAML's signature
        try:
            return super().construct_object(node, deep=deep)
        except ConfigError:
            raise
        except (ValueError, OverflowError) as exc:  # int() past sys.get_int_max_str_digits(), date(2001, 13, 45), ...
            value = node.value if isinstance(node.value, str) else node.tag
            raise ConfigError(
                f"line {node.start_mark.line + 1}: {quote(value)} cannot be read ({quote(str(exc), 80)}); "
                "give a plain number or quote it as a string"
            ) from None


def _read_yaml(path: Path) -> Any:
    """Parse a YAML config file strictly: syntax errors and duplicate keys name the file and the line."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path.stat().st_size:,} bytes, more than a config holds ({MAX_CONFIG_BYTES:,} at most); "
                "give the YAML config file"
            )
        return yaml.load(
            path.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader
        )  # safe: _UniqueKeyLoader is a SafeLoader
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not valid UTF-8 (byte {exc.start}); save the config as UTF-8") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark else ""
        raise ConfigError(
            f"{path}:{line} is not valid YAML ({quote(str(getattr(exc, 'problem', exc)), 120)}); fix the syntax"
        ) from None
    except RecursionError:  # PyYAML composes nested collections recursively
        raise ConfigError(
            f"{path}: nested too deeply to be a config (sections hold key: value pairs); fix the file"
        ) from None


def _override_value(dotted: str, text: str) -> Any:
    """The YAML value of one ``--set section.key=value``; a syntax error names the override."""
    if not text.strip():
        return ""
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError, ValueError) as exc:
        problem = quote(str(getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]), 120)
        raise ConfigError(
            f"--set {dotted}={text}: the value is not valid YAML ({problem}); "
            f"quote strings, e.g. --set '{dotted}=\"...\"', and close lists, e.g. [0.9, 0.98]"
        ) from None


def _suggest(name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5) if len(name) <= 100 else []
    if close:
        return f"did you mean '{close[0]}'?"
    listed = ", ".join(valid)
    if len(listed) <= 300:
        return "valid keys: " + listed
    # a section of many keys (train): the message stays one readable line, the rest is in the docs
    return f"valid keys include: {listed[:240].rsplit(', ', 1)[0]}, ... (docs/configuration.md lists all {len(valid)})"


def _coerce_bool(value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise ConfigError(f"{where}: expected true or false, got {quote(value)}")


def _coerce_int(value: Any, where: str) -> int:
    number: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = int(value)  # exact: 99999999999999999999999 is not rounded through a float
        except ValueError:
            number = _integral(value)
    elif isinstance(value, float):
        number = _integral(value)
    if number is None:
        raise ConfigError(f"{where}: expected an integer, got {quote(value)}")
    if abs(number) > MAX_INT:
        raise ConfigError(f"{where}: {quote(value)} is out of range; give a value of at most {MAX_INT}")
    return number


def _integral(value: float | str) -> int | None:
    """The integer a float (or its text) is, e.g. 4e3 -> 4000; None when it is not one."""
    try:
        as_float = float(value)
    except (ValueError, OverflowError):
        return None
    return int(as_float) if math.isfinite(as_float) and as_float.is_integer() else None


def _coerce_float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ConfigError(f"{where}: expected a number, got {quote(value)}")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise ConfigError(f"{where}: expected a number, got {quote(value)}") from None
    if not math.isfinite(number):  # NaN passes every `<` check, and a NaN learning rate trains nothing
        raise ConfigError(f"{where}: expected a finite number, got {quote(value)}")
    return number


def _coerce_str(value: Any, where: str) -> str:
    # YAML reads some unquoted words as numbers, booleans or dates (a path named 2024-01-01): their text is meant.
    if not isinstance(value, (str, int, float, bool, datetime.date, type(None))) or (
        isinstance(value, int) and abs(value) > MAX_INT
    ):
        raise ConfigError(f"{where}: expected a string, got {quote(value)}")
    return "" if value is None else str(value)


_SCALARS = {bool: _coerce_bool, int: _coerce_int, float: _coerce_float, str: _coerce_str}


def _coerce(value: Any, typ: Any, where: str) -> Any:
    """Convert a YAML (or override) value to the field's type or raise ConfigError."""
    if typ is str and isinstance(value, bool) and "off" in CHOICES.get(_dotted(where), ()):
        return ("on" if value else "off") if value is False or "on" in CHOICES[_dotted(where)] else str(value)
    if typ in _SCALARS:
        return _SCALARS[typ](value, where)
    if dataclasses.is_dataclass(typ):
        return _coerce_record(value, typ, where)
    if getattr(typ, "__origin__", None) is list:
        (item,) = typ.__args__
        if value is None:
            return []
        if item is str and isinstance(value, str):  # a list of names as one comma string: "q,v", as --set takes it
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, list):
            what = f"{_record_keys(item)} entries" if dataclasses.is_dataclass(item) else "names (or one comma string)"
            raise ConfigError(f"{where}: expected a list of {what}, got {quote(value)}")
        if len(value) > MAX_RECORDS:
            raise ConfigError(f"{where}: {len(value):,} entries; give at most {MAX_RECORDS}")
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if getattr(typ, "__origin__", None) is tuple:
        args = typ.__args__
        if isinstance(value, str):  # "0.9,0.98" or "[0.9, 0.98]", as --set takes it; split, never parsed as YAML
            value = [part.strip() for part in value.strip().removeprefix("[").removesuffix("]").split(",")]
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"{where}: expected a list of {len(args)} numbers, got {quote(value)}")
        return tuple(_coerce(v, t, where) for v, t in zip(value, args))
    raise ConfigError(f"{where}: unsupported type {typ}")  # pragma: no cover - a programming error


def _dotted(where: str) -> str:
    """The key a message prefix names: "x.yaml: train.compile" -> "train.compile"."""
    return where.rsplit(": ", 1)[-1]


MAX_RECORDS = 10_000  # entries of a list key such as data.corpora: far past any real run, short of a list bomb


def _record_keys(typ: Any) -> str:
    return "{" + ", ".join(f.name for f in dataclasses.fields(typ)) + "}"


def _coerce_record(value: Any, typ: Any, where: str) -> Any:
    """A nested mapping (data.filters, one entry of data.corpora) as its dataclass, each key typed and named."""
    if isinstance(value, typ):
        return value
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping {_record_keys(typ)}, got {quote(value)}")
    record = typ()
    hints = get_type_hints(typ)
    for key, item in value.items():
        name = _name(key)
        if name not in hints:
            raise ConfigError(f"{where}: unknown key {quote(name)}; {_suggest(name, list(hints))}")
        setattr(record, name, _coerce(item, hints[name], f"{where}.{name}"))
    return record


def _apply(cfg: Config, section: str, key: str, value: Any, source: str) -> None:
    if section not in _SECTION_TYPES:
        raise ConfigError(f"{source}: unknown section {quote(section)}; {_suggest(section, list(_SECTION_TYPES))}")
    sub = getattr(cfg, section)
    key, _, rest = key.partition(".")  # --set data.filters.langid=true reaches into a nested mapping
    hints = get_type_hints(type(sub))
    if key not in hints:
        raise ConfigError(f"{source}: unknown key {quote(f'{section}.{key}')}; {_suggest(key, list(hints))}")
    where = f"{source}: {section}.{key}"
    if rest:
        if not dataclasses.is_dataclass(hints[key]):
            raise ConfigError(f"{where}: has no keys inside it; drop {quote('.' + rest)}")
        value = {**dataclasses.asdict(getattr(sub, key)), rest: value}
    setattr(sub, key, _coerce(value, hints[key], where))


def _name(key: Any) -> str:
    """A section or key name for lookups and messages: a name is a string; anything else (a number, a tuple from a
    checkpoint) is shown short, and then matches no section or key."""
    return key if isinstance(key, str) else quote(key, 40)


def _apply_sections(cfg: Config, raw: Any, source: str, *, empty_sections: bool) -> None:
    """Set every ``section: {key: value}`` of ``raw`` (a YAML file's or a checkpoint's ``config``) on ``cfg``, typed
    and named as :func:`_apply` does. ``empty_sections``: a section left empty (None) keeps its defaults, as a YAML
    file may state; a checkpoint's config always has all of them."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: expected a mapping of sections (data, tokenizer, model, train, decode) at the top, "
            f"got {quote(raw)}"
        )
    for section, values in raw.items():
        name = _name(section)
        if name not in _SECTION_TYPES:
            raise ConfigError(f"{source}: unknown section {quote(name)}; {_suggest(name, list(_SECTION_TYPES))}")
        if values is None and empty_sections:
            continue
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: {name}: expected a mapping of key: value, got {quote(values)}")
        for key, value in values.items():
            _apply(cfg, name, _name(key), value, source)


def load_config(
    path: str | os.PathLike | None = None, overrides: list[str] | None = None, *, check_files: bool = True
) -> Config:
    """Read a YAML config (or start from the defaults), apply ``section.key=value`` overrides, validate.

    Relative data and tokenizer paths are resolved against the current directory, as users type them.
    """
    cfg = Config()
    if path is not None:
        if not str(path).strip():
            raise ConfigError(
                "--config: the path is empty; give a YAML file, e.g. --config configs/multi30k_small.yaml"
            )
        path = Path(path)
        if path.is_dir():
            raise ConfigError(
                f"{path}: is a directory, not a config file; "
                f"give a YAML file (to continue a run directory use --resume {path})"
            )
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found; check the path given to --config")
        _apply_sections(cfg, _read_yaml(path) or {}, str(path), empty_sections=True)
    for item in overrides or []:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"--set {quote(item)}: expected section.key=value, e.g. model.encoder_layers=3")
        dotted, value = item.split("=", 1)
        section, key = dotted.strip().split(".", 1)
        _apply(cfg, section, key, _override_value(dotted.strip(), value), f"--set {dotted.strip()}")
    validate(cfg, source=str(path) if path is not None else "config", check_files=check_files)
    return cfg


def stated_keys(path: str | os.PathLike | None, overrides: list[str] | None = None) -> dict[str, str]:
    """The ``section.key`` names a config file and its overrides state, each with where (the file, or ``--set``):
    what the user asked for, as opposed to the defaults (the file was read by :func:`load_config` already)."""
    stated: dict[str, str] = {}
    raw = _read_yaml(Path(path)) if path is not None else None
    for section, values in (raw or {}).items():
        for key in values or {}:
            stated[f"{section}.{key}"] = str(path)
    for item in overrides or []:
        dotted = item.split("=", 1)[0].strip()
        stated[dotted] = f"--set {dotted}"
    return stated


def to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """Plain nested dict (tuples as lists) for YAML files and checkpoints."""
    out = dataclasses.asdict(cfg)
    for section in out.values():
        for key, value in section.items():
            if isinstance(value, tuple):
                section[key] = list(value)
    return out


def from_dict(raw: dict[str, dict[str, Any]], *, source: str = "checkpoint") -> Config:
    """Inverse of :func:`to_dict`, through the same typed loading and checks as a YAML file (a checkpoint's config
    may come from anyone); checks types and values but not that files still exist."""
    cfg = Config()
    _apply_sections(cfg, raw, source, empty_sections=False)
    validate(cfg, source=source, check_files=False)
    return cfg


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Write the fully resolved config, so a run can be reproduced with `tmt train --config`."""
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
