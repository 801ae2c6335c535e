"""Sealing payload texts with a user's data key, and opening them again.

A sealed text is one token: "\\x01" then base64 (standard alphabet, padded) of the data
key's id (8 bytes), a fresh nonce (12) and the AES-256-GCM ciphertext with its tag (16). The
token is plain ASCII, so it fits the text columns a payload already has, and it cannot
be mistaken for stored JSON: JSON text never holds a raw U+0001. That is what lets rows
written before encryption was turned on (plaintext) sit beside sealed ones, and lets a
text the database assembled from many rows (a state's head, messages and tail) be opened
token by token. The associated data names the row (user, conversation, kind and the
row's own key where it has one), so a token moved to another row does not open.
"""

from __future__ import annotations

import binascii
import json
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from agentstate.state_service.domain.errors import CiphertextRejected, DataKeyDestroyed

MARK = "\x01"
KEY_ID_BYTES = 8
NONCE_BYTES = 12
TAG_BYTES = 16
# What a token adds to the text it seals, before base64: key id, nonce, tag.
OVERHEAD_BYTES = KEY_ID_BYTES + NONCE_BYTES + TAG_BYTES
_BASE64_CHARS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="
_NOT_BASE64_CHARS = bytes(c for c in range(256) if c not in _BASE64_CHARS)
# The tokens' base64, decoded in one call: strict (the standard alphabet, padded).
_BLOBS = msgspec.json.Decoder(list[bytes])


@dataclass(frozen=True)
class DataKey:
    """A user's data key, unwrapped: its id (in every token it seals) and its cipher."""

    key_id: bytes
    aead: AESGCM


def data_key(key_id: bytes, raw: bytes) -> DataKey:
    return DataKey(key_id, AESGCM(raw))


def new_data_key() -> tuple[bytes, bytes]:
    """A fresh data key: (its id, its 32 bytes)."""
    return os.urandom(KEY_ID_BYTES), AESGCM.generate_key(bit_length=256)


def associated_data(
    user_id: str, conversation_id: int | str, kind: str, row_key: str = ""
) -> bytes:
    """What a ciphertext is bound to: the row it belongs in."""
    return json.dumps(["agentstate/1", user_id, str(conversation_id), kind, row_key]).encode()


def is_sealed(text: bytes | str | None) -> bool:
    if text is None:
        return False
    return text[:1] in (MARK, b"\x01")


def seal_text(key: DataKey, plaintext: bytes | str, ad: bytes) -> str:
    data = plaintext.encode() if isinstance(plaintext, str) else plaintext
    nonce = os.urandom(NONCE_BYTES)
    blob = key.key_id + nonce + key.aead.encrypt(nonce, data, ad)
    return MARK + binascii.b2a_base64(blob, newline=False).decode()


def seal_bytes(key: DataKey, data: bytes, ad: bytes) -> bytes:
    """Binary values (checkpoints): key id, nonce, ciphertext and tag, no base64 (a
    bytea column says by its type column that it is sealed)."""
    nonce = os.urandom(NONCE_BYTES)
    return key.key_id + nonce + key.aead.encrypt(nonce, data, ad)


def open_token(key: DataKey | None, token: str | bytes, ad: bytes, *, user_id: str) -> bytes:
    """The plaintext of one token (DataKeyDestroyed: the user has no such data key any
    more; CiphertextRejected: it does not authenticate for this row)."""
    body = token[1:]
    try:
        blob = binascii.a2b_base64(body)
    except (binascii.Error, ValueError):
        blob = b""
    return open_bytes(key, blob, ad, user_id=user_id)


def open_bytes(key: DataKey | None, blob: bytes, ad: bytes, *, user_id: str) -> bytes:
    """The plaintext of a sealed binary value (as open_token)."""
    if len(blob) < OVERHEAD_BYTES:
        raise CiphertextRejected(
            f"a stored ciphertext of user {user_id!r} is truncated or not a ciphertext"
        )
    key_id = blob[:KEY_ID_BYTES]
    if key is None or key.key_id != key_id:
        raise DataKeyDestroyed(
            f"this data of user {user_id!r} was sealed with a data key the user no longer "
            "has (destroyed when the user was erased: crypto-shredding); it cannot be read"
        )
    nonce = blob[KEY_ID_BYTES : KEY_ID_BYTES + NONCE_BYTES]
    try:
        return key.aead.decrypt(nonce, blob[KEY_ID_BYTES + NONCE_BYTES :], ad)
    except InvalidTag:
        raise CiphertextRejected(
            f"a stored ciphertext of user {user_id!r} does not authenticate for the row it "
            "is in: it was altered or moved from another row; nothing was returned"
        ) from None


