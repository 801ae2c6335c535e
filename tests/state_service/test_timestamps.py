"""The servicers' timestamps: the Timestamp that Timestamp.FromDatetime makes, built
directly (a BeginTurn response carries up to ten)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from agentstate.state_service.servicer.translate import datetime_of, timestamp


@pytest.mark.parametrize(
    "value",
    [
        datetime(2026, 12, 7, 17, 3, 4, 567891, tzinfo=UTC),
        datetime(2026, 12, 7, 17, 3, 4, 567891),  # naive: UTC, as FromDatetime reads it
        datetime(2026, 3, 29, 2, 30, tzinfo=timezone(timedelta(hours=8))),
        datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC),  # before the epoch: nanos >= 0
        datetime(1901, 3, 4, 5, 6, 7, 891011, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ],
)
def test_timestamp_is_what_from_datetime_makes(value: datetime) -> None:
    expected = Timestamp()
    expected.FromDatetime(value)
    assert timestamp(value) == expected
    assert datetime_of(timestamp(value)) == (value if value.tzinfo else value.replace(tzinfo=UTC))
