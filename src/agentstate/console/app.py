"""The console's web app (Starlette): a page, a small JSON API and turn streams (SSE).

Every call to the agent service carries the user as `agentstate-user-id` metadata; the
user comes from the trusted proxy's header (CONSOLE_USER_HEADER) or, in development,
CONSOLE_DEV_USER. Turn streams are `text/event-stream` responses to POSTs: one `data:`
line of JSON per agent event. A browser that goes away does not stop the turn (the
agent finishes and saves it); the page then resumes from the message records.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.client import StateError
from agentstate.client.metadata import PROXY_SECRET_METADATA_KEY, USER_ID_METADATA_KEY
from agentstate.client.service_config import channel_options
from agentstate.client.tls import ChannelSecurity
from agentstate.console.config import ConsoleSettings
from agentstate.console.present import event_view, record_view
from agentstate.console.state_reads import StateReader

# The conversation statuses, by name and number, read from the agent's contract (the
# console uses no state-service stub).
_STATUS = pb.Conversation.DESCRIPTOR.fields_by_name["status"].enum_type
assert _STATUS is not None
STATUS_NUMBERS: dict[str, Any] = {
    v.name.removeprefix("CONVERSATION_STATUS_"): v.number for v in _STATUS.values
}
STATUS_NAMES = {number: name for name, number in STATUS_NUMBERS.items()}

STATIC = Path(__file__).parent / "static"
_ID = re.compile(r"^[0-9]{1,20}$")
MAX_QUESTION_CHARS = 8000

# What the page says for each refusal; the agent's ErrorInfo reason picks the sentence.
_REASONS = {
    "CARD_ALREADY_HANDLED": (409, "This card was already answered. Nothing was changed."),
    "CARD_PENDING": (409, "Answer the open confirmation card first."),
    "LEASE_HELD": (409, "A reply is still being written in this conversation. Wait for it."),
    "LIMIT_REACHED": (429, "You have too many replies running at once. Wait for one to end."),
    "UNAUTHENTICATED": (401, "You are not signed in."),
}
_CODES = {
    grpc.StatusCode.NOT_FOUND: (
        404,
        "This conversation does not exist (it may have been deleted, or it is not yours).",
    ),
    grpc.StatusCode.UNAVAILABLE: (503, "The service is unreachable right now. Try again."),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "The service did not answer in time. Try again."),
    grpc.StatusCode.UNAUTHENTICATED: (401, "You are not signed in."),
}


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _reason(error: grpc.aio.AioRpcError) -> str:
    try:
        status = rpc_status.from_call(cast(grpc.Call, error))
    except ValueError:
        return ""
    for packed in status.details if status is not None else []:
        info = error_details_pb2.ErrorInfo()
        if packed.Unpack(info):
            return info.reason
    return ""


def explain(error: grpc.aio.AioRpcError) -> tuple[int, str]:
    """An HTTP status and a sentence for the page."""
    reason = _reason(error)
    if reason in _REASONS:
        return _REASONS[reason]
    if error.code() == grpc.StatusCode.FAILED_PRECONDITION and "expired" in (error.details() or ""):
        return 409, "This card has expired. Nothing was run; ask again if you still want it."
    if error.code() in _CODES:
        return _CODES[error.code()]
    if error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION):
        return 400, f"The service refused this: {error.details()}"
    return 502, f"The service failed ({error.code().name}). Try again."


def explain_state_error(error: StateError) -> tuple[int, str]:
    """As explain, for the public client's typed errors."""
    if error.code in _CODES:
        return _CODES[error.code]
    return 502, f"The service failed ({error.code.name}). Try again."


def _id(value: Any, what: str, *, empty_ok: bool = False) -> str:
    text = "" if value is None else str(value)
    if empty_ok and text == "":
        return text
    if not _ID.match(text):
        raise BadRequest(f"{what} must be a number, not {text[:40]!r}.")
    return text


