"""Typed reads from one JSON object of config.json, with errors that name the key's path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


class _Missing:
    """Sentinel type: the key has no default and must be present."""


_MISSING = _Missing()


@dataclass(frozen=True, slots=True)
class JsonSection:
    """One JSON object of config.json plus its path, so errors can name the exact key."""

    data: Mapping[str, Any]
    path: str = ""  # "" for the top level, "tts_config." for a nested object

    def get(self, key: str, kind: type, default: Any = _MISSING) -> Any:
        if key not in self.data:
            if isinstance(default, _Missing):
                raise ValueError(f"config.json: missing key '{self.path}{key}'")
            return default
        return _typed(self.data[key], kind, f"{self.path}{key}")

    def section(self, key: str) -> JsonSection:
        value = self.get(key, dict)
        return JsonSection(value, f"{self.path}{key}.")


def _typed(value: Any, kind: type, name: str) -> Any:
    # bool is an int subclass in Python; a JSON `true` where a count belongs is a broken config.
    is_bool = isinstance(value, bool)
    if kind is bool and is_bool:
        return value
    if kind is int and isinstance(value, int) and not is_bool:
        return value
    if kind is float and isinstance(value, (int, float)) and not is_bool:
        return float(value)
    if kind in (str, dict) and isinstance(value, kind):
        return value
    raise ValueError(f"config.json: key '{name}' must be {kind.__name__}, got {value!r}")
