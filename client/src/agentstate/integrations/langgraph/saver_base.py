"""What both halves of AgentStateSaver share: connections, thread bookkeeping, and the
encoding of checkpoints and writes (no call of the service is made here)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import json
import os
import random
import socket
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from agentstate import client as state
from agentstate.client import (
    AsyncStateClient,
    ChannelSecurity,
    ChannelValue,
    CheckpointWrite,
    ClientSettings,
    NewCheckpoint,
    PruneStrategy,
    StateClient,
    StateSnapshot,
    StoredCheckpoint,
)
from agentstate.integrations._connection import BoundedCache, ClosesItsConnection, Connection
from agentstate.integrations._ttl import TimeToLive, time_to_live

DEFAULT_USER_ID = "langgraph"
# A channel whose version changed but that holds no value (LangGraph's savers store the
# same marker).
_EMPTY = "empty"
_PRUNE_STRATEGIES = {"keep_latest": PruneStrategy.KEEP_LATEST, "delete": PruneStrategy.DELETE_ALL}
THREAD_TITLE = "LangGraph thread"
BATCH = 1000  # the service's limit of run ids / conversations per call
PAGE = 100  # the service's largest page of checkpoints
MAX_CACHED = 10_000  # threads whose conversation id a saver remembers
# The users a thread ran under besides the saver's own, in the saver user's conversation
# of the thread (delete_thread is given the thread id only).
USERS_STATE_KEY = "langgraph.thread_users"
MAX_INDEX_ATTEMPTS = 20
DEFAULT_RUN_LEASE_SECONDS = 60.0
# How long put_writes waits for its checkpoint's put (LangGraph may send a step's writes
# before that put arrives, with durability="async") before it says the checkpoint is not
# stored; and its polling: every WRITES_POLL_SECONDS while this saver puts that
# checkpoint, else asking the service again with a backoff up to WRITES_RETRY_SECONDS.
WRITES_WAIT_SECONDS = 30.0
# ... and how long, once a put of the thread failed with no put succeeding since: LangGraph
# chains a run's puts, so after a failed one it sends none of that run's later checkpoints,
# and their writes would otherwise wait WRITES_WAIT_SECONDS for nothing. Not at once: a new
# run's writes may come just before its first put starts.
WRITES_WAIT_AFTER_FAILED_PUT_SECONDS = 1.0
# How long a task's ordinary pending writes may wait for the next put of their checkpoint's
# child, which then carries them (one call per step, the writes and the checkpoint they
# produce in one transaction); after that they are sent alone. LangGraph itself never
# waits for put_writes (it sends them in the background), except for the writes below.
DEFAULT_WRITES_DELAY_SECONDS = 0.02
# Writes sent at once, never held: they end a run (a node interrupted or failed), a
# resume's answer, or ones LangGraph waits for before running an error handler.
_SENT_AT_ONCE = frozenset({*WRITES_IDX_MAP, "__error_source_node__"})
# Writes a put carries at most (beyond them they are sent alone first).
CARRY_MAX_WRITES = 1000
CARRY_MAX_BYTES = 1 << 20
WRITES_POLL_SECONDS = 0.002
WRITES_RETRY_SECONDS = 0.1
# Channels whose update makes LangGraph run another step: a checkpoint of the run loop
# that updated none of them is the run's last.
_TRIGGER_PREFIXES = ("branch:to:", "join:", "__start__", "__pregel_tasks")
# Writes that end a run: a node interrupted, or failed.
_ENDING_WRITES = frozenset({"__interrupt__", "__error__"})
_STARTING_SOURCES = frozenset({"input", "fork", "update"})
MAX_LATEST_READS = 256
# (saver, user, thread) -> the head that the last read of the thread's latest checkpoint
# returned in this context: update_state reads it, then writes on it (CAS against it).
_LATEST_READ: contextvars.ContextVar[dict[tuple[int, str, str], str] | None] = (
    contextvars.ContextVar("agentstate_langgraph_latest_read", default=None)
)


WriteKey = tuple[str, str, str, str]  # (user, thread, namespace, checkpoint id)


@dataclass
class HeldWrites:
    """Pending writes of one checkpoint held for the put of its child (see
    DEFAULT_WRITES_DELAY_SECONDS), and the timer that sends them alone."""

    conversation: str
    writes: list[CheckpointWrite] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None  # the asyncio methods' timer
    since: float = field(default_factory=time.monotonic)

    def cancel(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


@dataclass
class RunLease:
    """The run lease this saver holds on a thread: taken at a run's first put, released
    at its last (or when it interrupts or fails), renewed as the run puts."""

    task_id: str
    renewed: float  # time.monotonic() of the last acquire or renew
    stored: list[str] = field(default_factory=list)  # checkpoints this run stored
    # The checkpoint whose pending writes ended the run (an interrupt, a failure): the
    # lease goes once it is stored (its put may still be in flight when they arrive).
    ends_at: str = ""


_BRANCHING_SOURCES = frozenset({"fork", "update"})


class CheckpointConflict(state.CheckpointConflict):
    """Another writer extended this thread's history first: this write was refused and
    nothing of it was stored. Re-read the thread (`get_tuple`) before writing again.

    `is_stale_write_owner_error` marks it as a superseded writer's refusal, the name the
    proposed write-ownership capability of langgraph-checkpoint-conformance uses."""

    is_stale_write_owner_error = True

    @classmethod
    def of(cls, error: state.CheckpointConflict) -> CheckpointConflict:
        return cls(error.message, code=error.code, reason=error.reason, metadata=error.metadata)


def refused(
    thread: str,
    checkpoint_id: str,
    stored: Sequence[str],
    why: str,
    error: state.StateError,
) -> CheckpointConflict:
    """The refusal of a put, saying exactly what of its run is and is not stored."""
    if stored:
        what = (
            f"this run's earlier checkpoints {list(stored)!r} are stored; checkpoint "
            f"{checkpoint_id!r} and the rest of the run are not"
        )
    else:
        what = "nothing of this run was stored"
    return CheckpointConflict(
        f"thread {thread!r}: {why}: {what}. Read the thread again (get_state) before "
        "running it again.",
        code=error.code,
        reason=error.reason,
        metadata=error.metadata,
    )


class ThreadDeleted(state.NotFound):
    """The thread was deleted while this saver was writing it: the write was refused,
    so a late write never brings a deleted thread back."""


@contextlib.contextmanager
def langgraph_errors(what: str = "") -> Iterator[None]:
    """What the service refuses as malformed (an id with NUL, one too long) is a
    ValueError to LangGraph's callers, as a bad config is (`what` names the ids)."""
    try:
        yield
    except state.InvalidArgument as exc:
        raise ValueError(f"{what}: {exc.message}" if what else exc.message) from exc


