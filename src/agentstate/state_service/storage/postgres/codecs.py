"""How payloads cross the wire to PostgreSQL: raw JSON text, arrays, undecoded text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import psycopg.errors
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.rows import DictRow

from agentstate.common import telemetry

Conn = psycopg.AsyncConnection[DictRow]


Row = dict[str, Any]


class RawJson:
    """JSON text passed to PostgreSQL as-is, as a jsonb parameter (checkpoint metadata's
    searchable copy, metadata filters, channel versions: never a payload returned)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _RawJsonbDumper(Dumper):
    oid = psycopg.postgres.types["jsonb"].oid

    def dump(self, obj: RawJson) -> Buffer:
        return obj.data


class TextArray:
    """A text[] parameter of UTF-8 byte strings (None: NULL), dumped in one pass.

    psycopg's generic list dumper works element by element in Python; a turn sends a
    dozen small arrays, so this matters on the hot path."""

    __slots__ = ("items",)

    def __init__(self, items: Sequence[bytes | str | None]) -> None:
        self.items = items


class BigintArray:
    """A bigint[] parameter (None: NULL)."""

    __slots__ = ("items",)

    def __init__(self, items: Sequence[int | None]) -> None:
        self.items = items


def _quoted(item: bytes | str | None) -> bytes:
    if item is None:
        return b"NULL"
    data = item.encode() if isinstance(item, str) else item
    return b'"' + data.replace(b"\\", b"\\\\").replace(b'"', b'\\"') + b'"'


class _TextArrayDumper(Dumper):
    oid = psycopg.postgres.types["text"].array_oid

    def dump(self, obj: TextArray) -> Buffer:
        return b"{" + b",".join(_quoted(item) for item in obj.items) + b"}"


class _BigintArrayDumper(Dumper):
    oid = psycopg.postgres.types["int8"].array_oid

    def dump(self, obj: BigintArray) -> Buffer:
        return (
            "{" + ",".join("NULL" if i is None else str(int(i)) for i in obj.items) + "}"
        ).encode()


class _RawJsonbLoader(Loader):
    """Return jsonb columns as the UTF-8 bytes PostgreSQL sends, undecoded."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


class RawTextLoader(Loader):
    """Text columns as undecoded UTF-8 bytes: registered only on the cursors that read
    a state's payload (assembled as text, see migration 10)."""

    def load(self, data: Buffer) -> bytes:
        return bytes(data)


async def configure_connection(conn: Conn) -> None:
    conn.adapters.register_dumper(RawJson, _RawJsonbDumper)
    conn.adapters.register_dumper(TextArray, _TextArrayDumper)
    conn.adapters.register_dumper(BigintArray, _BigintArrayDumper)
    conn.adapters.register_loader("jsonb", _RawJsonbLoader)
    # One statement per call: it is its own transaction, with no BEGIN/COMMIT round trips.
    await conn.set_autocommit(True)
    telemetry.instrument_psycopg_connection(conn)  # database spans, when tracing is on


def text_of(data: bytes | None) -> str | None:
    return data.decode() if data is not None else None
