"""One typed definition per setting, read from the environment by one loop, documented from code.

An app declares its settings as a frozen dataclass whose fields carry the type, the default and
a one-line description (:func:`setting`). ``settings.py`` fills the app's settings dict with
:func:`read_env` (only the variables that are set: defaults live in the dataclass alone), the app
reads a cached instance through a :class:`Loader`, which is rebuilt when tests change the dict
(``setting_changed``), and ``docs/settings.md`` is generated from the same fields
(:func:`markdown_rows`). Used by ``tenants.conf`` and ``mcptasks.conf``.
"""

from __future__ import annotations

import os
import typing
from dataclasses import MISSING, Field, field, fields
from typing import Any, Generic, TypeVar

ENV_PREFIX = "MCPTASKS_"

T = TypeVar("T")


def setting(default: Any, doc: str, *, env: str | None = None, shown: str | None = None) -> Any:
    """A settings field: its default, what it means, and (rarely) another variable name.

    ``shown`` replaces the default in the docs when the literal would mislead (e.g. "derived").
    """
    return field(default=default, metadata={"doc": doc, "env": env, "shown": shown})


def env_name(f: Field[Any]) -> str:
    """The environment variable of a field: ``MCPTASKS_<NAME>`` unless it names another."""
    return str(f.metadata.get("env") or ENV_PREFIX + f.name)


def _cast(raw: str, kind: Any, name: str) -> Any:
    text = raw.strip()
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off", ""):
            return False
        raise ValueError(f"{name}: expected a boolean (1/0, true/false), got {raw!r}")
    if kind is int:
        return int(text.replace("_", ""))
    if kind is float:
        return float(text)
    if typing.get_origin(kind) is tuple:
        return tuple(p.strip() for p in text.split(",") if p.strip())
    return raw


def read_env(cls: type[Any], environ: typing.Mapping[str, str] | None = None) -> dict[str, Any]:
    """The values of ``cls``'s settings that the environment sets, typed; nothing else.

    Raises ``ValueError`` naming the variable when a value does not parse.
    """
    source = os.environ if environ is None else environ
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in fields(cls):
        name = env_name(f)
        if name in source:
            try:
                out[f.name] = _cast(source[name], hints[f.name], name)
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
    return out


def variables(cls: type[Any]) -> list[str]:
    """Every environment variable ``cls`` reads."""
    return [env_name(f) for f in fields(cls)]


def _shown(f: Field[Any]) -> str:
    if f.metadata.get("shown"):
        return str(f.metadata["shown"])
    value = f.default if f.default is not MISSING else None
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if value in ("", ()):
        return "empty"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"`{value}`"


def markdown_rows(cls: type[Any]) -> list[str]:
    """``| `VARIABLE` | default | meaning |`` for each setting of ``cls``, in declaration order."""
    return [f"| `{env_name(f)}` | {_shown(f)} | {f.metadata.get('doc', '')} |" for f in fields(cls)]


class Loader(Generic[T]):
    """A cached settings instance, built from ``settings.<name>`` (a dict) over the defaults."""

    def __init__(self, cls: type[T], setting_name: str) -> None:
        from django.core.signals import setting_changed

        self.cls = cls
        self.setting_name = setting_name
        self._cached: T | None = None
        setting_changed.connect(self._on_setting_changed, weak=False)

    def get(self) -> T:
        """The current settings (cached; rebuilt after :meth:`reset`)."""
        cached = self._cached
        if cached is None:
            cached = self._cached = self._build()
        return cached

    def reset(self, **_: Any) -> None:
        """Forget the cached instance (connected to ``setting_changed``)."""
        self._cached = None

    def _on_setting_changed(self, *, setting: str, **_: Any) -> None:
        if setting == self.setting_name:
            self.reset()

    def unknown_keys(self) -> list[str]:
        """Keys of the settings dict that name no setting (typos, removed settings)."""
        from django.conf import settings

        known = {f.name for f in fields(self.cls)}  # type: ignore[arg-type]
        return sorted(k for k in getattr(settings, self.setting_name, {}) if k not in known)

    def _build(self) -> T:
        from django.conf import settings

        raw: dict[str, Any] = getattr(settings, self.setting_name, {})
        known = {f.name for f in fields(self.cls)}  # type: ignore[arg-type]
        values = {k: (tuple(v) if isinstance(v, list) else v) for k, v in raw.items() if k in known}
        return self.cls(**values)
