"""The fast timestamp conversions (client and items servicer) give exactly what
protobuf's FromDatetime / ToDatetime give, over the whole range of Timestamp."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from agentstate.client.convert._common import time_of, timestamp_of
from agentstate.state_service.servicer import items

MIN_SECONDS = -62135596800  # 0001-01-01T00:00:00Z
MAX_SECONDS = 253402300799  # 9999-12-31T23:59:59Z

times = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.just(UTC)
)


def _reference(value: datetime) -> Timestamp:
    ts = Timestamp()
    ts.FromDatetime(value)
    return ts


@given(st.integers(MIN_SECONDS, MAX_SECONDS), st.integers(0, 999_999_999))
def test_time_of_a_timestamp(seconds: int, nanos: int) -> None:
    ts = Timestamp(seconds=seconds, nanos=nanos)
    assert time_of(ts) == ts.ToDatetime(tzinfo=UTC)
    assert time_of(ts).tzinfo is not None


@given(times, st.integers(-12 * 60, 14 * 60), st.booleans())
def test_timestamp_of_a_time(value: datetime, offset_minutes: int, naive: bool) -> None:
    local = value.astimezone(timezone(timedelta(minutes=offset_minutes)))
    if naive:
        local = value.replace(tzinfo=None)  # FromDatetime reads a naive time as UTC
    for fast in (timestamp_of, items._timestamp):
        assert fast(local) == _reference(local)