def thread_ids(user: str, thread: str) -> str:
    """The ids of a thread, for an error message."""
    return f"thread_id {thread[:60]!r} (user_id {user[:60]!r}) refused"


def thread_users(found: StateSnapshot | None) -> list[str]:
    if found is None:
        return []
    users = json.loads(found.payload).get("users", [])
    return [str(u) for u in users]


def partly_deleted(
    thread: str, deleted: list[str], failed: str, error: state.StateError
) -> state.StateError:
    """The error of a delete_thread that stopped part way, saying what it deleted."""
    done = f"deleted under users {deleted!r}" if deleted else "deleted nothing"
    return type(error)(
        f"delete_thread({thread!r}) {done}; the thread of user {failed!r} and any later ones "
        f"are still stored (run it again): {error.message}",
        code=error.code,
        reason=error.reason,
        metadata=error.metadata,
    )


def _configurable(config: RunnableConfig) -> dict[str, Any]:
    configurable = config.get("configurable")
    if not isinstance(configurable, dict):
        raise ValueError('config must have a "configurable" mapping with a "thread_id"')
    return configurable


def thread_id_of(config: RunnableConfig) -> str:
    thread_id = _configurable(config).get("thread_id")
    if thread_id is None or thread_id == "":
        raise ValueError(
            'Checkpointer requires a "thread_id" in config["configurable"] '
            '(for example {"configurable": {"thread_id": "1"}})'
        )
    return str(thread_id)


def namespace_of(config: RunnableConfig) -> str:
    return str(_configurable(config).get("checkpoint_ns") or "")


