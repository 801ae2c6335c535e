"""`agentstate-cli`: a terminal client of the agent service.

    agentstate-cli chat "question" [--conversation ID] [--approve | --deny]
    agentstate-cli history CONVERSATION_ID
    agentstate-cli conversations
    agentstate-cli stop TASK_ID
    agentstate-cli delete CONVERSATION_ID

AGENTSTATE_ADDRESS (default 127.0.0.1:50061) is the agent service and
AGENTSTATE_USER (default "demo") the end user sent as `agentstate-user-id`
(AGENT_AUTH_MODE=dev-header). With AGENTSTATE_TOKEN set, that access token is sent as
`authorization: Bearer` instead (AGENT_AUTH_MODE=jwt; README "Authentication").
Without --approve/--deny, a confirmation card is asked about on the terminal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import grpc

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.auth import AUTHORIZATION_METADATA_KEY, USER_ID_METADATA_KEY

_STATUS_WORDS = {
    pb.TOOL_CALL_STATUS_RUNNING: "running",
    pb.TOOL_CALL_STATUS_SUCCEEDED: "done",
    pb.TOOL_CALL_STATUS_FAILED: "failed",
    pb.TOOL_CALL_STATUS_ASKING: "waiting for your confirmation",
    pb.TOOL_CALL_STATUS_DENIED: "declined by you, not run",
    pb.TOOL_CALL_STATUS_INTERRUPTED: "not run",
}


def call_metadata(user_id: str) -> tuple[tuple[str, str], ...]:
    """Who the calls are made for: the AGENTSTATE_TOKEN access token, else the bare user."""
    token = os.environ.get("AGENTSTATE_TOKEN", "").strip()
    if token:
        return ((AUTHORIZATION_METADATA_KEY, f"Bearer {token}"),)
    return ((USER_ID_METADATA_KEY, user_id),)


class Renderer:
    """Prints a turn's events as they arrive, like a chat UI would."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out
        self._open: int | None = None  # the MessageType being streamed

    def line(self, text: str) -> None:
        if self._open is not None:
            self.out.write("\n")
            self._open = None
        self.out.write(text + "\n")

    def event(self, event: pb.TurnEvent) -> None:
        kind = event.WhichOneof("event")
        if kind == "meta":
            self.line(f"[conversation {event.meta.conversation_id} · task {event.meta.task_id}]")
        elif kind == "message":
            if self._open != event.message.type:
                label = {
                    pb.MESSAGE_TYPE_THINKING: "(thinking) ",
                    pb.MESSAGE_TYPE_RESPONSE: "assistant: ",
                    pb.MESSAGE_TYPE_ERROR: "error: ",
                }.get(event.message.type, "")
                if self._open is not None:
                    self.out.write("\n")
                self.out.write(label)
                self._open = event.message.type
            self.out.write(event.message.delta)
        elif kind == "block":
            block = event.block
            args = block.arguments_json.decode()
            self.line(f"  ⚙ {block.tool_name} {args}: {_STATUS_WORDS.get(block.status, '?')}")
        elif kind == "hint":
            self.line(f"  ℹ {event.hint.text}")
        elif kind == "confirm":
            card = event.confirm
            self.line(f"┌ confirmation card {card.message_id}: {card.title}")
            for call in card.calls:
                fields = ", ".join(f"{f.label}: {f.value}" for f in call.display_fields)
                self.line(f"│ {call.title} ({fields})")
            self.line(f"└ expires {card.expire_time.ToDatetime():%Y-%m-%d %H:%M:%S} UTC")
        elif kind == "finish":
            self.line(f"[finished · message {event.finish.message_id}]")
        elif kind == "cancel":
            self.line(f"[stopped · {event.cancel.reason}]")
        self.out.flush()


def run_turn(
    responses: Iterable[Any], renderer: Renderer
) -> tuple[pb.MetaEvent | None, pb.ConfirmEvent | None]:
    """Render a Chat/Confirm stream; return its meta and its card, if any."""
    meta = card = None
    for response in responses:
        event = response.event
        renderer.event(event)
        if event.HasField("meta"):
            meta = event.meta
        if event.HasField("confirm"):
            card = event.confirm
    return meta, card


