"""Render the model repository for a profile: copy it and fill each `config.pbtxt.tmpl`.

Placeholders are `${name}` (string.Template); a placeholder without a value is an error.
"""
from __future__ import annotations

import shutil
import string
from pathlib import Path

from backends.serving.profiles import Profile

TEMPLATE_NAME = "config.pbtxt.tmpl"


def render_template(text: str, values: dict[str, str]) -> str:
    try:
        return string.Template(text).substitute(values)
    except KeyError as exc:
        raise ValueError(f"config template needs variable {exc.args[0]!r}, which the profile lacks") from exc


def render_repository(source: Path, dest: Path, profile: Profile) -> Path:
    """Copy `source` to `dest` (replacing it) with every template rendered for `profile`."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    values = profile.template_vars()
    for template in sorted(dest.glob(f"*/{TEMPLATE_NAME}")):
        rendered = render_template(template.read_text(), values)
        (template.parent / "config.pbtxt").write_text(rendered)
        template.unlink()
    return dest


def committed_config_is_current(source: Path, profile: Profile) -> list[str]:
    """Names of models whose committed config.pbtxt differs from the rendered template."""
    stale = []
    values = profile.template_vars()
    for template in sorted(source.glob(f"*/{TEMPLATE_NAME}")):
        committed = template.parent / "config.pbtxt"
        if not committed.exists() or committed.read_text() != render_template(template.read_text(), values):
            stale.append(template.parent.name)
    return stale
