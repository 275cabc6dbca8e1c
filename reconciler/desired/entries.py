"""The managed `.env` entries of a box as plain values, for everything downstream of loading.

Stdlib only: a drift run compares against these (and pickles them between runs) without the
validation models. A secret is only ever its name here; its value is read where it lives.
"""

from __future__ import annotations

from reconciler.records import record_class


@record_class()
class SecretName:
    """A reference to a declared secret (`secrets.<name>` in group_vars), never its value."""

    secret: str


@record_class()
class EnvEntry:
    """One managed `.env` key: its desired value (or a secret name), and the YAML path behind it."""

    key: str
    value: str | SecretName | None  # None: the key must be absent from `.env`
    origin: str  # dotted YAML path that decided the value

    @property
    def is_secret(self) -> bool:
        return isinstance(self.value, SecretName)
