"""Reading the standard error details of a failed call: google.rpc.Status with a
google.rpc.ErrorInfo in the `grpc-status-details-bin` trailer.

Every error status the services send carries one ErrorInfo: `domain` "agentstate.io", a
stable UPPER_SNAKE `reason` and string `metadata`, for example {"current_version": "7"} on
an ABORTED save. This is the callers' half (the domain, the metadata keys and the decoding);
the servers build the statuses with the same names (agentstate.common.error_details).
"""

from __future__ import annotations

from typing import cast

import grpc
from google.rpc import error_details_pb2
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
