"""Conversation items, events and scoped state (the items capability)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import grpc
from google.protobuf.timestamp_pb2 import Timestamp

from agentstate.state.v1 import state_service_pb2 as pb
from agentstate.state_service import domain as d
from agentstate.state_service.servicer.base import ServicerBase
from agentstate.state_service.servicer.translate import grpc_errors


def _expected_revision(
    request: pb.AppendItemsRequest | pb.PopItemRequest | pb.AppendEventRequest,
) -> int | None:
    if not request.HasField("expected_revision"):
        return None
    if request.expected_revision < 0:
        raise d.InvalidArgument("expected_revision must not be negative")
    return request.expected_revision


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _timestamp(value: datetime) -> Timestamp:
    """As translate.timestamp, built from integers: a third of FromDatetime's cost, which
    counts in a page of a thousand items (two times each)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)  # as FromDatetime reads a naive time
    since = value - _EPOCH
    return Timestamp(seconds=since.days * 86400 + since.seconds, nanos=since.microseconds * 1000)


def item_to_pb(
    item: d.ConversationItem, conversation_id: str | None = None, *, with_json: bool = True
) -> pb.ConversationItem:
    item_time = _timestamp(item.item_time)
    return pb.ConversationItem(
        conversation_id=conversation_id or str(item.conversation_id),
        seq=item.seq,
        item_json=item.item_json if with_json else b"",
        item_time=item_time,
        # Most items are appended without a time of their own: one Timestamp for both.
        create_time=(
            item_time if item.create_time == item.item_time else _timestamp(item.create_time)
        ),
    )


def _items_to_pb(
    items: list[d.ConversationItem], *, with_json: bool = True
) -> list[pb.ConversationItem]:
    if not items:
        return []
    conversation_id = str(items[0].conversation_id)
    return [item_to_pb(i, conversation_id, with_json=with_json) for i in items]


def _scoped_to_pb(state: d.StoredState) -> pb.ScopedState:
    return pb.ScopedState(
        payload=state.payload, version=state.version, update_time=_timestamp(state.update_time)
    )


