"""Standard error details for both services: google.rpc.Status with a google.rpc.ErrorInfo.

Every error status our servicers send carries, in the `grpc-status-details-bin` trailer, a
google.rpc.Status (same code and message) whose one detail is a google.rpc.ErrorInfo:
`domain` "agentstate.io", a stable UPPER_SNAKE `reason` and string `metadata`, for example
{"current_version": "7"} on an ABORTED save. A caller in any language reads it with its gRPC
library's status helpers (Java StatusProto.fromThrowable, Go status.Convert(err).Details(),
Python rpc_status.from_call) instead of parsing the message. The older trailers
(`agentstate-current-version`, `agentstate-missing`) are still sent beside it.

This module is the generic mechanism only (common imports neither service; the callers' half,
reading an ErrorInfo, is agentstate.client.error_details): each service
maps its own errors to reasons and metadata (state_service/error_reasons.py,
agent_service/error_reasons.py), and agentstate.client turns them back into exceptions.
Statuses made by the gRPC library itself (deadline, cancellation, message too large,
UNIMPLEMENTED, an unexpected exception's UNKNOWN) carry no details.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

# The domain, the metadata keys and the decoding are the callers' half, in the client
# distribution; re-exported here for the servers.
from agentstate.client.error_details import (
    AWAITING_MESSAGE_ID,
    CURRENT_CHECKPOINT_ID,
    CURRENT_VERSION,
    DOMAIN,
    EXPECTED_CHECKPOINT_ID,
    EXPECTED_VERSION,
    HOLDER,
    MISSING,
    error_info,
)

__all__ = [
    "AWAITING_MESSAGE_ID",
    "CURRENT_CHECKPOINT_ID",
    "CURRENT_VERSION",
    "DOMAIN",
    "EXPECTED_CHECKPOINT_ID",
    "EXPECTED_VERSION",
    "HOLDER",
    "MISSING",
    "ErrorDetail",
    "abort",
    "error_info",
    "nearest_reason",
    "rich_status",
]


@dataclass(frozen=True)
class ErrorDetail:
    reason: str
    metadata: Mapping[str, str] = field(default_factory=dict)


def nearest_reason(table: Mapping[type[Any], str], error: Exception) -> str:
    """The reason of the error's nearest class in `table` (a subclass answers as its
    base does unless listed itself); INTERNAL when none is."""
    for kind in type(error).__mro__:
        if kind in table:
            return table[kind]
    return "INTERNAL"


def rich_status(code: grpc.StatusCode, message: str, detail: ErrorDetail) -> status_pb2.Status:
    info = error_details_pb2.ErrorInfo(
        reason=detail.reason, domain=DOMAIN, metadata=dict(detail.metadata)
    )
    packed = any_pb2.Any()
    packed.Pack(info)
    number: int = code.value[0]
    return status_pb2.Status(code=number, message=message, details=[packed])


async def abort(
    context: grpc.aio.ServicerContext[Any, Any],
    code: grpc.StatusCode,
    message: str,
    detail: ErrorDetail,
    trailers: Iterable[tuple[str, str]] = (),
) -> NoReturn:
    """End the call with `code` and `message`, the details trailer and `trailers`."""
    status = rpc_status.to_status(rich_status(code, message, detail))
    # abort's trailing_metadata replaces any set earlier, so the extra trailers go with it.
    await context.abort(
        status.code, status.details, trailing_metadata=(*trailers, *status.trailing_metadata)
    )
    raise AssertionError("unreachable: abort raises")
