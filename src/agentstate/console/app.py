"""The console's web app (Starlette): a page, a small JSON API and turn streams (SSE).

Every call to the agent service carries the user as `agentstate-user-id` metadata; the
user comes from the trusted proxy's header (CONSOLE_USER_HEADER) or, in development,
CONSOLE_DEV_USER. Turn streams are `text/event-stream` responses to POSTs: one `data:`
line of JSON per agent event. A browser that goes away does not stop the turn (the
agent finishes and saves it); the page then resumes from the message records.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import json
import re
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from agentstate.agent.v1 import agent_service_pb2 as pb
from agentstate.agent.v1 import agent_service_pb2_grpc as pb_grpc
from agentstate.client import StateError
from agentstate.client.metadata import PROXY_SECRET_METADATA_KEY, USER_ID_METADATA_KEY
from agentstate.client.service_config import channel_options
from agentstate.client.tls import ChannelSecurity
from agentstate.console.config import ConsoleSettings
from agentstate.console.present import (
    event_view,
    live_event_view,
    record_view,
    tool_outputs,
    unanswered,
)
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
    # The agent refused the console's credentials: the user is signed in, the console is
    # not trusted (no or a wrong CONSOLE_AGENT_PROXY_SECRET, or an agent in jwt mode).
    "UNAUTHENTICATED": (
        502,
        "The agent service did not accept this console's credentials, so nothing can be "
        "shown. An operator must check CONSOLE_AGENT_PROXY_SECRET.",
    ),
    "MODEL_FAILED": (
        502,
        "The model did not answer, so this turn did not finish. The service itself is "
        "fine: try again in a moment.",
    ),
}
_CODES = {
    grpc.StatusCode.NOT_FOUND: (
        404,
        "This conversation does not exist (it may have been deleted, or it is not yours).",
    ),
    grpc.StatusCode.UNAVAILABLE: (503, "The service is unreachable right now. Try again."),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "The service did not answer in time. Try again."),
    grpc.StatusCode.UNAUTHENTICATED: (
        502,
        "The agent service did not accept this console's credentials, so nothing can be "
        "shown. An operator must check CONSOLE_AGENT_PROXY_SECRET.",
    ),
}
# The console's own refusal when no user came with the request (not the agent's).
NOT_SIGNED_IN = "You are not signed in (no user from the authenticating proxy)."


# How often an attached page's stream reads the running turn's record.
LIVE_POLL_SECONDS = 0.25


def _conversation_json(c: Any) -> dict[str, Any]:
    return {
        "conversation_id": c.conversation_id,
        "title": c.title,
        "create_time": c.create_time.ToDatetime().isoformat() + "Z",
        "update_time": c.update_time.ToDatetime().isoformat() + "Z",
        "status": STATUS_NAMES.get(c.status, "UNSPECIFIED"),
        "labels": dict(c.labels),
    }


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


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
            raise BadRequest(NOT_SIGNED_IN, 401)
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

    async def index_posted(request: Request) -> Response:
        """The composer submitted as a plain form (its scripts had not loaded yet): the
        page comes back with the question still in the box, marked for the script to
        send once it runs. Nothing the user typed is lost."""
        # A urlencoded body, read here (python-multipart is not a dependency).
        form = urllib.parse.parse_qs((await request.body()).decode("utf-8", "replace"))
        question = (form.get("question") or [""])[0][:MAX_QUESTION_CHARS]
        page = (STATIC / "index.html").read_text(encoding="utf-8")
        page = page.replace(
            '<form id="composer" method="post" action="/"',
            '<form id="composer" method="post" action="/" data-pending="1"',
        ).replace(
            '<textarea id="question" name="question" rows="2"',
            '<textarea id="question" name="question" rows="2" data-escaped="1"',
        )
        page = page.replace("></textarea>", f">{html.escape(question)}</textarea>", 1)
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def me(request: Request) -> Response:
        async def run() -> Response:
            return JSONResponse(
                {
                    "user": console.user_of(request),
                    "trace_url_template": settings.trace_url_template,
                }
            )

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
                    "conversations": [_conversation_json(c) for c in page.items],
                    "next_page_token": page.next_page_token,
                }
            )

        return await handle(request, run)

    async def newest_first(request: Request, cid: str) -> Response:
        """The newest page of a conversation (`order=newest`), or the page before the
        record `before`: a long conversation opens where it ends, read newest first (one
        page, whatever the conversation's length). `earlier` names the oldest record
        shown, "" when there is nothing before it."""
        before = _id(request.query_params.get("before", ""), "before", empty_ok=True)
        page = await console.agent.ListMessages(
            # A record's id is the token of the records before it (agent-rpcs.md).
            pb.ListMessagesRequest(
                conversation_id=cid,
                page_size=settings.history_page_size,
                page_token=before,
                newest_first=True,
            ),
            metadata=console.metadata(request),
            timeout=console.timeout,
        )
        records = list(reversed(page.records))  # shown oldest first
        outputs = tool_outputs(records)
        if before and records and unanswered(records, outputs):
            # A card's call is answered in a later record: the newest page has none;
            # for a page before `before`, read on from its newest record (a record id
            # is also the oldest-first token of the records after it).
            after = await console.agent.ListMessages(
                pb.ListMessagesRequest(
                    conversation_id=cid,
                    page_size=settings.history_page_size,
                    page_token=records[-1].message_id,
                ),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            outputs = {**tool_outputs(after.records), **outputs}
        return JSONResponse(
            {
                "records": [record_view(r, others=outputs) for r in records],
                "next_page_token": "",
                "earlier": records[0].message_id if page.next_page_token else "",
            }
        )

    async def messages(request: Request) -> Response:
        async def run() -> Response:
            cid = _id(request.path_params["cid"], "The conversation id")
            if request.query_params.get("order") == "newest":
                return await newest_first(request, cid)
            page = await console.agent.ListMessages(
                pb.ListMessagesRequest(
                    conversation_id=cid,
                    page_size=settings.history_page_size,
                    page_token=request.query_params.get("page_token", ""),
                ),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            outputs = tool_outputs(page.records)
            if page.next_page_token and unanswered(page.records, outputs):
                # A card's call is answered in the next turn's record: look one page on.
                after = await console.agent.ListMessages(
                    pb.ListMessagesRequest(
                        conversation_id=cid,
                        page_size=settings.history_page_size,
                        page_token=page.next_page_token,
                    ),
                    metadata=console.metadata(request),
                    timeout=console.timeout,
                )
                outputs = {**tool_outputs(after.records), **outputs}
            return JSONResponse(
                {
                    "records": [record_view(r, others=outputs) for r in page.records],
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

    async def running_record(request: Request, cid: str) -> str:
        """The conversation's record still being written, "" when none is (the newest
        one is last: every page is read, 200 records at a time)."""
        token, found = "", ""
        while True:
            page = await console.agent.ListMessages(
                pb.ListMessagesRequest(conversation_id=cid, page_size=200, page_token=token),
                metadata=console.metadata(request),
                timeout=console.timeout,
            )
            for record in page.records:
                if record.status == pb.MESSAGE_STATUS_STREAMING:
                    found = record.message_id
            token = page.next_page_token
            if not token:
                return found

    async def live(request: Request) -> Response:
        """A running turn, attached to from any page (a reload, a second tab), whichever
        agent replica runs it: the events after `after`, then each new one as the agent
        writes it to the turn's record (read from the state service every LIVE_POLL_SECONDS),
        each with its `offset` so a dropped stream resumes where it stopped; `ended` once
        the turn was saved."""

        async def run() -> Response:
            cid = _id(request.path_params["cid"], "The conversation id")
            message_id = _id(
                request.query_params.get("message_id", ""), "The message id", empty_ok=True
            )
            try:
                after = max(0, int(request.query_params.get("after", "0")))
            except ValueError:
                raise BadRequest("after must be a whole number.") from None
            user = console.user_of(request)
            assert console.state is not None
            reader = console.state
            found = message_id or await running_record(request, cid)
            if found:
                await reader.live(user, cid, found)  # not found: refused before streaming

            async def events() -> AsyncIterator[str]:
                sent, task_id = after, ""
                if not found:  # nothing is being written (any more)
                    yield _sse({"type": "ended"})
                    return
                if not message_id:
                    yield _sse({"type": "record", "message_id": found})
                while True:
                    try:
                        running, task, journal = await reader.live(user, cid, found)
                    except StateError as exc:
                        _, message = explain_state_error(exc)
                        yield _sse({"type": "error", "message": message})
                        return
                    if task and task != task_id:
                        task_id = task
                        yield _sse({"type": "meta", "conversation_id": cid, "task_id": task})
                    for offset, data in enumerate(journal[sent:], start=sent + 1):
                        view = live_event_view(data)
                        if view is not None:
                            yield _sse({**view, "offset": offset})
                    sent = max(sent, len(journal))
                    if not running:
                        yield _sse({"type": "ended"})
                        return
                    await asyncio.sleep(LIVE_POLL_SECONDS)

            return StreamingResponse(
                events(),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
            )

        return await handle(request, run)

    async def framework(request: Request) -> Response:
        """A LangGraph thread, OpenAI Agents session or ADK session kept in this
        conversation, read-only ({"kind": "agentstate"} for the agent's own)."""

        async def run() -> Response:
            cid = _id(request.path_params["cid"], "The conversation id")
            assert console.state is not None
            return JSONResponse(await console.state.framework(console.user_of(request), cid))

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
            Route("/", index, methods=["GET", "HEAD"]),
            Route("/", index_posted, methods=["POST"]),
            Route("/healthz", health),
            Route("/api/me", me),
            Route("/api/conversations", conversations),
            Route("/api/conversations/batch-delete", batch_delete, methods=["POST"]),
            Route("/api/conversations/{cid}/messages", messages),
            Route("/api/conversations/{cid}/inspector", inspector),
            Route("/api/conversations/{cid}/live", live),
            Route("/api/conversations/{cid}/framework", framework),
            Route("/api/conversations/{cid}/rename", rename, methods=["POST"]),
            Route("/api/conversations/{cid}", delete, methods=["DELETE"]),
            Route("/api/chat", chat, methods=["POST"]),
            Route("/api/confirm", confirm, methods=["POST"]),
            Route("/api/stop", stop, methods=["POST"]),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ],
        lifespan=lifespan,
    )
