"""EraseUser's pace (issue 23): each batch holds about STATE_ERASE_BATCH_ROWS rows, and
after each the erase rests in proportion to the batch's own time (STATE_ERASE_DUTY_CYCLE),
so that other users' calls keep the database. Read from the erase's own log line (batches,
time in them, time resting) of a real erase on PostgreSQL, and from the tables."""

from __future__ import annotations

import asyncio
import logging
import re
import time

import pytest

from agentstate.common.config import ConfigError
from agentstate.state_service.config import StateServiceSettings, erase_settings
from agentstate.state_service.storage.base.lifecycle import EraseSettings
from agentstate.state_service.storage.postgres import PostgresStore
from agentstate.state_service.storage.postgres.lifecycle import ErasePace
from tests.state_service.test_erase_user import fill, table_counts
from tests.support.state_process import run_command

LOGGER = "agentstate.state_service.storage.postgres.lifecycle"
PACE_LINE = re.compile(
    r"erasure (\d+): (\d+) batches, ([\d.]+) s in them, ([\d.]+) s resting between them"
)


def pace_of(caplog: pytest.LogCaptureFixture) -> tuple[int, float, float]:
    """The batches, the seconds in them and the seconds resting, from the erase's line."""
    lines = [PACE_LINE.search(r.getMessage()) for r in caplog.records if r.name == LOGGER]
    found = [m for m in lines if m]
    assert len(found) == 1, [r.getMessage() for r in caplog.records]
    return int(found[0][2]), float(found[0][3]), float(found[0][4])


def test_a_batch_is_sized_by_the_rows_the_last_one_held() -> None:
    pace = ErasePace(EraseSettings(batch_conversations=100, batch_rows=1000, duty_cycle=1))
    assert pace.conversations == 1  # the first: one conversation, to learn its size
    # 22 rows a conversation (20 records, a state, the conversation): 45 fit in 1,000.
    pace.after({"conversations": 1, "messages": 20, "states": 1}, 0.001)
    assert pace.conversations == 45
    # Small conversations: at most batch_conversations.
    pace.after({"conversations": 45, "messages": 0, "states": 45}, 0.001)
    assert pace.conversations == 100
    # One conversation holding more than batch_rows: one a batch, never zero.
    pace.after({"conversations": 100, "messages": 500_000}, 0.001)
    assert pace.conversations == 1
    # A batch that erased no conversation says nothing of their size: unchanged.
    pace.after({"conversations": 0, "scoped_states": 3}, 0.001)
    assert pace.conversations == 1


def test_the_pause_follows_the_batch_within_its_bounds() -> None:
    half = ErasePace(EraseSettings(pause_seconds=0.005, duty_cycle=0.5, stale_seconds=30))
    assert half.after({"conversations": 1}, 0.02) == pytest.approx(0.02)  # as long again
    assert half.after({"conversations": 1}, 0.001) == 0.005  # at least pause_seconds
    # At most a quarter of the stale time, so that the heartbeat stays fresh.
    assert half.after({"conversations": 1}, 60.0) == 7.5
    fifth = ErasePace(EraseSettings(pause_seconds=0, duty_cycle=0.2))
    assert fifth.after({"conversations": 1}, 0.01) == pytest.approx(0.04)
    assert fifth.batches == 1 and fifth.rest_seconds == pytest.approx(0.04)
    # 1: no pause beyond pause_seconds (the pace before the duty cycle).
    full = ErasePace(EraseSettings(pause_seconds=0.005, duty_cycle=1))
    assert full.after({"conversations": 1}, 10.0) == 0.005


