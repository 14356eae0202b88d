"""API keys: which tenant a request belongs to, decided by its key alone.

The tenant is never read from the request body (`user`, headers, model name): a client can only
act as the tenant its key maps to, and every cache key is built from that tenant, so one tenant
can neither read nor invalidate another's entries.

Keys are compared in constant time (`hmac.compare_digest`) against every configured key, without
stopping at the first match, so response time says nothing about how much of a key was right.
Rejected: a dict lookup by key (hashing plus an early-exit string compare on collision) — fast,
but its timing depends on the secret; hashing the key first would fix that at the same cost as
the scan for the few hundred keys a gateway holds.
"""

from __future__ import annotations

import hmac
import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MAX_TENANT_CHARS = 64  # data_contracts.RequestLog.tenant


class KeyFileError(ValueError):
    """A key file or mapping that cannot be used; the message is one line saying why."""


@dataclass(frozen=True)
class Principal:
    """Who is calling: a tenant (`tenant` set) or an administrator (`admin` True)."""

    tenant: str | None
    admin: bool = False


class KeyRing:
    """API key -> tenant, and the admin keys; immutable once built."""

    def __init__(self, keys: Mapping[str, str], admin_keys: Sequence[str] = ()) -> None:
        for key, tenant in keys.items():
            if not key or not isinstance(tenant, str) or not 1 <= len(tenant) <= MAX_TENANT_CHARS:
                raise KeyFileError(
                    f"every key needs a tenant of 1 to {MAX_TENANT_CHARS} characters"
                    f" (bad entry for tenant {tenant!r})"
                )
        shared = set(keys) & set(admin_keys)
        if shared:
            raise KeyFileError(f"{len(shared)} key(s) are both a tenant key and an admin key")
        if any(not key for key in admin_keys):
            raise KeyFileError("an admin key must not be empty")
        self._tenants = [(key.encode(), tenant) for key, tenant in keys.items()]
        self._admins = [key.encode() for key in admin_keys]

    @property
    def tenants(self) -> set[str]:
        return {tenant for _, tenant in self._tenants}

    def identify(self, presented: str | None) -> Principal | None:
        """The principal a key belongs to, or None for a missing or unknown key."""
        if not presented:
            return None
        given = presented.encode()
        tenant, admin = None, False
        for key, owner in self._tenants:  # no early exit: constant time in the secret
            if hmac.compare_digest(key, given):
                tenant = owner
        for key in self._admins:
            if hmac.compare_digest(key, given):
                admin = True
        if tenant is None and not admin:
            return None
        return Principal(tenant, admin)

    @classmethod
    def load(
        cls,
        path: Path | None = None,
        keys: Mapping[str, str] | None = None,
        admin_keys: Sequence[str] = (),
    ) -> KeyRing:
        """The file's keys (if any) merged with `keys` / `admin_keys` (from the environment).

        File formats: JSON `{"keys": {"<key>": "<tenant>"}, "admin_keys": ["<key>"]}` or the
        same in TOML (`admin_keys = [...]` and a `[keys]` table).

        Raises:
            KeyFileError: unreadable file, wrong shape, or a key mapped to two tenants.
        """
        merged: dict[str, str] = {}
        admins = list(admin_keys)
        if path is not None:
            file_keys, file_admins = _read_key_file(path)
            merged.update(file_keys)
            admins += file_admins
        for key, tenant in (keys or {}).items():
            if merged.get(key, tenant) != tenant:
                raise KeyFileError("one API key is mapped to two tenants (file and environment)")
            merged[key] = tenant
        if not merged:
            raise KeyFileError("no API keys: give a key file (--keys) or set PREHEAT_GATEWAY_KEYS")
        return cls(merged, list(dict.fromkeys(admins)))


def _read_key_file(path: Path) -> tuple[dict[str, str], list[str]]:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise KeyFileError(f"cannot read key file {path}: {error.strerror or error}") from None
    try:
        data = tomllib.loads(text) if Path(path).suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise KeyFileError(f"key file {path} is not valid JSON/TOML: {reason}") from None
    if not isinstance(data, dict) or set(data) - {"keys", "admin_keys"}:
        raise KeyFileError(f"key file {path}: expected only 'keys' and 'admin_keys' at the top")
    keys, admins = data.get("keys", {}), data.get("admin_keys", [])
    if not isinstance(keys, dict) or not all(isinstance(k, str) for k in keys):
        raise KeyFileError(f"key file {path}: 'keys' must map API keys to tenant names")
    if not isinstance(admins, list) or not all(isinstance(k, str) for k in admins):
        raise KeyFileError(f"key file {path}: 'admin_keys' must be a list of strings")
    return keys, admins


def bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (the scheme is case-insensitive)."""
    if not authorization:
        return None
    scheme, _, key = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None
