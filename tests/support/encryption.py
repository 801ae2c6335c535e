"""Encryption at rest in tests: key files and encrypted PostgreSQL stores."""

from __future__ import annotations

import json
from pathlib import Path

from agentstate.state_service.crypto import DataKeyCache, FileKms
from agentstate.state_service.crypto.kms import new_kek
from agentstate.state_service.storage.postgres import PostgresStore
from agentstate.state_service.storage.postgres.encryption import Encryption

# One KEK "k1" for the whole test session: the tests share one database, and some users
# (fixed ids, the app-scoped key of user '') meet in several tests.
SESSION_KEK = new_kek()


def write_key_file(path: Path, keys: dict[str, str] | None = None, primary: str = "k1") -> Path:
    """A KEK file; `keys` None: the session's "k1"."""
    keys = {"k1": SESSION_KEK} if keys is None else keys
    path.write_text(json.dumps({"primary": primary, "keys": keys}))
    return path


def encryption(key_file: Path, erased_file: Path | None = None, ttl: float = 60.0) -> Encryption:
    return Encryption(FileKms(key_file, erased_file), DataKeyCache(size=1000, ttl=ttl))


def encrypted_store(
    database_url: str, key_file: Path, erased_file: Path | None = None, ttl: float = 60.0
) -> PostgresStore:
    return PostgresStore(
        database_url, min_size=1, max_size=30, encryption=encryption(key_file, erased_file, ttl)
    )