class ItemRpcs(ServicerBase):
    def _new_item(self, item: pb.NewItem, what: str) -> d.NewItem:
        return d.NewItem(
            item_json=d.check_item_json(item.item_json, self._max_payload_bytes, what),
            item_time=item.item_time.ToDatetime(UTC) if item.HasField("item_time") else None,
        )

    @grpc_errors
    async def AppendItems(
        self, request: pb.AppendItemsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AppendItemsResponse:
        user_id = d.validate_user_id(request.user_id)
        conversation_id = d.parse_id(request.conversation_id, "conversation_id")
        if not 1 <= len(request.items) <= d.MAX_ITEMS_PER_APPEND:
            raise d.InvalidArgument(f"items must hold 1..{d.MAX_ITEMS_PER_APPEND} items")
        items = [self._new_item(item, f"items[{i}]") for i, item in enumerate(request.items)]
        appended = await self._items().append_items(
            user_id=user_id,
            conversation_id=conversation_id,
            items=items,
            expected_revision=_expected_revision(request),
        )
        return pb.AppendItemsResponse(
            items=_items_to_pb(appended.items, with_json=not request.omit_item_json),
            revision=appended.revision,
        )

    @grpc_errors
    async def ListItems(
        self, request: pb.ListItemsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListItemsResponse:
        last_n: int | None = None
        if request.HasField("last_n"):
            last_n = request.last_n
            if last_n < 0:
                raise d.InvalidArgument("last_n must not be negative")
        user_id = d.validate_user_id(request.user_id)
        conversation_id = d.parse_id(request.conversation_id, "conversation_id")
        # Checked before anything is read: a bad one is refused, not half answered.
        state_key = (
            d.validate_state_key(request.include_state_key) if request.include_state_key else ""
        )
        app_name = (
            d.validate_app_name(request.include_scoped_app_name)
            if request.include_scoped_app_name
            else ""
        )
        after_seq = d.parse_page_token(request.page_token)
        if request.HasField("after_seq"):
            if request.after_seq < 0:
                raise d.InvalidArgument("after_seq must not be negative")
            # A later page's token is past after_seq already.
            after_seq = max(after_seq or 0, request.after_seq)
        page = await self._items().list_items(
            user_id=user_id,
            conversation_id=conversation_id,
            last_n=last_n,
            min_item_time=(
                request.min_item_time.ToDatetime(UTC) if request.HasField("min_item_time") else None
            ),
            page_size=d.page_size(request.page_size, default=1000, maximum=10000),
            after_seq=after_seq,
            state_key=state_key,
            scoped_app=app_name,
        )
        response = pb.ListItemsResponse(
            items=_items_to_pb(page.items),
            next_page_token=page.next_page_token,
            revision=page.revision,
            update_time=_timestamp(page.update_time),
        )
        # Read with the items, at the same point in time (an ADK session in one call).
        if page.state is not None:
            response.state.CopyFrom(_scoped_to_pb(page.state))
        if page.scoped is not None:
            self._scoped_to_response(page.scoped, response)
        return response

    @staticmethod
    def _scoped_to_response(
        states: d.ScopedStates, response: pb.ListItemsResponse | pb.GetScopedStateResponse
    ) -> None:
        if states.app is not None:
            response.app_state.CopyFrom(_scoped_to_pb(states.app))
        if states.user is not None:
            response.user_state.CopyFrom(_scoped_to_pb(states.user))

    @grpc_errors
    async def PopItem(
        self, request: pb.PopItemRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.PopItemResponse:
        popped = await self._items().pop_item(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
            expected_revision=_expected_revision(request),
        )
        response = pb.PopItemResponse(revision=popped.revision)
        if popped.item is not None:
            response.item.CopyFrom(item_to_pb(popped.item))
        return response

    @grpc_errors
    async def ClearItems(
        self, request: pb.ClearItemsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ClearItemsResponse:
        cleared = await self._items().clear_items(
            user_id=d.validate_user_id(request.user_id),
            conversation_id=d.parse_id(request.conversation_id, "conversation_id"),
        )
        return pb.ClearItemsResponse(items_deleted=cleared.deleted, revision=cleared.revision)

    @grpc_errors
    async def GetScopedState(
        self, request: pb.GetScopedStateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetScopedStateResponse:
        states = await self._items().get_scoped_state(
            user_id=d.validate_user_id(request.user_id),
            app_name=d.validate_app_name(request.app_name),
        )
        response = pb.GetScopedStateResponse()
        self._scoped_to_response(states, response)
        return response

    @grpc_errors
    async def AppendEvent(
        self, request: pb.AppendEventRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AppendEventResponse:
        user_id = d.validate_user_id(request.user_id)
        conversation_id = d.parse_id(request.conversation_id, "conversation_id")
        limit = self._max_payload_bytes
        # Only the conversation delta carries ADK's prefixes; the scoped ones are stored as given.
        app_delta = d.state_delta(request.app_state_delta_json, limit, "app_state_delta")
        user_delta = d.state_delta(request.user_state_delta_json, limit, "user_state_delta")
        event = d.EventAppend(
            item=self._new_item(request.item, "item") if request.HasField("item") else None,
            expected_revision=_expected_revision(request),
            state_key=d.validate_state_key(request.state_key),
            state_delta=d.without_temp_keys(request.state_delta_json, limit, "state_delta"),
            app_name=(
                d.validate_app_name(request.app_name)
                if app_delta or user_delta or request.app_name
                else ""
            ),
            app_delta=app_delta,
            user_delta=user_delta,
        )
        appended = await self._items().append_event(
            user_id=user_id, conversation_id=conversation_id, event=event
        )
        response = pb.AppendEventResponse(
            revision=appended.revision, state_version=appended.state_version
        )
        if appended.item is not None:
            response.item.CopyFrom(item_to_pb(appended.item, with_json=not request.omit_item_json))
        return response
