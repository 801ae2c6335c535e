"""Reading gRPC metadata the same way in every client."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

import grpc


def trailer(error: grpc.aio.AioRpcError, key: str) -> str | None:
    """The value of one trailing-metadata key of a failed call, or None."""
    # grpc.aio yields (key, value) pairs; grpc-stubs types them as _Metadatum.
    pairs = cast(Iterable[tuple[str, str | bytes]], error.trailing_metadata() or ())
    for item_key, value in pairs:
        if item_key == key:
            return value if isinstance(value, str) else value.decode()
    return None