def open_all(key: DataKey | None, text: bytes, ad: bytes, *, user_id: str) -> bytes:
    """`text` with every token in it opened with `key`, all bound to `ad` (the hot path
    of a state read: one token per message). Errors as open_token.

    The fast path finds each token's end from the right of its part (a token is
    followed by a few bytes of JSON punctuation, its part's base64 by none), decodes all
    the tokens' base64 in one C call (msgspec, strict: only the standard alphabet with
    its padding) and opens each blob. Anything it cannot vouch for (a token followed by
    plaintext, bad base64, a blob that does not authenticate) sends the whole text to
    the exact path, token by token, which says which and why."""
    if key is None or b"\x01" not in text:
        return open_text(text, lambda body: open_token(key, b"\x01" + body, ad, user_id=user_id))
    opened = _open_all_fast(key, text, ad)
    if opened is not None:
        return opened
    return _open_all_exact(key, text, ad, user_id=user_id)


def _open_all_fast(key: DataKey, text: bytes, ad: bytes) -> bytes | None:
    """open_all's fast path: the opened text, or None (the exact path decides)."""
    parts = text.split(b"\x01")
    bodies: list[bytes] = []
    rests: list[bytes] = []
    for part in parts[1:]:
        body = part.rstrip(_NOT_BASE64_CHARS)  # a token's base64 then what follows it
        bodies.append(body)
        rests.append(part[len(body) :])
    # A body taken this way is the token's whole base64 exactly when it holds only
    # base64 bytes (the byte after a token's base64 is not one): msgspec refuses any
    # other byte inside a string, and a quote or a backslash would change the strings.
    everything = b"".join(bodies)
    if b'"' in everything or b"\\" in everything:
        return None
    try:
        blobs = _BLOBS.decode(b'["' + b'","'.join(bodies) + b'"]')
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    if len(blobs) != len(bodies):
        return None
    key_id = key.key_id
    decrypt = key.aead.decrypt
    start, nonce_end = KEY_ID_BYTES, KEY_ID_BYTES + NONCE_BYTES
    out = [parts[0]]
    try:
        for blob, rest in zip(blobs, rests, strict=True):
            if len(blob) < OVERHEAD_BYTES or blob[:start] != key_id:
                return None
            out.append(decrypt(blob[start:nonce_end], blob[nonce_end:], ad))
            out.append(rest)
    except InvalidTag:
        return None
    return b"".join(out)


def _open_all_exact(key: DataKey, text: bytes, ad: bytes, *, user_id: str) -> bytes:
    """open_all token by token, each ending at its first non-base64 byte."""
    key_id = key.key_id
    decrypt = key.aead.decrypt
    a2b = binascii.a2b_base64
    start, nonce_end = KEY_ID_BYTES, KEY_ID_BYTES + NONCE_BYTES

    def opener(body: bytes) -> bytes:
        blob = a2b(body)
        if blob[:start] != key_id:
            raise ValueError
        view = memoryview(blob)
        return decrypt(view[start:nonce_end], view[nonce_end:], ad)

    try:
        return open_text(text, opener)
    except (InvalidTag, ValueError, binascii.Error):
        # Which token, and why: the slow path says it (DataKeyDestroyed, CiphertextRejected).
        return open_text(text, lambda body: open_token(key, b"\x01" + body, ad, user_id=user_id))


def open_text(text: bytes, opener: Callable[[bytes], bytes]) -> bytes:
    """`text` with every token in it replaced by its plaintext (text without a token is
    returned as it is, without a copy). `opener` gets each token's base64."""
    if b"\x01" not in text:
        return text
    parts = text.split(b"\x01")
    out = [parts[0]]
    for part in parts[1:]:
        rest = part.lstrip(_BASE64_CHARS)  # a token ends at its first non-base64 byte
        out.append(opener(part[: len(part) - len(rest)]))
        out.append(rest)
    return b"".join(out)


class DataKeyCache:
    """Unwrapped data keys by user: at most `size`, each for `ttl` seconds (so another
    replica's erasure or rotation is seen within the TTL)."""

    def __init__(self, size: int = 10_000, ttl: float = 300.0) -> None:
        self._size = size
        self._ttl = ttl
        self._keys: OrderedDict[str, tuple[float, DataKey]] = OrderedDict()

    def get(self, user_id: str) -> DataKey | None:
        found = self._keys.get(user_id)
        if found is None:
            return None
        expires, key = found
        if expires < time.monotonic():
            del self._keys[user_id]
            return None
        self._keys.move_to_end(user_id)
        return key

    def put(self, user_id: str, key: DataKey) -> None:
        self._keys[user_id] = (time.monotonic() + self._ttl, key)
        self._keys.move_to_end(user_id)
        while len(self._keys) > self._size:
            self._keys.popitem(last=False)

    def drop(self, user_id: str) -> None:
        self._keys.pop(user_id, None)

    def clear(self) -> None:
        self._keys.clear()

    def __len__(self) -> int:
        return len(self._keys)
