"""Secrets at rest: a model field that stores its value encrypted (Fernet).

The key comes from the environment: ``MCPTASKS_SECRETS_KEY`` (a Fernet key, generate one with
``python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"``),
or, when unset, one derived from ``SECRET_KEY``. Several keys, comma-separated, allow rotation:
the first encrypts, all decrypt.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.db import models

PREFIX = "enc1:"


def _fernet() -> MultiFernet:
    raw = str(getattr(settings, "SECRETS_KEY", "") or "")
    keys = [k.strip() for k in raw.split(",") if k.strip()]
    if not keys:
        derived = hashlib.sha256(b"mcptasks-secrets:" + str(settings.SECRET_KEY).encode()).digest()
        keys = [base64.urlsafe_b64encode(derived).decode()]
    return MultiFernet([Fernet(k.encode()) for k in keys])


def encrypt(value: str) -> str:
    """``value`` encrypted, with the version prefix ("" stays "")."""
    if not value or value.startswith(PREFIX):
        return value
    return PREFIX + _fernet().encrypt(value.encode()).decode()


def decrypt(value: str) -> str:
    """The plaintext of a stored value (values stored before encryption are returned as-is)."""
    if not value or not value.startswith(PREFIX):
        return value
    try:
        return _fernet().decrypt(value[len(PREFIX):].encode()).decode()
    except InvalidToken:
        raise ValueError("a stored secret cannot be decrypted: check MCPTASKS_SECRETS_KEY") from None


class EncryptedTextField(models.TextField):
    """A text field stored encrypted; Python code sees the plaintext."""

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        """Decrypt on load."""
        return decrypt(value) if isinstance(value, str) else value

    def get_prep_value(self, value: Any) -> Any:
        """Encrypt on save."""
        value = super().get_prep_value(value)
        return encrypt(value) if isinstance(value, str) else value
