"""The key-encryption keys (KEKs): a small seam (`Kms`) and the file implementation.

A KEK never leaves this module; the data keys it wraps are stored wrapped (by the store).
The file holds several KEKs by id so that a new one can become primary while data keys
wrapped by the old one still unwrap (rotation: `agentstate-state rotate-keys` rewraps
them, then the old id can be removed from the file). The file is read again when it
changes, so a rotation needs no restart.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agentstate.state_service.domain.errors import (
    CiphertextRejected,
    DataKeyDestroyed,
    EncryptionKeyUnavailable,
)

NONCE_BYTES = 12  # 96 bits, fresh from os.urandom for every ciphertext


class KmsConfigError(ValueError):
    """The key file (or the erased-keys ledger) cannot be used; the message says why."""


@dataclass(frozen=True)
class WrappedKey:
    """A data key as stored: the id of the KEK that wrapped it and the wrapped bytes."""

    kek_id: str
    wrapped: bytes


class Kms(Protocol):
    """What the state service asks of whatever holds its KEKs. A KMS (Vault transit, a
    cloud KMS) implements the same four calls; nothing else in the service sees a KEK."""

    def primary_id(self) -> str:
        """The KEK id new data keys (and rotated ones) are wrapped with."""
        ...

    def wrap(self, *, user_id: str, key_id: bytes, data_key: bytes) -> WrappedKey:
        """Wrap a data key with the primary KEK, bound to its user and key id."""
        ...

    def unwrap(self, *, user_id: str, key_id: bytes, wrapped: WrappedKey) -> bytes:
        """The data key (EncryptionKeyUnavailable: unknown KEK id; CiphertextRejected:
        the wrapped key does not authenticate; DataKeyDestroyed: erased)."""
        ...

    def destroy(self, *, key_id: bytes) -> None:
        """Record that the data key `key_id` was destroyed (its user erased), so that a
        copy of it in a database restored from an older backup is refused too."""
        ...


def _wrap_ad(user_id: str, key_id: bytes, kek_id: str) -> bytes:
    return json.dumps(["agentstate-data-key/1", user_id, key_id.hex(), kek_id]).encode()


class FileKms:
    """KEKs from a JSON file: {"primary": ID, "keys": {ID: base64 of 32 bytes, ...}}.

    `erased_file` (optional) is the ledger of destroyed data key ids, one hex id a line,
    appended by erasures; a data key listed there is refused even when a restored
    database still holds it wrapped."""

    def __init__(self, key_file: str | Path, erased_file: str | Path | None = None) -> None:
        self._path = Path(key_file)
        self._erased_path = Path(erased_file) if erased_file else None
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._primary = ""
        self._keys: dict[str, AESGCM] = {}
        self._erased_stamp: tuple[int, int] | None = None
        self._erased: set[str] = set()
        self._load()
        self._check_erased_writable()
        self._load_erased()

    # ------------------------------------------------------------------ loading

    def _load(self) -> None:
        try:
            stat = self._path.stat()
        except OSError as exc:
            raise KmsConfigError(f"cannot read the key file {self._path}: {exc.strerror}") from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp == self._stamp:
            return
        try:
            document = json.loads(self._path.read_bytes())
        except (OSError, ValueError) as exc:
            raise KmsConfigError(f"the key file {self._path} is not JSON: {exc}") from None
        if not isinstance(document, dict) or not isinstance(document.get("keys"), dict):
            raise KmsConfigError(
                f'the key file {self._path} must be {{"primary": ID, "keys": {{ID: KEY}}}}'
            )
        keys: dict[str, AESGCM] = {}
        for kek_id, text in document["keys"].items():
            try:
                raw = base64.b64decode(str(text), validate=True)
            except (binascii.Error, ValueError):
                raise KmsConfigError(
                    f"the key file {self._path}: key {kek_id!r} is not base64"
                ) from None
            if len(raw) != 32:
                raise KmsConfigError(
                    f"the key file {self._path}: key {kek_id!r} is {len(raw)} bytes, "
                    "a KEK is 32 (AES-256)"
                )
            keys[str(kek_id)] = AESGCM(raw)
        primary = document.get("primary")
        if not isinstance(primary, str) or primary not in keys:
            raise KmsConfigError(
                f"the key file {self._path}: primary {primary!r} is not one of its keys "
                f"({', '.join(sorted(keys)) or 'none'})"
            )
        self._keys, self._primary, self._stamp = keys, primary, stamp

    def _refresh(self) -> None:
        """Read the file again if it changed; a file that no longer loads keeps the
        previous keys in service (a half-written file during a rotation)."""
        with self._lock:
            try:
                self._load()
            except KmsConfigError:
                if not self._keys:
                    raise

    def _check_erased_writable(self) -> None:
        """An erase appends to the ledger after the data is gone: a ledger it cannot
        write would leave a restored backup readable, so it stops the start instead."""
        if self._erased_path is None:
            return
        try:
            os.close(os.open(self._erased_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
        except OSError as exc:
            raise KmsConfigError(
                f"cannot append to the erased-keys file {self._erased_path}: {exc.strerror}"
            ) from None

    def _load_erased(self) -> None:
        if self._erased_path is None:
            return
        try:
            stat = self._erased_path.stat()
        except FileNotFoundError:
            self._erased = set()
            return
        except OSError as exc:
            raise KmsConfigError(
                f"cannot read the erased-keys file {self._erased_path}: {exc.strerror}"
            ) from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        if stamp != self._erased_stamp:
            lines = self._erased_path.read_text().split()
            self._erased, self._erased_stamp = set(lines), stamp

    # ------------------------------------------------------------------ the seam

    def primary_id(self) -> str:
        self._refresh()
        return self._primary

    def kek_ids(self) -> list[str]:
        self._refresh()
        return sorted(self._keys)

    def wrap(self, *, user_id: str, key_id: bytes, data_key: bytes) -> WrappedKey:
        self._refresh()
        kek_id = self._primary
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._keys[kek_id].encrypt(nonce, data_key, _wrap_ad(user_id, key_id, kek_id))
        return WrappedKey(kek_id, nonce + sealed)

    def unwrap(self, *, user_id: str, key_id: bytes, wrapped: WrappedKey) -> bytes:
        self._refresh()
        with self._lock:
            self._load_erased()
            if key_id.hex() in self._erased:
                raise DataKeyDestroyed(
                    f"the data key of user {user_id!r} was destroyed when the user was erased "
                    "(crypto-shredding): this data cannot be read"
                )
        kek = self._keys.get(wrapped.kek_id)
        if kek is None:
            raise EncryptionKeyUnavailable(
                f"the data key of user {user_id!r} is wrapped by key-encryption key "
                f"{wrapped.kek_id!r}, which STATE_ENCRYPTION_KEY_FILE does not hold (it has "
                f"{', '.join(sorted(self._keys))}): put that key back in the file"
            )
        blob = wrapped.wrapped
        try:
            return kek.decrypt(
                blob[:NONCE_BYTES], blob[NONCE_BYTES:], _wrap_ad(user_id, key_id, wrapped.kek_id)
            )
        except InvalidTag:
            raise CiphertextRejected(
                f"the stored data key of user {user_id!r} does not authenticate under "
                f"key-encryption key {wrapped.kek_id!r}: it was altered or belongs to "
                "another user"
            ) from None

    def destroy(self, *, key_id: bytes) -> None:
        if self._erased_path is None:
            return
        with self._lock:
            # O_APPEND: several replicas sharing the file each add whole lines.
            fd = os.open(self._erased_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (key_id.hex() + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)
            self._erased.add(key_id.hex())


def new_kek() -> str:
    """A fresh KEK as the key file spells it (base64 of 32 random bytes)."""
    return base64.b64encode(os.urandom(32)).decode()