async def test_an_erase_takes_as_many_batches_as_the_rows_say(
    pg_store: PostgresStore,
    user_id: str,
    other_user_id: str,
    database_url: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await fill(pg_store, user_id, conversations=6)
    await fill(pg_store, other_user_id, conversations=2)
    other_before = await table_counts(database_url, other_user_id)
    caplog.set_level(logging.INFO, logger=LOGGER)

    # Each conversation holds more than one row: one conversation a batch, then the last
    # batch (the user's scoped state, the receipt done).
    one_by_one = EraseSettings(batch_rows=1, pause_seconds=0, duty_cycle=1, stop_grace_seconds=0)
    receipt = await pg_store.erase_user(user_id=user_id, settings=one_by_one)
    assert receipt.done and receipt.counts["conversations"] == 6
    assert pace_of(caplog)[0] == 6 + 1
    assert set((await table_counts(database_url, user_id)).values()) == {0}
    assert await table_counts(database_url, other_user_id) == other_before

    # Rows without bound: the first conversation alone, then the other five at once.
    caplog.clear()
    await fill(pg_store, user_id, conversations=6)
    unbounded = EraseSettings(
        batch_rows=1_000_000, pause_seconds=0, duty_cycle=1, stop_grace_seconds=0
    )
    again = await pg_store.erase_user(user_id=user_id, settings=unbounded)
    assert again.done and again.counts["conversations"] == 6
    assert again.erasure_id != receipt.erasure_id
    assert pace_of(caplog)[0] == 1 + 1 + 1


async def test_the_erase_rests_in_proportion_to_its_batches(
    pg_store: PostgresStore, user_id: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    await fill(pg_store, user_id, conversations=8)
    caplog.set_level(logging.INFO, logger=LOGGER)
    paced = EraseSettings(batch_rows=1, pause_seconds=0, duty_cycle=0.2, stop_grace_seconds=0)
    started = time.monotonic()
    receipt = await pg_store.erase_user(user_id=user_id, settings=paced)
    took = time.monotonic() - started
    assert receipt.done and receipt.counts["conversations"] == 8
    batches, busy, rest = pace_of(caplog)
    assert batches == 9
    # Four times each batch's time (duty 0.2); the last batch has no pause after it.
    assert 3 * busy <= rest <= 4 * busy + 0.01, (busy, rest)
    assert took >= busy + rest - 0.01
    assert set((await table_counts(database_url, user_id)).values()) == {0}

    caplog.clear()
    await fill(pg_store, user_id, conversations=8)
    unpaced = EraseSettings(batch_rows=1, pause_seconds=0, duty_cycle=1, stop_grace_seconds=0)
    await pg_store.erase_user(user_id=user_id, settings=unpaced)
    assert pace_of(caplog)[2] == 0.0  # duty 1, no pause_seconds: no rest at all


def test_the_settings_reach_the_erase() -> None:
    env = {"STATE_ERASE_BATCH_ROWS": "7", "STATE_ERASE_DUTY_CYCLE": "0.25"}
    settings = erase_settings(StateServiceSettings.from_env(env))
    assert settings.batch_rows == 7 and settings.duty_cycle == 0.25
    assert erase_settings(StateServiceSettings.from_env({})) == EraseSettings()
    for name, bad in (
        ("STATE_ERASE_DUTY_CYCLE", "0"),
        ("STATE_ERASE_DUTY_CYCLE", "1.5"),
        ("STATE_ERASE_BATCH_ROWS", "0"),
    ):
        with pytest.raises(ConfigError, match=name):
            StateServiceSettings.from_env({name: bad})


def test_the_admin_command_erases_at_the_set_pace(database_url: str, user_id: str) -> None:
    """STATE_ERASE_BATCH_ROWS, through the process's settings: one conversation a batch."""

    async def seed() -> None:
        pg = PostgresStore(database_url, min_size=1, max_size=2)
        await pg.open()
        try:
            await fill(pg, user_id, conversations=3)
        finally:
            await pg.close()

    asyncio.run(seed())
    env = {
        "STATE_STORE": "postgres",
        "DATABASE_URL": database_url,
        "STATE_ERASE_BATCH_ROWS": "1",
        "STATE_ERASE_DUTY_CYCLE": "0.5",
        "AGENTSTATE_LOG_LEVEL": "INFO",
    }
    done = run_command(env, "erase-user", user_id)
    assert done.returncode == 0, done.stderr
    assert "conversations 3" in done.stdout.splitlines()
    match = PACE_LINE.search(done.stderr)
    assert match is not None, done.stderr
    assert int(match[2]) == 3 + 1
    assert float(match[4]) > 0  # it rested
    assert user_id not in done.stderr
