"""Encryption at rest (issue 24 item 5): envelope encryption with one data key per user.

`kms.py` is the seam to whatever holds the key-encryption keys (KEKs): a Protocol with
wrap and unwrap, and the one implementation built, `FileKms` (KEKs read from a JSON file,
several ids for rotation). `envelope.py` seals and opens payload texts with a user's data
key (AES-256-GCM, a fresh 96-bit nonce per ciphertext, associated data naming the row)
and caches the unwrapped data keys. Neither knows SQL: the data keys' table is the
PostgreSQL store's (`storage/postgres/encryption.py`).
"""

from agentstate.state_service.crypto.envelope import (
    DataKey,
    DataKeyCache,
    associated_data,
    is_sealed,
    new_data_key,
    open_token,
    seal_text,
)
from agentstate.state_service.crypto.kms import FileKms, Kms, KmsConfigError, WrappedKey

__all__ = [
    "DataKey",
    "DataKeyCache",
    "FileKms",
    "Kms",
    "KmsConfigError",
    "WrappedKey",
    "associated_data",
    "is_sealed",
    "new_data_key",
    "open_token",
    "seal_text",
]