class Console:
    """The app's state: settings and the two gRPC channels (opened in the lifespan)."""

    def __init__(self, settings: ConsoleSettings) -> None:
        self.settings = settings
        self._channel: grpc.aio.Channel | None = None
        self.agent: Any = None
        self.state: StateReader | None = None

    def security(self) -> ChannelSecurity:
        """TLS to both services as CONSOLE_GRPC_TLS_* say (plaintext when none is set)."""
        s = self.settings
        return ChannelSecurity(
            ca_file=s.grpc_tls_ca_file, cert_file=s.grpc_tls_cert_file, key_file=s.grpc_tls_key_file
        )

    async def open(self) -> None:
        security = self.security()
        credentials = security.credentials()
        if credentials is not None:
            self._channel = grpc.aio.secure_channel(
                self.settings.agent_address, credentials, options=channel_options()
            )
        else:
            self._channel = grpc.aio.insecure_channel(
                self.settings.agent_address, options=channel_options()
            )
        self.agent = pb_grpc.AgentServiceStub(self._channel)
        self.state = StateReader(
            self.settings.state_address, self.settings.rpc_timeout_seconds, security
        )

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close(None)
        if self.state is not None:
            await self.state.close()

    def user_of(self, request: Request) -> str:
        """The proxy's header wins; the development user stands in without it."""
        header = self.settings.user_header
        user = request.headers.get(header, "").strip() if header else ""
        user = user or self.settings.dev_user
        if not user:
            raise BadRequest("You are not signed in (no user from the proxy).", 401)
        return user

    def metadata(self, request: Request) -> tuple[tuple[str, str], ...]:
        user = ((USER_ID_METADATA_KEY, self.user_of(request)),)
        secret = self.settings.agent_proxy_secret.get_secret_value()
        # An agent in AGENT_AUTH_MODE=proxy believes the user only with its shared secret.
        return (*user, (PROXY_SECRET_METADATA_KEY, secret)) if secret else user

    @property
    def timeout(self) -> float:
        return self.settings.rpc_timeout_seconds


async def _body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("The request body is not JSON.") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body


