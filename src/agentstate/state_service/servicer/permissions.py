"""Who may use an operator's ability. One small function, so that caller identity and
policy (the security work) can replace its body without touching the handlers."""

from __future__ import annotations

from typing import Any

import grpc

from agentstate.state_service import domain as d

LIST_ALL_USERS = "list_all_users"


def check_operator(
    context: grpc.aio.ServicerContext[Any, Any], ability: str, *, allowed: bool
) -> None:
    """PermissionDenied unless the caller may use `ability`. Today the state service's
    setting decides for every caller (`allowed`: STATE_ALLOW_LIST_ALL_USERS); the
    caller's identity is not known here yet."""
    if not allowed:
        raise d.PermissionDenied(
            f"{ability} is an operator's ability and this state service does not allow it: "
            "set STATE_ALLOW_LIST_ALL_USERS=on on the service, or list one user's "
            "conversations (user_id)"
        )
