"""Standard error details for both services: google.rpc.Status with a google.rpc.ErrorInfo.

Every error status our servicers send carries, in the `grpc-status-details-bin` trailer, a
google.rpc.Status (same code and message) whose one detail is a google.rpc.ErrorInfo:
`domain` "agentstate.io", a stable UPPER_SNAKE `reason` and string `metadata`, for example
{"current_version": "7"} on an ABORTED save. A caller in any language reads it with its gRPC
library's status helpers (Java StatusProto.fromThrowable, Go status.Convert(err).Details(),
Python rpc_status.from_call) instead of parsing the message. The older trailers
(`agentstate-current-version`, `agentstate-missing`) are still sent beside it.

This module is the generic mechanism only (common imports neither service): each service
maps its own errors to reasons and metadata (state_service/error_reasons.py,
agent_service/error_reasons.py), and agentstate.client turns them back into exceptions.
Statuses made by the gRPC library itself (deadline, cancellation, message too large,
UNIMPLEMENTED, an unexpected exception's UNKNOWN) carry no details.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn, cast

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "agentstate.io"

# ErrorInfo.metadata keys
CURRENT_VERSION = "current_version"  # ABORTED: the stored version ("0": no state)
EXPECTED_VERSION = "expected_version"  # ABORTED: the version the caller expected
MISSING = "missing"  # NOT_FOUND: "conversation", "state", "message" or "task"
AWAITING_MESSAGE_ID = "awaiting_message_id"  # CARD_PENDING: the open card's record id
CURRENT_CHECKPOINT_ID = "current_checkpoint_id"  # CHECKPOINT_CONFLICT: the head ("": none)
EXPECTED_CHECKPOINT_ID = "expected_checkpoint_id"  # CHECKPOINT_CONFLICT: the caller's
HOLDER = "holder"  # LEASE_HELD: the replica running the turn (for operators)


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


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The agentstate ErrorInfo of a failed call (client side), or None without one."""
    # Failed calls are both RpcError and Call (sync) or AioRpcError, which has the same
    # code/details/trailing_metadata methods that from_call reads.
    try:
        status = rpc_status.from_call(cast(grpc.Call, error))
    except ValueError:  # details that do not match the call's status: not ours
        return None
    if status is None:
        return None
    for packed in status.details:
        info = error_details_pb2.ErrorInfo()
        if packed.Unpack(info) and info.domain == DOMAIN:
            return info
    return None
