"""Who may use an operator's ability. Two locks, both needed: the service must allow the
ability (a setting), and, under a policy, the caller needs a rule for every user; the
caller interceptor checks that one before the handler runs (a request without a user_id
is a call across users, policy.authorize)."""

from __future__ import annotations

from typing import Any

import grpc

from agentstate.state_service import domain as d

LIST_ALL_USERS = "list_all_users"


def check_operator(
    context: grpc.aio.ServicerContext[Any, Any], ability: str, *, allowed: bool
) -> None:
    """PermissionDenied unless this service allows `ability` (`allowed`:
    STATE_ALLOW_LIST_ALL_USERS). Which callers may use it is the policy's part, checked
    before the handler runs."""
    if not allowed:
        raise d.PermissionDenied(
            f"{ability} is an operator's ability and this state service does not allow it: "
            "set STATE_ALLOW_LIST_ALL_USERS=on on the service, or list one user's "
            "conversations (user_id)"
        )