def create_app(settings: ConsoleSettings, on_ready: Callable[[], None] | None = None) -> Starlette:
    """The app; `on_ready` runs once it has started (the server handles signals by then)."""
    console = Console(settings)

    async def handle(request: Request, call: Any) -> Response:
        try:
            return cast(Response, await call())
        except BadRequest as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        except grpc.aio.AioRpcError as exc:
            status, message = explain(exc)
            return JSONResponse({"error": message, "code": exc.code().name}, status_code=status)
        except StateError as exc:  # the inspector's reads (agentstate.client)
            status, message = explain_state_error(exc)
            return JSONResponse({"error": message, "code": exc.code.name}, status_code=status)

    async def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html")

    async def me(request: Request) -> Response:
        async def run() -> Response:
            return JSONResponse({"user": console.user_of(request)})

        return await handle(request, run)

    async def conversations(request: Request) -> Response:
        async def run() -> Response:
            query = request.query_params
            statuses = [
                STATUS_NUMBERS[name]
                for name in query.get("status", "").split(",")
                if name in STATUS_NUMBERS and name != "UNSPECIFIED"
            ]
            page = await console.agent.ListConversations(
                pb.ListConversationsRequest(
                    page_size=20,
                    page_token=query.get("page_token", ""),
                    # The search runs on the state service (issue 23).
                    title_prefix=query.get("q", ""),
                    statuses=statuses,
                    label_selector=query.get("labels", ""),
                ),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            return JSONResponse(
                {
                    "conversations": [
                        {
                            "conversation_id": c.conversation_id,
                            "title": c.title,
                            "update_time": c.update_time.ToDatetime().isoformat() + "Z",
                            "status": STATUS_NAMES.get(c.status, "UNSPECIFIED"),
                            "labels": dict(c.labels),
                        }
                        for c in page.items
                    ],
                    "next_page_token": page.next_page_token,
                }
            )

        return await handle(request, run)

    async def messages(request: Request) -> Response:
        async def run() -> Response:
            cid = _id(request.path_params["cid"], "The conversation id")
            page = await console.agent.ListMessages(
                pb.ListMessagesRequest(
                    conversation_id=cid,
                    page_size=settings.history_page_size,
                    page_token=request.query_params.get("page_token", ""),
                ),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            return JSONResponse(
                {
                    "records": [record_view(r) for r in page.records],
                    "next_page_token": page.next_page_token,
                }
            )

        return await handle(request, run)

    async def rename(request: Request) -> Response:
        async def run() -> Response:
            cid = _id(request.path_params["cid"], "The conversation id")
            title = str((await _body(request)).get("title", "")).strip()
            if not title or len(title) > 200:
                raise BadRequest("A title needs 1 to 200 characters.")
            await console.agent.RenameConversation(
                pb.RenameConversationRequest(conversation_id=cid, title=title),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            return JSONResponse({"ok": True, "title": title})

        return await handle(request, run)

    async def delete(request: Request) -> Response:
        async def run() -> Response:
            cid = _id(request.path_params["cid"], "The conversation id")
            await console.agent.DeleteConversation(
                pb.DeleteConversationRequest(conversation_id=cid),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            return JSONResponse({"deleted": 1})

        return await handle(request, run)

    async def batch_delete(request: Request) -> Response:
        async def run() -> Response:
            ids = (await _body(request)).get("conversation_ids")
            if not isinstance(ids, list) or not ids or len(ids) > 100:
                raise BadRequest("Choose 1 to 100 conversations to delete.")
            checked = [_id(i, "A conversation id") for i in ids]
            done = await console.agent.BatchDeleteConversations(
                pb.BatchDeleteConversationsRequest(conversation_ids=checked),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            return JSONResponse({"deleted": done.conversations_deleted})

        return await handle(request, run)

    async def inspector(request: Request) -> Response:
        async def run() -> Response:
            cid = _id(request.path_params["cid"], "The conversation id")
            assert console.state is not None
            seen = await console.state.inspect(console.user_of(request), cid)
            return JSONResponse(
                {"state": seen.state, "compactions": seen.compactions, "lease": seen.lease}
            )

        return await handle(request, run)

    async def stop(request: Request) -> Response:
        async def run() -> Response:
            task_id = _id((await _body(request)).get("task_id"), "The task id")
            await console.agent.Stop(
                pb.StopRequest(task_id=task_id),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            return JSONResponse({"ok": True})

        return await handle(request, run)

    def stream(call: Any) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            try:
                async for response in call:
                    yield f"data: {json.dumps(event_view(response.event), ensure_ascii=False)}\n\n"
            except grpc.aio.AioRpcError as exc:
                _, message = explain(exc)
                error = {"type": "error", "message": message, "code": exc.code().name}
                yield f"data: {json.dumps(error, ensure_ascii=False)}\n\n"
            finally:
                # Only this call ends: the agent runs the turn to its end and saves it.
                call.cancel()

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def chat(request: Request) -> Response:
        async def run() -> Response:
            body = await _body(request)
            cid = _id(body.get("conversation_id", ""), "The conversation id", empty_ok=True)
            question = str(body.get("question", "")).strip()
            if not question:
                raise BadRequest("Type a question first.")
            if len(question) > MAX_QUESTION_CHARS:
                raise BadRequest(f"A question has at most {MAX_QUESTION_CHARS} characters.")
            return stream(
                console.agent.Chat(
                    pb.ChatRequest(conversation_id=cid, question=question),
                    metadata=console.metadata(request),
                )
            )

        return await handle(request, run)

    async def confirm(request: Request) -> Response:
        async def run() -> Response:
            body = await _body(request)
            approved = body.get("approved")
            if not isinstance(approved, bool):
                raise BadRequest("approved must be true or false.")
            # Exactly the three fields the brief names.
            return stream(
                console.agent.Confirm(
                    pb.ConfirmRequest(
                        conversation_id=_id(body.get("conversation_id"), "The conversation id"),
                        message_id=_id(body.get("message_id"), "The card's message id"),
                        approved=approved,
                    ),
                    metadata=console.metadata(request),
                )
            )

        return await handle(request, run)

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await console.open()
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            await console.close()

    return Starlette(
        routes=[
            Route("/", index),
            Route("/healthz", health),
            Route("/api/me", me),
            Route("/api/conversations", conversations),
            Route("/api/conversations/batch-delete", batch_delete, methods=["POST"]),
            Route("/api/conversations/{cid}/messages", messages),
            Route("/api/conversations/{cid}/inspector", inspector),
            Route("/api/conversations/{cid}/rename", rename, methods=["POST"]),
            Route("/api/conversations/{cid}", delete, methods=["DELETE"]),
            Route("/api/chat", chat, methods=["POST"]),
            Route("/api/confirm", confirm, methods=["POST"]),
            Route("/api/stop", stop, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=lifespan,
    )
