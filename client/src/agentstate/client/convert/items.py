"""Conversation items and scoped state: AppendItems, ListItems, PopItem, ClearItems,
GetScopedState, AppendEvent."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from agentstate.client.convert._common import Op, Payload, payload_bytes, time_of, timestamp_of
from agentstate.client.types import (
    AppendedEvent,
    AppendedItems,
    ClearedItems,
    Item,
    ItemsPage,
    NewItem,
    PoppedItem,
    ScopedStates,
    StateSnapshot,
)
from agentstate.state.v1 import state_service_pb2 as pb


def new_item_pb(item: NewItem) -> pb.NewItem:
    message = pb.NewItem(item_json=payload_bytes(item.item))
    if item.item_time is not None:
        message.item_time.CopyFrom(timestamp_of(item.item_time))
    return message


def item_of(message: pb.ConversationItem, item_json: bytes | None = None) -> Item:
    return Item(
        conversation_id=message.conversation_id,
        seq=int(message.seq),
        item_json=message.item_json if item_json is None else item_json,
        item_time=time_of(message.item_time),
        create_time=time_of(message.create_time),
    )


def _snapshot_of(message: pb.ScopedState) -> StateSnapshot:
    return StateSnapshot(message.payload, int(message.version), time_of(message.update_time))


def _scoped_of(r: pb.ListItemsResponse | pb.GetScopedStateResponse) -> ScopedStates:
    return ScopedStates(
        _snapshot_of(r.app_state) if r.HasField("app_state") else None,
        _snapshot_of(r.user_state) if r.HasField("user_state") else None,
    )


def append_items(
    user_id: str, conversation_id: str, items: Sequence[NewItem], expected_revision: int | None
) -> Op[AppendedItems]:
    # The service stores each item as the text sent: it need not send the texts back.
    request = pb.AppendItemsRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        items=[new_item_pb(i) for i in items],
        omit_item_json=True,
    )
    if expected_revision is not None:
        request.expected_revision = expected_revision
    sent = [i.item_json for i in request.items]
    return Op(
        "AppendItems",
        request,
        lambda r: AppendedItems(
            [item_of(i, text) for i, text in zip(r.items, sent, strict=True)], int(r.revision)
        ),
    )


def list_items(
    user_id: str,
    conversation_id: str,
    *,
    last_n: int | None,
    min_item_time: datetime | None,
    page_size: int,
    page_token: str,
    include_state_key: str = "",
    include_scoped_app_name: str = "",
    after_seq: int | None = None,
) -> Op[ItemsPage]:
    request = pb.ListItemsRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        page_size=page_size,
        page_token=page_token,
        include_state_key=include_state_key,
        include_scoped_app_name=include_scoped_app_name,
    )
    if last_n is not None:
        request.last_n = last_n
    if after_seq is not None:
        request.after_seq = after_seq
    if min_item_time is not None:
        request.min_item_time.CopyFrom(timestamp_of(min_item_time))
    return Op(
        "ListItems",
        request,
        lambda r: ItemsPage(
            [item_of(i) for i in r.items],
            r.next_page_token,
            int(r.revision),
            time_of(r.update_time),
            _snapshot_of(r.state) if r.HasField("state") else None,
            _scoped_of(r) if include_scoped_app_name else None,
        ),
    )


def pop_item(user_id: str, conversation_id: str, expected_revision: int | None) -> Op[PoppedItem]:
    request = pb.PopItemRequest(user_id=user_id, conversation_id=conversation_id)
    if expected_revision is not None:
        request.expected_revision = expected_revision
    return Op(
        "PopItem",
        request,
        lambda r: PoppedItem(item_of(r.item) if r.HasField("item") else None, int(r.revision)),
    )


def clear_items(user_id: str, conversation_id: str) -> Op[ClearedItems]:
    return Op(
        "ClearItems",
        pb.ClearItemsRequest(user_id=user_id, conversation_id=conversation_id),
        lambda r: ClearedItems(int(r.items_deleted), int(r.revision)),
    )


def get_scoped_state(user_id: str, app_name: str) -> Op[ScopedStates]:
    return Op(
        "GetScopedState",
        pb.GetScopedStateRequest(user_id=user_id, app_name=app_name),
        _scoped_of,
    )


def append_event(
    user_id: str,
    conversation_id: str,
    *,
    item: NewItem | None,
    expected_revision: int | None,
    state_key: str,
    state_delta: Payload | None,
    app_name: str,
    app_state_delta: Payload | None,
    user_state_delta: Payload | None,
) -> Op[AppendedEvent]:
    request = pb.AppendEventRequest(
        user_id=user_id,
        conversation_id=conversation_id,
        state_key=state_key,
        app_name=app_name,
        state_delta_json=payload_bytes(state_delta) if state_delta is not None else b"",
        app_state_delta_json=payload_bytes(app_state_delta) if app_state_delta is not None else b"",
        user_state_delta_json=(
            payload_bytes(user_state_delta) if user_state_delta is not None else b""
        ),
    )
    if item is not None:
        request.item.CopyFrom(new_item_pb(item))
        request.omit_item_json = True  # stored as sent (as in append_items)
    if expected_revision is not None:
        request.expected_revision = expected_revision
    sent = request.item.item_json
    return Op(
        "AppendEvent",
        request,
        lambda r: AppendedEvent(
            item_of(r.item, sent) if r.HasField("item") else None,
            int(r.revision),
            int(r.state_version),
        ),
    )