def converse(
    stub: Any,
    user_id: str,
    question: str,
    conversation_id: str,
    decide: Callable[[pb.ConfirmEvent], bool],
    renderer: Renderer,
) -> str:
    """One question, and every card it leads to, decided by `decide`. Returns the conversation."""
    md = call_metadata(user_id)
    meta, card = run_turn(
        stub.Chat(pb.ChatRequest(conversation_id=conversation_id, question=question), metadata=md),
        renderer,
    )
    conversation_id = meta.conversation_id if meta else conversation_id
    while card is not None:
        approved = decide(card)
        renderer.line(f"> {'approve' if approved else 'cancel'} (card {card.message_id})")
        _, card = run_turn(
            stub.Confirm(
                pb.ConfirmRequest(
                    conversation_id=conversation_id, message_id=card.message_id, approved=approved
                ),
                metadata=md,
            ),
            renderer,
        )
    return conversation_id


def print_history(records: Iterable[pb.MessageRecord], out: TextIO = sys.stdout) -> None:
    for record in records:
        who = "user" if record.role == pb.MESSAGE_ROLE_USER else "assistant"
        status = pb.MessageStatus.Name(record.status).removeprefix("MESSAGE_STATUS_")
        out.write(f"── {who} · message {record.message_id} · {status}\n")
        for block in json.loads(record.blocks_json):
            kind = block.get("type")
            if kind == "text":
                out.write(f"   {block['text']}\n")
            elif kind == "thinking":
                out.write(f"   (thinking) {block['thinking']}\n")
            elif kind == "tool_use":
                out.write(
                    f"   ⚙ {block['name']} {json.dumps(block['input'], ensure_ascii=False)}\n"
                )
            elif kind == "tool_result":
                text = "".join(p.get("text", "") for p in block.get("output", []))
                first_line = text.splitlines()[0] if text else ""
                out.write(f"   ↳ {block['name']} {block['state']}: {first_line}\n")


def _ask(card: pb.ConfirmEvent) -> bool:
    answer = input(f"Approve '{card.title}'? [y/N] ").strip().lower()
    return answer in {"y", "yes"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="agentstate-cli",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--address", default=os.environ.get("AGENTSTATE_ADDRESS", "127.0.0.1:50061")
    )
    parser.add_argument("--user", default=os.environ.get("AGENTSTATE_USER", "demo"))
    sub = parser.add_subparsers(dest="command", required=True)
    chat = sub.add_parser("chat", help="ask a question (and answer its cards)")
    chat.add_argument("question")
    chat.add_argument("--conversation", default="")
    decision = chat.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="approve every card")
    decision.add_argument("--deny", action="store_true", help="cancel every card")
    sub.add_parser("conversations", help="list your conversations")
    history = sub.add_parser("history", help="replay a conversation's messages")
    history.add_argument("conversation")
    stop = sub.add_parser("stop", help="stop a running turn")
    stop.add_argument("task")
    delete = sub.add_parser("delete", help="delete a conversation")
    delete.add_argument("conversation")
    args = parser.parse_args(argv)

    md = call_metadata(args.user)
    with grpc.insecure_channel(args.address) as channel:
        stub: Any = pb_grpc.AgentServiceStub(channel)
        try:
            if args.command == "chat":

                def decide(card: pb.ConfirmEvent) -> bool:
                    return True if args.approve else False if args.deny else _ask(card)

                converse(stub, args.user, args.question, args.conversation, decide, Renderer())
            elif args.command == "conversations":
                page = stub.ListConversations(pb.ListConversationsRequest(), metadata=md)
                for c in page.conversations:
                    updated = c.update_time.ToDatetime()
                    print(f"{c.conversation_id}  {updated:%Y-%m-%d %H:%M}  {c.title}")
            elif args.command == "history":
                page = stub.ListMessages(
                    pb.ListMessagesRequest(conversation_id=args.conversation, page_size=1000),
                    metadata=md,
                )
                print_history(page.records)
            elif args.command == "stop":
                stopped = stub.Stop(pb.StopRequest(task_id=args.task), metadata=md)
                print(f"asked the turn of conversation {stopped.conversation_id} to stop")
            elif args.command == "delete":
                deleted = stub.DeleteConversation(
                    pb.DeleteConversationRequest(conversation_id=args.conversation), metadata=md
                )
                print(f"deleted (with {deleted.messages_deleted} message records)")
        except grpc.RpcError as exc:
            print(f"agentstate-cli: {exc.code().name}: {exc.details()}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
