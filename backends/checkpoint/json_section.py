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

    def get_or_null(self, key: str, kind: type, default: Any, if_null: Any) -> Any:
        """Like `get` with a default, and `if_null` where the file holds an explicit null."""
        if key in self.data and self.data[key] is None:
            return if_null
        return self.get(key, kind, default)

    def section(self, key: str) -> JsonSection:
        value = self.get(key, dict)
        return JsonSection(value, f"{self.path}{key}.")

    def optional_section(self, key: str) -> JsonSection:
        """The nested object at `key`; absent or null reads as empty (every key defaulted)."""
        if self.data.get(key) is None:
            return JsonSection({}, f"{self.path}{key}.")
        return self.section(key)


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
