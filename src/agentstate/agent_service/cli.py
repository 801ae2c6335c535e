"""`agentstate-cli`: a terminal client of the agent service.

    agentstate-cli chat "question" [--conversation ID] [--approve | --deny]
    agentstate-cli confirm CONVERSATION_ID MESSAGE_ID [--approve | --deny]
    agentstate-cli history CONVERSATION_ID
    agentstate-cli conversations
    agentstate-cli stop TASK_ID
    agentstate-cli delete CONVERSATION_ID

AGENTSTATE_ADDRESS (default 127.0.0.1:50061) is the agent service and
AGENTSTATE_USER (default "demo") the end user sent as `agentstate-user-id`
(--address and --user override them; AGENT_AUTH_MODE=dev-header). With AGENTSTATE_TOKEN
set, that access token is sent as `authorization: Bearer` instead (AGENT_AUTH_MODE=jwt;
docs/authentication.md). Without --approve/--deny, a confirmation card is asked about on
the terminal. `confirm` answers a card left open earlier (by another session, or a chat
that was interrupted).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, TextIO

import grpc
from pydantic import Field

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.agent_service.auth import NO_CREDENTIALS
from agentstate.client.metadata import AUTHORIZATION_METADATA_KEY, USER_ID_METADATA_KEY
from agentstate.client.tls import ChannelSecurity
from agentstate.common import error_details
from agentstate.common.config import ConfigError, EnvSettings


class CliSettings(EnvSettings):
    """The command-line client's settings (the flags --address and --user override them)."""

    address: str = Field(
        default="127.0.0.1:50061",
        validation_alias="AGENTSTATE_ADDRESS",
        min_length=1,
        description="the agent service the CLI talks to",
    )
    user: str = Field(
        default="demo",
        validation_alias="AGENTSTATE_USER",
        min_length=1,
        description="the end user the CLI acts as (sent as agentstate-user-id)",
    )
    token: str = Field(
        default="",
        validation_alias="AGENTSTATE_TOKEN",
        description="an access token sent as `authorization: Bearer` instead of the user",
    )
    tls_ca_file: str = Field(
        default="",
        validation_alias="AGENTSTATE_TLS_CA_FILE",
        description="TLS to the agent service, its certificate checked against this PEM CA "
        "bundle; empty: plaintext",
    )
    tls_cert_file: str = Field(
        default="",
        validation_alias="AGENTSTATE_TLS_CERT_FILE",
        description="PEM client certificate, for an agent service with mTLS",
    )
    tls_key_file: str = Field(
        default="",
        validation_alias="AGENTSTATE_TLS_KEY_FILE",
        description="PEM private key of AGENTSTATE_TLS_CERT_FILE",
    )

    def channel(self, address: str) -> grpc.Channel:
        """A channel to the agent service at `address`, TLS when a TLS file is set;
        ValueError naming a file that cannot be read."""
        security = ChannelSecurity(
            ca_file=self.tls_ca_file, cert_file=self.tls_cert_file, key_file=self.tls_key_file
        )
        credentials = security.credentials()
        if credentials is None:
            return grpc.insecure_channel(address)
        return grpc.secure_channel(address, credentials)


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
    token = CliSettings.from_env(os.environ).token.strip()
    if token:
        return ((AUTHORIZATION_METADATA_KEY, f"Bearer {token}"),)
    return ((USER_ID_METADATA_KEY, user_id),)