class SaverBase(ClosesItsConnection, BaseCheckpointSaver[str]):
    """AgentStateSaver without its checkpoint methods (saver_async.py, saver_sync.py)."""

    def __init__(
        self,
        target: str | AsyncStateClient | StateClient | ClientSettings | None = None,
        *,
        address: str | None = None,
        user_id: str = DEFAULT_USER_ID,
        client: AsyncStateClient | None = None,
        sync_client: StateClient | None = None,
        settings: ClientSettings | None = None,
        serde: SerializerProtocol | None = None,
        run_lease_seconds: float = DEFAULT_RUN_LEASE_SECONDS,
        writes_delay_seconds: float = DEFAULT_WRITES_DELAY_SECONDS,
        security: ChannelSecurity | None = None,
        ttl_seconds: int | None = None,
        ttl_renewed_by_writes: bool = False,
    ) -> None:
        """`security`: TLS, a client certificate and a service token for the connections
        this saver opens (agentstate.client.tls; default: what `settings` say, else
        plaintext). `ttl_seconds`: the time to live of each thread's conversation, set
        when the thread's first checkpoint or write creates it (None: none), renewed by
        each checkpoint with `ttl_renewed_by_writes`; a config's `ttl_seconds` and
        `ttl_renewed_by_writes` in "configurable" override both for the thread it creates.
        ValueError when not a positive int. `writes_delay_seconds`: how long a task's
        ordinary pending writes wait for the put of the checkpoint's child, which stores
        them in its own call and transaction (0: every put_writes is its own call)."""
        super().__init__(serde=serde)
        self.ttl = time_to_live(ttl_seconds, ttl_renewed_by_writes)
        if not 1 <= run_lease_seconds <= 3600:
            raise ValueError("run_lease_seconds must be between 1 and 3600")
        if not 0 <= writes_delay_seconds <= 10:
            raise ValueError("writes_delay_seconds must be between 0 and 10")
        self.writes_delay_seconds = float(writes_delay_seconds)
        if not isinstance(user_id, str) or not user_id:
            raise ValueError("user_id must be a non-empty string")
        self._connection = Connection(
            target,
            address=address,
            client=client,
            sync_client=sync_client,
            settings=settings,
            security=security,
            who="AgentStateSaver",
        )
        self.user_id = user_id
        # (user, thread) -> conversation id: threads this saver has seen.
        self._conversations: BoundedCache[tuple[str, str], str] = BoundedCache(MAX_CACHED)
        # Threads deleted under a run of this saver: its later writes are refused too
        # (never a new conversation), until the thread is read again (a new run).
        self._deleted_threads: BoundedCache[tuple[str, str], state.NotFound] = BoundedCache(
            MAX_CACHED
        )
        # Runs on one thread are serialised by a run lease (the service's lease RPCs), so
        # that a refused run is refused at its first put and leaves nothing behind.
        self.run_lease_seconds = float(run_lease_seconds)
        self._holder = f"langgraph {socket.gethostname()[:80]} pid {os.getpid()} {uuid.uuid4()}"
        self._leases: BoundedCache[tuple[str, str], RunLease] = BoundedCache(MAX_CACHED)
        # A run's puts and its writes run on LangGraph's executor threads: the two checks
        # of whether the run ended (_ended_by, _stored_in_run) must not interleave.
        self._lease_lock = threading.Lock()
        # Checkpoints refused by the service: the rest of their run is refused here, so a
        # refused run sends nothing more (checkpoint id -> the refusal).
        self._refused: BoundedCache[str, CheckpointConflict] = BoundedCache(MAX_CACHED)
        # Threads whose run this saver saw refused: the run's later puts and writes (which
        # LangGraph sends before it learns of the refusal) are refused here too, until the
        # thread is read again (a new run).
        self._refused_threads: BoundedCache[tuple[str, str], CheckpointConflict] = BoundedCache(
            MAX_CACHED
        )
        # Checkpoints being put, and what became of the puts that failed (user, thread,
        # namespace, checkpoint id): pending writes are sent only once their checkpoint is
        # stored (the service refuses writes of a checkpoint that is not, so a refused put
        # never leaves writes behind), and fail with their checkpoint's put.
        self._putting: set[tuple[str, str, str, str]] = set()
        self._put_failed: BoundedCache[tuple[str, str, str, str], str] = BoundedCache(MAX_CACHED)
        # (user, thread) -> when and how its last put failed: writes waiting for a put
        # that LangGraph will not send (the put before it failed) stop waiting then.
        self._thread_put_failed: BoundedCache[tuple[str, str], tuple[float, str]] = BoundedCache(
            MAX_CACHED
        )
        # (user, thread) -> when its last put succeeded (a new run after a failed one).
        self._thread_put_stored: BoundedCache[tuple[str, str], float] = BoundedCache(MAX_CACHED)
        # (user, thread) -> when a run of it was last refused here (kept when a new run
        # reads the thread, unlike _refused_threads): held writes of a refused run, whose
        # checkpoint LangGraph never puts, are dropped when the timer sends them too late.
        self._thread_refused_at: BoundedCache[tuple[str, str], float] = BoundedCache(MAX_CACHED)

        # Pending writes held for their checkpoint's child put (see HeldWrites); the
        # checkpoints whose child put took them (later writes of those go alone); the
        # flushes under way (asyncio tasks, kept referenced); and what became of a flush
        # that failed, raised by the thread's next call (user, thread) -> error.
        self._held: dict[WriteKey, HeldWrites] = {}
        # Checkpoints this saver stored or read: held writes of any other wait for its
        # put before they are sent alone (no call the service must refuse).
        self._stored_here: BoundedCache[WriteKey, bool] = BoundedCache(MAX_CACHED)
        self._carried: BoundedCache[WriteKey, bool] = BoundedCache(MAX_CACHED)
        self._flushes: set[asyncio.Task[None]] = set()
        # When held writes are due (the synchronous methods' timer thread).
        self._flush_due: list[tuple[float, WriteKey]] = []
        self._flush_due_lock = threading.Condition()
        self._flusher: threading.Thread | None = None
        self._flush_failed: BoundedCache[tuple[str, str], str] = BoundedCache(MAX_CACHED)

    # ------------------------------------------------------------ connections

    @property
    def aclient(self) -> AsyncStateClient:
        return self._connection.aclient()

    @property
    def sync_client(self) -> StateClient:
        return self._connection.sync_client()

    def _user(self, config: RunnableConfig | None) -> str:
        if config is not None:
            user = _configurable(config).get("user_id")
            if user:
                return str(user)
        return self.user_id

    def _ttl(self, config: RunnableConfig | None) -> TimeToLive | None:
        """The time to live of a thread that `config` creates: its configurable
        `ttl_seconds` / `ttl_renewed_by_writes`, else the saver's (an explicit
        `ttl_seconds: None` is none)."""
        configurable = _configurable(config) if config is not None else {}
        default = self.ttl or TimeToLive(0)
        return time_to_live(
            configurable.get("ttl_seconds", default.seconds or None),
            configurable.get("ttl_renewed_by_writes", default.renewed_by_writes),
            what='config["configurable"]["ttl_seconds"]',
        )

    # ---------------------------------------------------------- thread lookup

    def _forget(self, user: str, thread: str) -> None:
        self._conversations.pop((user, thread), None)

    def _deleted(self, user: str, thread: str, error: state.NotFound) -> ThreadDeleted:
        self._forget(user, thread)
        self._deleted_threads[(user, thread)] = error
        return ThreadDeleted(
            f"thread {thread!r} was deleted while this run was writing it; nothing was written",
            code=error.code,
            reason=error.reason,
            metadata=error.metadata,
        )

    def _writer_conversation_known(self, user: str, thread: str) -> None:
        error = self._deleted_threads.get((user, thread))
        if error is not None:
            raise self._deleted(user, thread, error)
        conflict = self._refused_threads.get((user, thread))
        if conflict is not None:
            raise conflict

    def _refuse_run(self, user: str, thread: str, error: CheckpointConflict) -> None:
        self._refused_threads[(user, thread)] = refused(
            thread, "", (), "its run was refused earlier", error
        )
        self._thread_refused_at[(user, thread)] = time.monotonic()

    def _refused_since(self, user: str, thread: str, since: float) -> bool:
        """A run of the thread was refused at or after `since`."""
        at = self._thread_refused_at.get((user, thread))
        return at is not None and at >= since

    def _start_put(self, key: tuple[str, str, str, str]) -> None:
        with self._lease_lock:
            self._put_failed.pop(key, None)
            self._putting.add(key)

    def _end_put(self, key: tuple[str, str, str, str], failure: BaseException | None) -> None:
        """The put ended: its writes may go (stored), or fail with it (refused, failed).
        A refusal is recorded (self._refused) before this, so a write never sees neither."""
        with self._lease_lock:
            if failure is None:
                self._stored_here[key] = True
                self._thread_put_stored[key[:2]] = time.monotonic()
            else:
                why = f"{type(failure).__name__}: {failure}"
                self._put_failed[key] = why
                self._thread_put_failed[key[:2]] = (time.monotonic(), why)
            self._putting.discard(key)

    def _writes_may_go(self, key: tuple[str, str, str, str]) -> bool:
        """False while this saver is putting the writes' checkpoint; raises when that put
        was refused or failed (nothing of the writes is sent)."""
        _, thread, namespace, checkpoint_id = key
        with self._lease_lock:
            if key in self._putting:
                return False
            failed = self._put_failed.get(key)
        self._writes_refused(checkpoint_id, thread)
        if failed is not None:
            raise state.CheckpointNotStored(
                f"thread {thread!r}: pending writes for checkpoint {checkpoint_id!r} "
                f"(namespace {namespace!r}) were not stored: the put of that checkpoint "
                f"failed ({failed})"
            )
        return True

    def _writes_not_stored(
        self,
        key: tuple[str, str, str, str],
        started: float,
        error: state.CheckpointNotStored,
    ) -> state.CheckpointNotStored | None:
        """The service holds no checkpoint for these writes: None to wait for its put, or
        the error to raise (the run was refused, a put of the thread failed since the
        writes arrived, or WRITES_WAIT_SECONDS passed)."""
        user, thread, _, checkpoint_id = key
        self._writer_conversation_known(user, thread)  # the run was refused: raises
        waited = time.monotonic() - started
        failed = self._thread_put_failed.get((user, thread))
        if failed is not None and failed[0] >= started:
            why = f"a put of this thread failed meanwhile ({failed[1]})"
        elif self._last_put_failed(user, thread) and waited > WRITES_WAIT_AFTER_FAILED_PUT_SECONDS:
            assert failed is not None
            why = f"the thread's last put failed ({failed[1]}), and no put came since"
        elif waited > WRITES_WAIT_SECONDS:
            why = f"waited {waited:.0f} s for its put; put the checkpoint before its writes"
        else:
            return None
        return state.CheckpointNotStored(
            f"thread {thread!r}: pending writes for checkpoint {checkpoint_id!r} were not "
            f"stored: that checkpoint is not stored ({why})",
            code=error.code,
            reason=error.reason,
            metadata=error.metadata,
        )

    # ---------------------------------------------------- held pending writes

    def _sent_at_once(self, writes: Sequence[CheckpointWrite]) -> bool:
        return self.writes_delay_seconds <= 0 or any(w.channel in _SENT_AT_ONCE for w in writes)

    def _hold(self, key: WriteKey, conversation: str, writes: Sequence[CheckpointWrite]) -> bool:
        """Hold writes for their checkpoint's child put: False when that put has taken
        the held writes already (these go alone). The caller starts the timer."""
        with self._lease_lock:
            if self._carried.get(key):
                return False
            held = self._held.get(key)
            if held is None:
                held = self._held[key] = HeldWrites(conversation)
            held.writes.extend(writes)
            return True

    def _take_held(self, key: WriteKey, *, carried: bool) -> list[CheckpointWrite]:
        """The writes held for `key`, no longer held; `carried`: a put of its child
        takes them, and later writes of it go alone."""
        with self._lease_lock:
            held = self._held.pop(key, None)
            if carried:
                self._carried[key] = True
        if held is None:
            return []
        held.cancel()
        return held.writes

    @staticmethod
    def _one_call(writes: Sequence[CheckpointWrite]) -> list[CheckpointWrite]:
        """Writes gathered from several put_writes as one call stores them: per (task,
        idx) the first of idx >= 0 (a retry changes nothing), the last of idx < 0."""
        kept: dict[tuple[str, int], CheckpointWrite] = {}
        for write in writes:
            key = (write.task_id, write.idx)
            if write.idx < 0 or key not in kept:
                kept[key] = write
        return list(kept.values())

    def _held_keys(self, user: str | None = None, thread: str | None = None) -> list[WriteKey]:
        with self._lease_lock:
            return [
                k
                for k in self._held
                if (user is None or k[0] == user) and (thread is None or k[1] == thread)
            ]

    def _last_put_failed(self, user: str, thread: str) -> bool:
        """The thread's last put failed, and none has succeeded since."""
        failed = self._thread_put_failed.get((user, thread))
        stored = self._thread_put_stored.get((user, thread))
        return failed is not None and (stored is None or stored < failed[0])

    def _due_to_flush(self, key: WriteKey) -> bool:
        """Whether held writes whose delay is over go alone now: once their checkpoint is
        stored (until then its own put is on the way, and the put of its child will carry
        them), or when they waited WRITES_WAIT_SECONDS (the service then says what
        became of that checkpoint). False: the timer is armed again."""
        with self._lease_lock:
            held = self._held.get(key)
            if held is None:
                return False
            if (
                self._stored_here.get(key)
                or self._put_failed.get(key) is not None  # the service says what it holds
                or self._last_put_failed(key[0], key[1])  # (its checkpoint may never come)
                or time.monotonic() - held.since > WRITES_WAIT_SECONDS
            ):
                return True
            held.timer = None
            return False

    def _drop_held(self, thread: str) -> None:
        """Forget the writes held for a thread being deleted (of every user)."""
        for key in self._held_keys(thread=thread):
            self._take_held(key, carried=False)

    def _set_timer(self, key: WriteKey, timer: asyncio.TimerHandle) -> None:
        with self._lease_lock:
            held = self._held.get(key)
            if held is not None and held.timer is None:
                held.timer = timer
                return
        timer.cancel()  # taken meanwhile

    def _aschedule_flush(self, key: WriteKey) -> None:
        """Send the held writes alone unless a put takes them first (asyncio)."""
        loop = asyncio.get_running_loop()
        self._set_timer(key, loop.call_later(self.writes_delay_seconds, self._astart_flush, key))

    async def _await_flushes(self) -> None:
        running = [t for t in self._flushes if t.get_loop() is asyncio.get_running_loop()]
        if running:
            await asyncio.gather(*running, return_exceptions=True)

    def _wait_flushes(self) -> None:
        """The synchronous twin has no asyncio flushes to wait for: its timer thread sends
        held writes through the synchronous client, which close() leaves open meanwhile."""

    def _astart_flush(self, key: WriteKey) -> None:
        task = asyncio.ensure_future(self._aflush(key))
        self._flushes.add(task)
        task.add_done_callback(self._flushes.discard)

    def _schedule_flush(self, key: WriteKey) -> None:
        """Send the held writes alone unless a put takes them first (threads: one timer
        thread per saver, not one per step)."""
        with self._flush_due_lock:
            heapq.heappush(self._flush_due, (time.monotonic() + self.writes_delay_seconds, key))
            if self._flusher is None or not self._flusher.is_alive():
                self._flusher = threading.Thread(
                    target=self._run_flusher, name="AgentStateSaver writes", daemon=True
                )
                self._flusher.start()
            self._flush_due_lock.notify()

    def _run_flusher(self) -> None:
        """Send held writes whose delay is over (a key a put took meanwhile is no-op)."""
        while True:
            with self._flush_due_lock:
                while not self._flush_due:
                    self._flush_due_lock.wait()
                when, key = self._flush_due[0]
                wait = when - time.monotonic()
                if wait > 0:
                    self._flush_due_lock.wait(wait)
                    continue
                heapq.heappop(self._flush_due)
            self._flush_quietly(key)

    def _flush_quietly(self, key: WriteKey) -> None:
        with contextlib.suppress(Exception):  # recorded by _flush for the next call
            self._flush(key)

    async def _aflush(self, key: WriteKey, *, now: bool = False) -> None:
        raise NotImplementedError  # saver_async.py

    def _flush(self, key: WriteKey, *, now: bool = False) -> None:
        raise NotImplementedError  # saver_sync.py

    def _flush_failure(self, key: WriteKey, why: str) -> None:
        self._flush_failed[key[:2]] = f"checkpoint {key[3]!r}: {why}"

    def _raise_flush_failure(self, user: str, thread: str) -> None:
        """Held writes of this thread that could not be stored fail its next call."""
        why = self._flush_failed.pop((user, thread), None)
        if why is not None:
            raise state.CheckpointNotStored(
                f"thread {thread!r}: pending writes acknowledged earlier were not stored "
                f"({why}); run the thread again from its last checkpoint"
            )

    @staticmethod
    def _carry(writes: Sequence[CheckpointWrite]) -> bool:
        """Whether a put may carry these writes (else they are sent alone first)."""
        return (
            len(writes) <= CARRY_MAX_WRITES and sum(len(w.value) for w in writes) <= CARRY_MAX_BYTES
        )

    def _lease_use(
        self,
        run: RunLease | None,
        ends: bool,
    ) -> state.CheckpointRunLease | None:
        """What this put does with the run lease: take it (none held), renew it (due),
        release it (the run's last put), or nothing."""
        ttl_ms = int(self.run_lease_seconds * 1000)
        if run is None:
            return state.CheckpointRunLease(holder=self._holder, ttl_ms=ttl_ms, release=ends)
        due = self._lease_due(run)
        if due or ends:
            return state.CheckpointRunLease(
                task_id=run.task_id, ttl_ms=ttl_ms if due else 0, release=ends
            )
        return None

    # --------------------------------------------------------------- run leases

    def _remember_latest(self, user: str, thread: str, config: RunnableConfig, head: str) -> None:
        """Record (for update_state in this context) which head a read of the thread's
        latest checkpoint returned; a read of a chosen checkpoint forgets it."""
        if namespace_of(config):
            return
        key = (id(self), user, thread)
        latest = dict(_LATEST_READ.get() or {})
        latest.pop(key, None)
        if not get_checkpoint_id(config):
            latest[key] = head
            while len(latest) > MAX_LATEST_READS:  # bounded: the oldest reads go first
                del latest[next(iter(latest))]
        _LATEST_READ.set(latest)

    def _lease_due(self, run: RunLease) -> bool:
        return time.monotonic() - run.renewed > self.run_lease_seconds / 3

    @staticmethod
    def _starts_run(metadata: CheckpointMetadata) -> bool:
        return metadata.get("source") in _STARTING_SOURCES

    @staticmethod
    def _ends_run(run: RunLease, checkpoint: Checkpoint, metadata: CheckpointMetadata) -> bool:
        """Whether this is the run's last checkpoint: an update_state, one whose writes
        ended the run, or a step of the run loop after which no node is triggered."""
        if run.ends_at == checkpoint["id"]:
            return True
        source = metadata.get("source")
        if source == "update":
            return True
        updated = checkpoint.get("updated_channels")
        if source != "loop" or updated is None:
            return False  # not knowable: the lease lapses after run_lease_seconds
        return not any(str(c).startswith(_TRIGGER_PREFIXES) for c in updated)

    def _ended_by(
        self, user: str, thread: str, checkpoint_id: str, writes: Sequence[CheckpointWrite]
    ) -> bool:
        """Whether these writes end the run holding the lease now (its checkpoint is
        stored); when its put is still on the way, that put releases the lease."""
        if not any(w.channel in _ENDING_WRITES for w in writes):
            return False
        with self._lease_lock:
            run = self._leases.get((user, thread))
            if run is None:
                return False
            if checkpoint_id in run.stored:
                return True
            run.ends_at = checkpoint_id
            return False

    def _stored_in_run(
        self, run: RunLease, checkpoint: Checkpoint, metadata: CheckpointMetadata
    ) -> bool:
        """Record a checkpoint the run stored; whether it was the run's last."""
        with self._lease_lock:
            run.stored.append(checkpoint["id"])
            return self._ends_run(run, checkpoint, metadata)

    def _refused_before(self, new: NewCheckpoint, thread: str) -> None:
        """Refuse here a put that extends a checkpoint the service refused."""
        error = self._refused.get(new.parent_checkpoint_id) if new.parent_checkpoint_id else None
        if error is not None:
            self._refused[new.checkpoint_id] = error
            raise refused(thread, new.checkpoint_id, (), "its run was refused earlier", error)

    def _writes_refused(self, checkpoint_id: str, thread: str) -> None:
        error = self._refused.get(checkpoint_id)
        if error is not None:
            raise refused(thread, checkpoint_id, (), "its run was refused earlier", error)

    # ------------------------------------------------------- encode / decode

    def _new_checkpoint(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[NewCheckpoint, str | None]:
        """The checkpoint to store and the head it must extend. Serialized before any
        call: a value LangGraph's serializer refuses raises its own TypeError and nothing
        is sent. The put then failed, so writes waiting for this checkpoint fail at once
        (not after WRITES_WAIT_SECONDS)."""
        try:
            return self._serialized_checkpoint(config, checkpoint, metadata, new_versions)
        except Exception as exc:
            key = (self._user(config), thread_id_of(config), namespace_of(config), checkpoint["id"])
            self._end_put(key, exc)
            raise

    def _serialized_checkpoint(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> tuple[NewCheckpoint, str | None]:
        stored: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = stored.pop("channel_values")
        new_values = []
        for channel, version in new_versions.items():
            value_type, value = (
                self.serde.dumps_typed(values[channel]) if channel in values else (_EMPTY, b"")
            )
            new_values.append(ChannelValue(channel, str(version), value_type, value))
        checkpoint_type, checkpoint_bytes = self.serde.dumps_typed(stored)
        full_metadata = get_serializable_checkpoint_metadata(config, metadata)
        parent = get_checkpoint_id(config) or ""
        new = NewCheckpoint(
            checkpoint_id=checkpoint["id"],
            checkpoint=checkpoint_bytes,
            namespace=namespace_of(config),
            parent_checkpoint_id=parent,
            checkpoint_type=checkpoint_type,
            metadata_json=json.dumps(full_metadata, ensure_ascii=False).encode(),
            channel_versions={k: str(v) for k, v in checkpoint["channel_versions"].items()},
            new_values=tuple(new_values),
        )
        # The head this checkpoint extends: its parent, or none yet for a thread's first
        # checkpoint (LangGraph's input checkpoint, step -1). What the run loop writes
        # ("input", "loop") is checked; forks and update_state ("fork", "update") branch
        # from the checkpoint a caller chose on purpose (time travel), so they are not.
        expected_head: str | None = None
        if metadata.get("source") not in _BRANCHING_SOURCES:
            if parent:
                expected_head = parent
            elif metadata.get("step") == -1:
                expected_head = ""
        elif not new.namespace:
            # update_state on the thread's latest checkpoint (read in this context, not
            # chosen by id) must still extend it: two concurrent updates never fork.
            latest = (_LATEST_READ.get() or {}).get(
                (id(self), self._user(config), thread_id_of(config))
            )
            if latest is not None and latest == parent:
                expected_head = parent
        return new, expected_head

    def _writes(
        self, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> list[CheckpointWrite]:
        encoded = []
        for idx, (channel, value) in enumerate(writes):
            value_type, data = self.serde.dumps_typed(value)
            encoded.append(
                CheckpointWrite(
                    task_id, WRITES_IDX_MAP.get(channel, idx), channel, value_type, data, task_path
                )
            )
        return encoded

    @staticmethod
    def _writes_target(config: RunnableConfig) -> tuple[str, str]:
        checkpoint_id = get_checkpoint_id(config)
        if not checkpoint_id:
            raise ValueError('put_writes requires config["configurable"]["checkpoint_id"]')
        return namespace_of(config), checkpoint_id

    @staticmethod
    def _list_arguments(
        config: RunnableConfig, filter: dict[str, Any] | None, before: RunnableConfig | None
    ) -> dict[str, Any]:
        return {
            "namespace": namespace_of(config) if "checkpoint_ns" in _configurable(config) else None,
            "metadata_filter": filter or None,
            "before_checkpoint_id": (get_checkpoint_id(before) or "") if before else "",
        }

    def _tuple(self, thread: str, stored: StoredCheckpoint) -> CheckpointTuple:
        checkpoint = self.serde.loads_typed((stored.checkpoint_type, stored.checkpoint))
        checkpoint["channel_values"] = {
            v.channel: self.serde.loads_typed((v.value_type, v.value))
            for v in stored.channel_values
            if v.value_type != _EMPTY
        }
        config: RunnableConfig = {
            "configurable": {
                "thread_id": thread,
                "checkpoint_ns": stored.namespace,
                "checkpoint_id": stored.checkpoint_id,
            }
        }
        parent: RunnableConfig | None = None
        if stored.parent_checkpoint_id:
            parent = {
                "configurable": {
                    "thread_id": thread,
                    "checkpoint_ns": stored.namespace,
                    "checkpoint_id": stored.parent_checkpoint_id,
                }
            }
        return CheckpointTuple(
            config=config,
            checkpoint=checkpoint,
            metadata=json.loads(stored.metadata_json),
            parent_config=parent,
            pending_writes=[
                (w.task_id, w.channel, self.serde.loads_typed((w.value_type, w.value)))
                for w in stored.pending_writes
            ],
        )

    @staticmethod
    def _stored_config(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
        return {
            "configurable": {
                "thread_id": thread_id_of(config),
                "checkpoint_ns": namespace_of(config),
                "checkpoint_id": checkpoint["id"],
            }
        }

    def get_next_version(self, current: str | None, channel: None = None) -> str:
        """Versions that sort as strings, as LangGraph's PostgreSQL saver writes them."""
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(current.split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"


def prune_strategy(strategy: str) -> PruneStrategy:
    if strategy not in _PRUNE_STRATEGIES:
        raise ValueError(f'strategy must be "keep_latest" or "delete", not {strategy!r}')
    return _PRUNE_STRATEGIES[strategy]
