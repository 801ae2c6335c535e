"""Encryption at rest in the PostgreSQL store: where payload texts are sealed on their
way in and opened on their way out, and the table of wrapped data keys (migration 14).

What is sealed is each payload text the store keeps (a state's head, tail, messages and
member values; items; scoped state values; message blocks and metadata; checkpoint
values). Everything the database computes on stays as it was: ids, keys of members,
versions, labels, times, statuses, sizes. The SQL functions move sealed texts as they
moved JSON texts (a delta appends a state's sealed messages, a merge replaces a sealed
value by key), so every guarantee they give (compare-and-set, one transaction, fencing,
no resurrection) holds unchanged. Reads open each token; a text without one (a row
written before encryption was on) is returned as it is.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from agentstate.state_service import domain as d
from agentstate.state_service.crypto import envelope
from agentstate.state_service.crypto.envelope import DataKey, DataKeyCache
from agentstate.state_service.crypto.kms import Kms, WrappedKey
from agentstate.state_service.storage.postgres.codecs import Row

log = logging.getLogger(__name__)

KeyQuery = Callable[[str, dict[str, object]], Awaitable[list[Row]]]


@dataclass
class Encryption:
    """The store's encryption: `kms` None is STATE_ENCRYPTION=off (sealed rows are then
    refused, never returned as ciphertext)."""

    kms: Kms | None
    cache: DataKeyCache

    @property
    def on(self) -> bool:
        return self.kms is not None


OFF = Encryption(None, DataKeyCache(size=0))


class UserKeys:
    """One user's data key for one call: fetched (or created, for a write) at most once."""

    __slots__ = ("_encryption", "_key", "_query", "_user_id")

    def __init__(self, encryption: Encryption, query: KeyQuery, user_id: str) -> None:
        self._encryption = encryption
        self._query = query
        self._user_id = user_id
        self._key: DataKey | None = None

    @property
    def on(self) -> bool:
        return self._encryption.on

    @property
    def user_id(self) -> str:
        return self._user_id

    async def for_write(self) -> DataKey:
        """The user's data key, created (wrapped by the primary KEK) if it has none."""
        if self._key is None:
            self._key = await _data_key(self._encryption, self._query, self._user_id, create=True)
        assert self._key is not None
        return self._key

    async def for_read(self, *texts: bytes | str | None) -> DataKey | None:
        """The key when one of `texts` holds a token (None: none does, or the user has no
        key any more; opening a token then says it was destroyed)."""
        if not any(t is not None and _has_token(t) for t in texts):
            return None
        if not self._encryption.on:
            raise d.EncryptionKeyUnavailable(
                f"data of user {self._user_id!r} is stored encrypted, and STATE_ENCRYPTION is "
                "off: turn it on with the key file that sealed it (nothing is returned as "
                "ciphertext)"
            )
        if self._key is None:
            self._key = await _data_key(self._encryption, self._query, self._user_id, create=False)
        return self._key

    # ------------------------------------------------------------------ sealing

    async def seal(self, text: str, ad: bytes) -> str:
        """`text` sealed (encryption is on: check `on` first)."""
        return envelope.seal_text(await self.for_write(), text, ad)

    async def seal_all(self, texts: Sequence[bytes | str], ad: bytes) -> list[str]:
        """Each text sealed (encryption is on: check `on` first)."""
        key = await self.for_write()
        return [envelope.seal_text(key, t, ad) for t in texts]

    async def seal_or_keep(self, texts: Sequence[bytes | None], ad: bytes) -> list[bytes | None]:
        """Each text sealed when encryption is on (as UTF-8 bytes), kept when off; None
        stays None."""
        if not self._encryption.on or not any(t is not None for t in texts):
            return list(texts)
        key = await self.for_write()
        return [None if t is None else envelope.seal_text(key, t, ad).encode() for t in texts]

    # ------------------------------------------------------------------ opening

    async def open(self, text: bytes, ad: bytes) -> bytes:
        """`text` with every token in it opened (bound to `ad`)."""
        if b"\x01" not in text:
            return text
        key = await self.for_read(text)
        return envelope.open_all(key, text, ad, user_id=self._user_id)

    async def open_str(self, text: str, ad: bytes) -> str:
        if "\x01" not in text:
            return text
        return (await self.open(text.encode(), ad)).decode()


def _has_token(text: bytes | str) -> bool:
    return (b"\x01" in text) if isinstance(text, bytes) else ("\x01" in text)


# ------------------------------------------------------------------ the key table

SELECT_USER_KEY = """
SELECT key_id, kek_id, wrapped FROM t_user_key WHERE user_id = %(user_id)s
"""

# ON CONFLICT: two first writes of a user at once keep one key (the loser reads it).
INSERT_USER_KEY = """
INSERT INTO t_user_key (user_id, key_id, kek_id, wrapped)
VALUES (%(user_id)s, %(key_id)s, %(kek_id)s, %(wrapped)s)
ON CONFLICT (user_id) DO NOTHING
RETURNING key_id
"""


async def _data_key(
    encryption: Encryption, query: KeyQuery, user_id: str, *, create: bool
) -> DataKey | None:
    cached = encryption.cache.get(user_id)
    if cached is not None:
        return cached
    kms = encryption.kms
    assert kms is not None
    rows = await query(SELECT_USER_KEY, {"user_id": user_id})
    if not rows and create:
        key_id, raw = envelope.new_data_key()
        wrapped = kms.wrap(user_id=user_id, key_id=key_id, data_key=raw)
        rows = await query(
            INSERT_USER_KEY,
            {
                "user_id": user_id,
                "key_id": key_id,
                "kek_id": wrapped.kek_id,
                "wrapped": wrapped.wrapped,
            },
        )
        if rows:
            key = envelope.data_key(key_id, raw)
            encryption.cache.put(user_id, key)
            return key
        rows = await query(SELECT_USER_KEY, {"user_id": user_id})
    if not rows:
        return None
    row = rows[0]
    key_id = bytes(row["key_id"])
    raw = kms.unwrap(
        user_id=user_id, key_id=key_id, wrapped=WrappedKey(row["kek_id"], bytes(row["wrapped"]))
    )
    key = envelope.data_key(key_id, raw)
    encryption.cache.put(user_id, key)
    return key


# Rotation (agentstate-state rotate-keys): a batch of keys wrapped by another KEK, in
# user order after the last one seen; the rewrap is a compare-and-set on the old wrap,
# so a key erased or rewrapped meanwhile is left as it is. No lock is held between.
SELECT_KEYS_TO_REWRAP = """
SELECT user_id, key_id, kek_id, wrapped FROM t_user_key
WHERE kek_id <> %(primary)s AND (%(after)s::text IS NULL OR user_id > %(after)s::text)
ORDER BY user_id
LIMIT %(batch)s
"""

REWRAP_KEYS = """
UPDATE t_user_key AS k
SET kek_id = u.new_kek_id, wrapped = u.new_wrapped, wrap_time = now()
FROM unnest(%(user_ids)s::text[], %(old_kek_ids)s::text[], %(new_kek_ids)s::text[],
            %(new_wrapped)s::bytea[]) AS u(user_id, old_kek_id, new_kek_id, new_wrapped)
WHERE k.user_id = u.user_id AND k.kek_id = u.old_kek_id
RETURNING k.user_id
"""

COUNT_KEYS_BY_KEK = """
SELECT kek_id, count(*) AS keys FROM t_user_key GROUP BY kek_id ORDER BY kek_id
"""


def ad(user_id: str, conversation_id: int | str, kind: str, row_key: str = "") -> bytes:
    return envelope.associated_data(user_id, conversation_id, kind, row_key)