class Renderer:
    """Prints a turn's events as they arrive, like a chat UI would."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out
        self._open: int | None = None  # the MessageType being streamed

    def line(self, text: str) -> None:
        self.end_line()
        self.out.write(text + "\n")

    def end_line(self) -> None:
        """End a streamed message, so what is printed next (on stderr too) starts a line."""
        if self._open is not None:
            self.out.write("\n")
            self._open = None
        self.out.flush()

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


class Interrupted(Exception):
    """Ctrl-C while a turn streamed. The turn goes on in the agent service (it is not
    tied to the call); `meta` names it, once the stream has said which it is."""

    def __init__(self, meta: pb.MetaEvent | None) -> None:
        super().__init__("interrupted")
        self.meta = meta

    def explain(self) -> str:
        if self.meta is None:
            return (
                "agentstate-cli: interrupted before the turn said which it is; it may go on "
                "in the agent service (agentstate-cli conversations lists yours)"
            )
        return (
            "agentstate-cli: interrupted; the turn goes on in the agent service.\n"
            f"  stop it with: agentstate-cli stop {self.meta.task_id}\n"
            f"  see it with:  agentstate-cli history {self.meta.conversation_id}"
        )


def run_turn(
    responses: Iterable[Any], renderer: Renderer
) -> tuple[pb.MetaEvent | None, pb.ConfirmEvent | None]:
    """Render a Chat/Confirm stream; return its meta and its card, if any. Interrupted
    on Ctrl-C (the call is cancelled; the turn is not)."""
    meta = card = None
    try:
        for response in responses:
            event = response.event
            # Kept before it is shown: a Ctrl-C right after the line is printed must
            # still know which turn goes on.
            if event.HasField("meta"):
                meta = event.meta
            if event.HasField("confirm"):
                card = event.confirm
            renderer.event(event)
    except KeyboardInterrupt:
        cancel = getattr(responses, "cancel", None)
        if callable(cancel):
            cancel()
        renderer.end_line()
        raise Interrupted(meta) from None
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
    try:
        answer_cards(stub, user_id, conversation_id, card, decide, renderer)
    except LeftOpen as exc:
        renderer.line(
            f"card {exc} left open; answer it later with: "
            f"agentstate-cli confirm {conversation_id} {exc} --approve|--deny"
        )
    return conversation_id


def answer_cards(
    stub: Any,
    user_id: str,
    conversation_id: str,
    card: pb.ConfirmEvent | None,
    decide: Callable[[pb.ConfirmEvent], bool],
    renderer: Renderer,
) -> None:
    """Answer `card`, and every card its answer leads to, as `decide` says."""
    md = call_metadata(user_id)
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


# How a card's record says it was answered (its metadata "card" status).
_ANSWERS = {"approved": "approved", "denied": "declined", "expired": "expired unanswered"}


def stored_card(
    stub: Any, user_id: str, conversation_id: str, message_id: str
) -> tuple[pb.ConfirmEvent, str]:
    """A card left open earlier, as its record keeps it (metadata "card"), shaped as the
    confirm event a turn would have sent (only the message id when the record has none),
    and how it was answered: "" while it is still open."""
    md = call_metadata(user_id)
    token = ""
    while True:
        page = stub.ListMessages(
            pb.ListMessagesRequest(conversation_id=conversation_id, page_token=token), metadata=md
        )
        for record in page.records:
            if record.message_id == message_id:
                data = json.loads(record.metadata_json or b"{}").get("card") or {}
                answer = ""
                if data and record.status != pb.MESSAGE_STATUS_AWAITING_CONFIRM:
                    status = str(data.get("status", ""))
                    answer = _ANSWERS.get(status) or "closed ({})".format(
                        pb.MessageStatus.Name(record.status).removeprefix("MESSAGE_STATUS_")
                    )
                event = pb.ConfirmEvent(message_id=message_id, title=str(data.get("title", "")))
                for call in data.get("calls", []):
                    event.calls.add(
                        call_id=str(call.get("call_id", "")),
                        tool_name=str(call.get("name", "")),
                        title=str(call.get("title", "")),
                        display_fields=[
                            pb.DisplayField(label=str(k), value=str(v))
                            for k, v in call.get("fields", [])
                        ],
                    )
                if data.get("expires_at"):
                    event.expire_time.FromJsonString(str(data["expires_at"]).replace("+00:00", "Z"))
                return event, answer
        token = page.next_page_token
        if not token:
            return pb.ConfirmEvent(message_id=message_id), ""


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
                outcome = f": {block['outcome_text']}" if block.get("outcome_text") else ""
                out.write(
                    f"   ⚙ {block['name']} "
                    f"{json.dumps(block['input'], ensure_ascii=False)}{outcome}\n"
                )
            elif kind == "tool_result":
                text = "".join(p.get("text", "") for p in block.get("output", []))
                first_line = text.splitlines()[0] if text else ""
                out.write(f"   ↳ {block['name']} {block['state']}: {first_line}\n")
        error = json.loads(record.metadata_json or b"{}").get("error")
        if isinstance(error, str) and error:
            out.write(f"   ✗ {error}\n")


INTERRUPTED_EXIT = 130  # as a shell reports a command ended by Ctrl-C (128 + SIGINT)


class LeftOpen(Exception):
    """The terminal closed before the card was answered: it stays open for later."""


def _ask(card: pb.ConfirmEvent) -> bool:
    try:
        answer = input(f"Approve '{card.title or card.message_id}'? [y/N] ").strip().lower()
    except (EOFError, KeyboardInterrupt):
        raise LeftOpen(card.message_id) from None
    return answer in {"y", "yes"}


# What to do about a refused identity, in the CLI's terms (the service names metadata).
_NO_TOKEN = "the agent service wants the end user's access token: set AGENTSTATE_TOKEN"
_TOKEN_REFUSED = {
    "TOKEN_EXPIRED": "the access token in AGENTSTATE_TOKEN has expired: set a new one",
    "TOKEN_INVALID": (
        "the access token in AGENTSTATE_TOKEN was refused: it is not a valid token for this "
        "service; set one it accepts"
    ),
}


def _identity_failure(reason: str, token_sent: bool) -> str | None:
    """The CLI's words for a refused identity; None to keep the service's."""
    if not token_sent and reason == NO_CREDENTIALS:
        # It sent the bare user header, which only dev-header takes: a jwt service.
        return _NO_TOKEN
    return _TOKEN_REFUSED.get(reason) if token_sent else None


def _failure(exc: grpc.RpcError, conversation: str) -> str:
    """The error line, with the command that answers an open card when that is the cause."""
    info = error_details.error_info(exc)
    details = exc.details()
    if exc.code() == grpc.StatusCode.UNAUTHENTICATED and info is not None:
        token_sent = bool(CliSettings.from_env(os.environ).token.strip())
        details = _identity_failure(info.reason, token_sent) or details
    text = f"agentstate-cli: {exc.code().name}: {details}"
    if info is not None and info.metadata.get(error_details.AWAITING_MESSAGE_ID):
        card = info.metadata[error_details.AWAITING_MESSAGE_ID]
        conversation = conversation or "CONVERSATION_ID"
        text += f"\n  answer it with: agentstate-cli confirm {conversation} {card} --approve|--deny"
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="agentstate-cli",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    try:
        settings = CliSettings.from_env(os.environ)
    except ConfigError as exc:
        print(f"agentstate-cli: {exc}", file=sys.stderr)
        return 2
    parser.add_argument("--address", default=settings.address)
    parser.add_argument("--user", default=settings.user)
    sub = parser.add_subparsers(dest="command", required=True)
    chat = sub.add_parser("chat", help="ask a question (and answer its cards)")
    chat.add_argument("question")
    chat.add_argument("--conversation", default="")
    decision = chat.add_mutually_exclusive_group()
    decision.add_argument("--approve", action="store_true", help="approve every card")
    decision.add_argument("--deny", action="store_true", help="cancel every card")
    confirm = sub.add_parser("confirm", help="answer a confirmation card left open earlier")
    confirm.add_argument("conversation")
    confirm.add_argument("message", help="the card's message id")
    answer = confirm.add_mutually_exclusive_group()
    answer.add_argument("--approve", action="store_true", help="approve it (and later cards)")
    answer.add_argument("--deny", action="store_true", help="cancel it (and later cards)")
    sub.add_parser("conversations", help="list your conversations")
    history = sub.add_parser("history", help="replay a conversation's messages")
    history.add_argument("conversation")
    stop = sub.add_parser("stop", help="stop a running turn")
    stop.add_argument("task")
    delete = sub.add_parser("delete", help="delete a conversation")
    delete.add_argument("conversation")
    args = parser.parse_args(argv)

    md = call_metadata(args.user)
    try:
        opened = settings.channel(args.address)
    except ValueError as exc:
        print(f"agentstate-cli: AGENTSTATE_TLS_*: {exc}", file=sys.stderr)
        return 2
    with opened as channel:
        stub: Any = pb_grpc.AgentServiceStub(channel)

        def decide(card: pb.ConfirmEvent) -> bool:
            return True if args.approve else False if args.deny else _ask(card)

        renderer = Renderer()
        try:
            if args.command == "chat":
                converse(stub, args.user, args.question, args.conversation, decide, renderer)
            elif args.command == "confirm":
                card = pb.ConfirmEvent(message_id=args.message)
                if not (args.approve or args.deny):  # show what is being decided
                    card, answered = stored_card(stub, args.user, args.conversation, args.message)
                    if answered:
                        title = f" ({card.title})" if card.title else ""
                        print(
                            f"agentstate-cli: card {args.message}{title} was already answered: "
                            f"{answered}; there is nothing to confirm",
                            file=sys.stderr,
                        )
                        return 1
                    if card.calls:
                        renderer.event(pb.TurnEvent(confirm=card))
                try:
                    answer_cards(stub, args.user, args.conversation, card, decide, renderer)
                except LeftOpen as exc:
                    renderer.line(f"card {exc} left open")
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
            renderer.end_line()
            print(_failure(exc, getattr(args, "conversation", "")), file=sys.stderr)
            return 1
        except Interrupted as exc:
            print(exc.explain(), file=sys.stderr)
            return INTERRUPTED_EXIT
        except KeyboardInterrupt:
            renderer.end_line()
            print("agentstate-cli: interrupted", file=sys.stderr)
            return INTERRUPTED_EXIT
    return 0


if __name__ == "__main__":
    sys.exit(main())
