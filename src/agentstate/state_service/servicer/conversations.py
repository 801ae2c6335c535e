"""Conversations: create, resolve, get, list, rename, delete."""

from __future__ import annotations

from typing import Any

import grpc

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state_service import domain as d
from agentstate.state_service.servicer.base import ServicerBase
from agentstate.state_service.servicer.lifecycle_pb import (
    STATUS_TO_PB,
    labels_of,
    ttl_of,
    ttl_to_pb,
)
from agentstate.state_service.servicer.translate import grpc_errors, timestamp


def conversation_to_pb(conversation: d.Conversation) -> pb.Conversation:
    message = pb.Conversation(
        conversation_id=str(conversation.conversation_id),
        user_id=conversation.user_id,
        title=conversation.title,
        create_time=timestamp(conversation.create_time),
        update_time=timestamp(conversation.update_time),
        external_key=conversation.external_key,
        labels=dict(conversation.labels),
        status=STATUS_TO_PB[conversation.status],
    )
    if conversation.last_turn_time is not None:
        message.last_turn_time.CopyFrom(timestamp(conversation.last_turn_time))
    if conversation.ttl is not None:
        message.ttl.CopyFrom(ttl_to_pb(conversation.ttl))
    if conversation.expire_time is not None:
        message.expire_time.CopyFrom(timestamp(conversation.expire_time))
    return message


class ConversationRpcs(ServicerBase):
    @grpc_errors
    async def CreateConversation(
        self, request: pb.CreateConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateConversationResponse:
        conversation = await self._store.create_conversation(
            user_id=d.validate_user_id(request.user_id),
            title=d.normalize_title(request.title, default=d.DEFAULT_TITLE),
            external_key=(
                d.validate_external_key(request.external_key) if request.external_key else ""
            ),
            labels=labels_of(request.labels),
            ttl=ttl_of(request, "ttl"),
        )
        return pb.CreateConversationResponse(conversation=conversation_to_pb(conversation))

    @grpc_errors
    async def ResolveConversation(
        self, request: pb.ResolveConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ResolveConversationResponse:
        resolved = await self._store.resolve_conversation(
            user_id=d.validate_user_id(request.user_id),
            external_key=d.validate_external_key(request.external_key),
            create_if_missing=request.create_if_missing,
            title=d.normalize_title(request.title, default=d.DEFAULT_TITLE),
            labels=labels_of(request.labels),
            ttl=ttl_of(request, "ttl"),
        )
        return pb.ResolveConversationResponse(
            conversation=conversation_to_pb(resolved.conversation), created=resolved.created
        )

    @grpc_errors
    async def GetConversation(
        self, request: pb.GetConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetConversationResponse:
        conversation = await self._store.get_conversation(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
        )
        return pb.GetConversationResponse(conversation=conversation_to_pb(conversation))

    @grpc_errors
    async def RenameConversation(
        self, request: pb.RenameConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.RenameConversationResponse:
        conversation = await self._store.rename_conversation(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            title=d.normalize_title(request.title),
        )
        return pb.RenameConversationResponse(conversation=conversation_to_pb(conversation))

    @grpc_errors
    async def DeleteConversation(
        self, request: pb.DeleteConversationRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteConversationResponse:
        counts = await self._store.delete_conversations(
            user_id=d.validate_user_id(request.user_id),
            conversation_ids=[d.parse_id(request.conversation_id, "conversation_id")],
        )
        return pb.DeleteConversationResponse(
            conversations_deleted=counts.conversations,
            messages_deleted=counts.messages,
            states_deleted=counts.states,
        )

    @grpc_errors
    async def BatchDeleteConversations(
        self,
        request: pb.BatchDeleteConversationsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.BatchDeleteConversationsResponse:
        user_id = d.validate_user_id(request.user_id)
        if not request.conversation_ids:
            raise d.InvalidArgument("conversation_ids must not be empty")
        if len(request.conversation_ids) > d.MAX_BATCH_DELETE:
            raise d.InvalidArgument(f"at most {d.MAX_BATCH_DELETE} conversation_ids per batch")
        ids = [
            d.parse_id(cid, f"conversation_ids[{i}]")
            for i, cid in enumerate(request.conversation_ids)
        ]
        counts = await self._store.delete_conversations(user_id=user_id, conversation_ids=ids)
        return pb.BatchDeleteConversationsResponse(
            conversations_deleted=counts.conversations,
            messages_deleted=counts.messages,
            states_deleted=counts.states,
        )
