"""The data lifecycle's RPCs: ListConversations with its filters, UpdateConversation,
EraseUser and GetErasureReceipt (issue 23)."""

from __future__ import annotations

import logging
from typing import Any

import grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state_service import domain as d
from agentstate.state_service.servicer.base import ServicerBase
from agentstate.state_service.servicer.conversations import conversation_to_pb
from agentstate.state_service.servicer.lifecycle_pb import (
    labels_of,
    receipt_to_pb,
    statuses_of,
    ttl_of,
)
from agentstate.state_service.servicer.permissions import LIST_ALL_USERS, check_operator
from agentstate.state_service.servicer.translate import datetime_of, grpc_errors
from agentstate.state_service.storage.base.lifecycle import TtlChange

# One line per erasure, for the operators' audit trail: the receipt, never the user id
# (only its sha-256, which the receipt table keeps too).
audit = logging.getLogger("agentstate.audit")


class LifecycleRpcs(ServicerBase):
    @grpc_errors
    async def ListConversations(
        self, request: pb.ListConversationsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListConversationsResponse:
        if request.all_users:
            check_operator(context, LIST_ALL_USERS, allowed=self._allow_list_all_users)
            user_id = d.validate_user_id(request.user_id) if request.user_id else None
        else:
            user_id = d.validate_user_id(request.user_id)
        where = d.ConversationFilter(
            user_id=user_id,
            key_prefix=d.validate_key_prefix(request.key_prefix),
            selector=d.parse_label_selector(request.label_selector),
            statuses=statuses_of(request.statuses),
            updated_after=(
                datetime_of(request.updated_after) if request.HasField("updated_after") else None
            ),
            updated_before=(
                datetime_of(request.updated_before) if request.HasField("updated_before") else None
            ),
            title_prefix=d.check_text(request.title_prefix, "title_prefix", d.MAX_TITLE_CHARS),
        )
        state_key = (
            d.validate_state_key(request.include_state_key) if request.include_state_key else ""
        )
        found = await self._store.search_conversations(
            where=where,
            page_size=d.page_size(request.page_size, default=50, maximum=500),
            before_id=d.parse_page_token(request.page_token),
            include_total=request.include_total,
            include_state_key=state_key,
        )
        return pb.ListConversationsResponse(
            conversations=[conversation_to_pb(c) for c in found.page.items],
            next_page_token=found.page.next_page_token,
            total_count=found.total or 0,
            states_json={str(k): v for k, v in found.states.items()},
        )

    @grpc_errors
    async def UpdateConversation(
        self, request: pb.UpdateConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.UpdateConversationResponse:
        user_id = d.validate_user_id(request.user_id)
        conversation_id = d.parse_id(request.conversation_id, "conversation_id")
        removed = [
            d.validate_label_key(key, f"remove_labels[{i}]")
            for i, key in enumerate(request.remove_labels)
        ]
        ttl = ttl_of(request, "ttl")
        if ttl is not None and request.clear_ttl:
            raise d.InvalidArgument("set ttl or clear_ttl, not both")
        conversation = await self._store.set_conversation_facts(
            user_id=user_id,
            conversation_id=conversation_id,
            labels=d.LabelChange(labels_of(request.set_labels), removed),
            ttl=TtlChange(ttl, clear=request.clear_ttl),
        )
        return pb.UpdateConversationResponse(conversation=conversation_to_pb(conversation))

    @grpc_errors
    async def EraseUser(
        self, request: pb.EraseUserRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.EraseUserResponse:
        receipt = await erase_user(self._store, d.validate_user_id(request.user_id), self._erase)
        return pb.EraseUserResponse(receipt=receipt_to_pb(receipt))

    @grpc_errors
    async def GetErasureReceipt(
        self, request: pb.GetErasureReceiptRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetErasureReceiptResponse:
        receipt = await self._store.get_erasure_receipt(
            erasure_id=d.parse_id(request.erasure_id, "erasure_id")
        )
        return pb.GetErasureReceiptResponse(receipt=receipt_to_pb(receipt))


async def erase_user(store: Any, user_id: str, settings: Any) -> d.ErasureReceipt:
    """Erase and write the audit line (the RPC and the admin command)."""
    receipt: d.ErasureReceipt = await store.erase_user(user_id=user_id, settings=settings)
    counts = " ".join(f"{kind}={n}" for kind, n in receipt.counts.items())
    audit.info(
        "erasure %d done: user sha256 %s, started %s, ended %s, %s",
        receipt.erasure_id,
        d.user_hash(user_id),
        receipt.start_time.isoformat(),
        receipt.end_time.isoformat() if receipt.end_time else "-",
        counts,
    )
    return receipt
