"""Requests and responses of every StateService RPC, built and parsed once.

Each function returns an `Op`: the RPC's name, its request message and how to read its
response. AsyncStateClient and StateClient only send it (so the sync and async clients
share every line of translation). Internal: the public surface is agentstate.client.

One module per aggregate, as the state service's servicers are: _common (the Op, JSON
bytes, the time conversions), then messages, conversations, leases and erasure on it,
states on messages, turns on states, conversations and leases, checkpoints on leases, and
items (with scoped state) on _common alone. This package re-exports their public names.
"""

from __future__ import annotations

from agentstate.client.convert._common import Op, Payload, json_bytes, payload_bytes
from agentstate.client.convert.checkpoints import (
    checkpoint_of,
    copy_checkpoints,
    delete_checkpoints_for_runs,
    get_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    put_checkpoint,
    put_checkpoint_step,
    put_checkpoint_writes,
)
from agentstate.client.convert.conversations import (
    conversation_of,
    create_conversation,
    delete_conversation,
    delete_conversations,
    get_conversation,
    list_conversations,
    rename_conversation,
    resolve_conversation,
    search_conversations,
    ttl_of,
    update_conversation,
)
from agentstate.client.convert.erasure import erase_user, get_erasure_receipt
from agentstate.client.convert.items import (
    append_event,
    append_items,
    clear_items,
    get_scoped_state,
    item_of,
    list_items,
    new_item_pb,
    pop_item,
)
from agentstate.client.convert.leases import (
    acquire_lease,
    get_lease,
    lease_of,
    release_lease,
    renew_lease,
    request_stop,
)
from agentstate.client.convert.messages import (
    append_message,
    compaction_pb,
    get_message,
    list_compactions,
    list_messages,
    message_update_pb,
    message_write_pb,
    new_message_pb,
    record_of,
    update_message,
)
from agentstate.client.convert.states import get_state, state_delta_pb, upsert_state
from agentstate.client.convert.turns import begin_turn, end_turn

__all__ = [
    "Op",
    "Payload",
    "acquire_lease",
    "append_event",
    "append_items",
    "append_message",
    "begin_turn",
    "checkpoint_of",
    "clear_items",
    "compaction_pb",
    "conversation_of",
    "copy_checkpoints",
    "create_conversation",
    "delete_checkpoints_for_runs",
    "delete_conversation",
    "delete_conversations",
    "end_turn",
    "erase_user",
    "get_checkpoint",
    "get_conversation",
    "get_erasure_receipt",
    "get_lease",
    "get_message",
    "get_scoped_state",
    "get_state",
    "item_of",
    "json_bytes",
    "lease_of",
    "list_checkpoints",
    "list_compactions",
    "list_conversations",
    "list_items",
    "list_messages",
    "message_update_pb",
    "message_write_pb",
    "new_item_pb",
    "new_message_pb",
    "payload_bytes",
    "pop_item",
    "prune_checkpoints",
    "put_checkpoint",
    "put_checkpoint_step",
    "put_checkpoint_writes",
    "record_of",
    "release_lease",
    "rename_conversation",
    "renew_lease",
    "request_stop",
    "resolve_conversation",
    "search_conversations",
    "state_delta_pb",
    "ttl_of",
    "update_conversation",
    "update_message",
    "upsert_state",
]
