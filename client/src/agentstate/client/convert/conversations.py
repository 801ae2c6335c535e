"""Conversations: create, resolve, get, list and search, rename, update (labels, time to
live), delete."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from agentstate.client.convert._common import Op, time_of
from agentstate.client.types import (
    Conversation,
    ConversationSearch,
    Deleted,
    Page,
    ResolvedConversation,
)
from agentstate.state.v1 import state_service_pb2 as pb

_CONVERSATION_STATUS = {
    pb.CONVERSATION_STATUS_IDLE: "IDLE",
    pb.CONVERSATION_STATUS_RUNNING: "RUNNING",
    pb.CONVERSATION_STATUS_AWAITING_CONFIRMATION: "AWAITING_CONFIRMATION",
    pb.CONVERSATION_STATUS_FAILED: "FAILED",
}


def conversation_of(message: pb.Conversation) -> Conversation:
    return Conversation(
        conversation_id=message.conversation_id,
        title=message.title,
        create_time=time_of(message.create_time),
        update_time=time_of(message.update_time),
        user_id=message.user_id,
        external_key=message.external_key,
        labels=dict(message.labels),
        status=_CONVERSATION_STATUS.get(message.status, "IDLE"),
        last_turn_time=(
            time_of(message.last_turn_time) if message.HasField("last_turn_time") else None
        ),
        ttl_seconds=message.ttl.seconds,
        ttl_renewed_by_writes=message.ttl.policy == pb.TTL_POLICY_RENEW_ON_WRITE,
        expire_time=time_of(message.expire_time) if message.HasField("expire_time") else None,
    )


def ttl_of(seconds: int | None, renewed_by_writes: bool) -> pb.TimeToLive | None:
    if seconds is None:
        return None
    policy = pb.TTL_POLICY_RENEW_ON_WRITE if renewed_by_writes else pb.TTL_POLICY_FIXED
    return pb.TimeToLive(seconds=seconds, policy=policy)


def _deleted(response: Any) -> Deleted:
    return Deleted(
        conversations=int(response.conversations_deleted),
        messages=int(response.messages_deleted),
        states=int(response.states_deleted),
    )


def create_conversation(
    user_id: str,
    title: str,
    external_key: str,
    labels: Mapping[str, str] | None = None,
    ttl: pb.TimeToLive | None = None,
) -> Op[Conversation]:
    return Op(
        "CreateConversation",
        pb.CreateConversationRequest(
            user_id=user_id, title=title, external_key=external_key, labels=labels, ttl=ttl
        ),
        lambda r: conversation_of(r.conversation),
    )


def resolve_conversation(
    user_id: str,
    external_key: str,
    create: bool,
    title: str,
    labels: Mapping[str, str] | None = None,
    ttl: pb.TimeToLive | None = None,
) -> Op[ResolvedConversation]:
    return Op(
        "ResolveConversation",
        pb.ResolveConversationRequest(
            user_id=user_id,
            external_key=external_key,
            create_if_missing=create,
            title=title,
            labels=labels,
            ttl=ttl,
        ),
        lambda r: ResolvedConversation(conversation_of(r.conversation), bool(r.created)),
    )


def get_conversation(user_id: str, conversation_id: str) -> Op[Conversation]:
    return Op(
        "GetConversation",
        pb.GetConversationRequest(user_id=user_id, conversation_id=conversation_id),
        lambda r: conversation_of(r.conversation),
    )


def list_conversations(user_id: str, page_size: int, page_token: str) -> Op[Page[Conversation]]:
    return Op(
        "ListConversations",
        pb.ListConversationsRequest(user_id=user_id, page_size=page_size, page_token=page_token),
        lambda r: Page([conversation_of(c) for c in r.conversations], r.next_page_token),
    )


def search_conversations(
    user_id: str,
    *,
    page_size: int,
    page_token: str,
    key_prefix: str,
    label_selector: str,
    statuses: Sequence[str],
    updated_after: datetime | None,
    updated_before: datetime | None,
    title_prefix: str,
    include_total: bool,
    all_users: bool,
    include_state_key: str,
) -> Op[ConversationSearch]:
    by_name = {name: value for value, name in _CONVERSATION_STATUS.items()}
    request = pb.ListConversationsRequest(
        user_id=user_id,
        page_size=page_size,
        page_token=page_token,
        key_prefix=key_prefix,
        label_selector=label_selector,
        statuses=[by_name.get(s, pb.CONVERSATION_STATUS_UNSPECIFIED) for s in statuses],
        title_prefix=title_prefix,
        include_total=include_total,
        all_users=all_users,
        include_state_key=include_state_key,
    )
    if updated_after is not None:
        request.updated_after.FromDatetime(updated_after)
    if updated_before is not None:
        request.updated_before.FromDatetime(updated_before)
    return Op(
        "ListConversations",
        request,
        lambda r: ConversationSearch(
            [conversation_of(c) for c in r.conversations],
            r.next_page_token,
            int(r.total_count),
            dict(r.states_json),
        ),
    )


def rename_conversation(user_id: str, conversation_id: str, title: str) -> Op[Conversation]:
    return Op(
        "RenameConversation",
        pb.RenameConversationRequest(user_id=user_id, conversation_id=conversation_id, title=title),
        lambda r: conversation_of(r.conversation),
    )


def update_conversation(
    user_id: str,
    conversation_id: str,
    *,
    set_labels: Mapping[str, str],
    remove_labels: Sequence[str],
    ttl_seconds: int | None,
    ttl_renewed_by_writes: bool,
    clear_ttl: bool,
) -> Op[Conversation]:
    return Op(
        "UpdateConversation",
        pb.UpdateConversationRequest(
            user_id=user_id,
            conversation_id=conversation_id,
            set_labels=dict(set_labels),
            remove_labels=list(remove_labels),
            ttl=ttl_of(ttl_seconds, ttl_renewed_by_writes),
            clear_ttl=clear_ttl,
        ),
        lambda r: conversation_of(r.conversation),
    )


def delete_conversation(user_id: str, conversation_id: str) -> Op[Deleted]:
    return Op(
        "DeleteConversation",
        pb.DeleteConversationRequest(user_id=user_id, conversation_id=conversation_id),
        _deleted,
    )


def delete_conversations(user_id: str, conversation_ids: Sequence[str]) -> Op[Deleted]:
    return Op(
        "BatchDeleteConversations",
        pb.BatchDeleteConversationsRequest(
            user_id=user_id, conversation_ids=list(conversation_ids)
        ),
        _deleted,
    )
