"""Opening a state's many tokens (envelope.open_all): the fast path (all the base64 in
one strict decode, one decrypt per blob) returns what the exact token-by-token path
returns, and hands every text it cannot vouch for (plaintext after a token, bad
base64, a quote or backslash, a foreign key, a tampered blob) to the exact path, whose
errors say which and why. Then the same through the store on a state of many chunks,
with old plaintext rows and a tampered chunk."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentstate.state_service import domain as d
from agentstate.state_service.crypto import envelope
from agentstate.state_service.domain.states import DEFAULT_STATE_KEY
from agentstate.state_service.storage.postgres import PostgresStore
from agentstate.state_service.storage.postgres.states import state_ad
from tests.support.encryption import encrypted_store, write_key_file

AD = envelope.associated_data("u1", 7, "state", "agent_state")
KEY = envelope.data_key(*envelope.new_data_key())


def _seal(text: str | bytes, ad: bytes = AD, key: envelope.DataKey = KEY) -> bytes:
    return envelope.seal_text(key, text, ad).encode()


def _messages(n: int) -> list[bytes]:
    return [
        json.dumps({"id": f"m{i}", "text": '订单 "88235" \\ ' * (i % 5), "n": i}).encode()
        for i in range(n)
    ]


def _assembled(head: bytes, messages: list[bytes], tail: bytes) -> bytes:
    """What SELECT_STATE returns for a split state: head, [messages], tail."""
    return head + b"[" + b", ".join(messages) + b"]" + tail


def _exact(text: bytes, key: envelope.DataKey | None = KEY) -> bytes:
    return envelope.open_text(
        text, lambda body: envelope.open_token(key, b"\x01" + body, AD, user_id="u1")
    )


def test_the_fast_path_opens_a_sealed_state_as_the_exact_path_does() -> None:
    for n in (0, 1, 2, 64, 300):
        messages = _messages(n)
        plain = _assembled(b'{"a": 1, "context": ', messages, b', "z": "\\u0001"}')
        sealed = _assembled(
            _seal(b'{"a": 1, "context": '),
            [_seal(m) for m in messages],
            _seal(b', "z": "\\u0001"}'),
        )
        assert envelope._open_all_fast(KEY, sealed, AD) == plain, n
        assert envelope.open_all(KEY, sealed, AD, user_id="u1") == plain == _exact(sealed)
    # Tokens side by side, a token at the very end, a text that is one token.
    for text in (_seal("a") + _seal("b"), b"[" + _seal("x"), _seal(""), _seal("x" * 5000)):
        assert envelope._open_all_fast(KEY, text, AD) == _exact(text)
    # No token: returned as it is, without a copy.
    plain = b'{"context": []}'
    assert envelope.open_all(KEY, plain, AD, user_id="u1") is plain


def test_texts_the_fast_path_cannot_vouch_for_are_opened_exactly() -> None:
    messages = _messages(6)
    sealed = [_seal(m) for m in messages]
    cases = [
        # Rows written before encryption was on: plaintext after a token (its letters
        # would pass for base64 read from the right), a plaintext head and tail.
        _assembled(_seal(b'{"context": '), [sealed[0], messages[1], sealed[2]], b', "t": 1}'),
        _assembled(b'{"context": ', [messages[0], *sealed[1:]], _seal(b"}")),
        _assembled(b'{"context": ', sealed, b', "q": "a\\"b\\\\c"}'),
        # A token directly followed by plaintext that begins with base64 letters.
        sealed[0] + b"abc",
        sealed[0] + b'x", "y' + sealed[1],
    ]
    for text in cases:
        opened = envelope.open_all(KEY, text, AD, user_id="u1")
        assert opened == _exact(text)
        assert envelope._open_all_fast(KEY, text, AD) in (None, opened)
    assert envelope._open_all_fast(KEY, cases[0], AD) is None
    assert envelope._open_all_fast(KEY, cases[3], AD) is None
    assert envelope.open_all(KEY, cases[0], AD, user_id="u1") == _assembled(
        b'{"context": ', messages[:3], b', "t": 1}'
    )


def test_a_token_that_does_not_open_is_refused_by_the_exact_path_with_its_reason() -> None:
    messages = _messages(40)
    sealed = [_seal(m) for m in messages]

    def state(tokens: list[bytes]) -> bytes:
        return _assembled(_seal(b'{"context": '), tokens, _seal(b"}"))

    body = sealed[20][1:]
    flipped = b"\x01" + body[:30] + (b"B" if body[30:31] != b"B" else b"C") + body[31:]
    rejected, bad = d.CiphertextRejected, "truncated|does not authenticate"
    refused: list[tuple[bytes, type[Exception], str]] = [
        (state([*sealed[:20], flipped, *sealed[21:]]), d.CiphertextRejected, "does not auth"),
        (state([*sealed[:20], b"\x01" + body[:-8], *sealed[21:]]), rejected, bad),
        (state([*sealed[:20], b"\x01" + body[:8], *sealed[21:]]), rejected, bad),
        (state([*sealed[:20], b"\x01", *sealed[21:]]), d.CiphertextRejected, "truncated"),
        (state([*sealed[:20], b"\x01\\" + body, *sealed[21:]]), rejected, bad),
        (state([*sealed[:20], _seal(messages[20], ad=b"elsewhere"), *sealed[21:]]),
         d.CiphertextRejected, "moved from another row"),
        (state([*sealed[:20], _seal(messages[20], key=envelope.data_key(*envelope.new_data_key())),
                *sealed[21:]]), d.DataKeyDestroyed, "no longer"),
    ]  # fmt: skip
    for text, error, message in refused:
        assert envelope._open_all_fast(KEY, text, AD) is None
        with pytest.raises(error, match=message):
            envelope.open_all(KEY, text, AD, user_id="u1")
    with pytest.raises(d.DataKeyDestroyed):
        envelope.open_all(None, state(sealed), AD, user_id="u1")


# ------------------------------------------------------------------ through the store


@pytest.fixture
async def sealed_store(database_url: str, tmp_path: Path) -> AsyncIterator[PostgresStore]:
    store = encrypted_store(database_url, write_key_file(tmp_path / "keys.json"))
    await store.open()
    yield store
    await store.close()


def _state(n: int) -> bytes:
    return json.dumps(
        {"session_id": "s", "summary": "x", "context": [json.loads(m) for m in _messages(n)]},
        ensure_ascii=False,
    ).encode()


async def test_a_state_of_many_chunks_reads_back_and_a_tampered_chunk_is_refused(
    sealed_store: PostgresStore, pg_store: PostgresStore, database_url: str, user_id: str
) -> None:
    # Written with encryption off (plaintext rows), then a delta with it on.
    conversation = await pg_store.create_conversation(user_id=user_id, title="t")
    cid = conversation.conversation_id
    payload = _state(400)
    await pg_store.save_state(
        user_id=user_id, conversation_id=cid, state_key=DEFAULT_STATE_KEY,
        payload=payload, expected_version=None,
    )  # fmt: skip
    added = [b'{"id": "new-%d"}' % i for i in range(300)]
    await sealed_store.save_state(
        user_id=user_id, conversation_id=cid, state_key=DEFAULT_STATE_KEY, payload=None,
        expected_version=None, delta=d.StateDelta(base_version=1, messages=tuple(added)),
    )  # fmt: skip
    got = await sealed_store.get_state(
        user_id=user_id, conversation_id=cid, state_key=DEFAULT_STATE_KEY
    )
    expected = json.loads(payload)
    expected["context"] += [json.loads(m) for m in added]
    assert json.loads(got.payload) == expected
    # All sealed: a whole save with encryption on, many chunks of tokens.
    await sealed_store.save_state(
        user_id=user_id, conversation_id=cid, state_key=DEFAULT_STATE_KEY,
        payload=payload, expected_version=2,
    )  # fmt: skip
    got = await sealed_store.get_state(
        user_id=user_id, conversation_id=cid, state_key=DEFAULT_STATE_KEY
    )
    assert got.payload == payload
    with psycopg.connect(database_url, autocommit=True) as conn:
        chunks = conn.execute(
            "SELECT position, messages FROM t_agent_state_message"
            " WHERE user_id = %s AND session_id = %s ORDER BY position",
            (user_id, cid),
        ).fetchall()
        assert len(chunks) > 3 and all(m.startswith("\x01") for _, ms in chunks for m in ms)
        # One message of a middle chunk sealed for another row: refused, nothing changed.
        position, messages = chunks[len(chunks) // 2]
        elsewhere = state_ad(user_id, cid + 1, DEFAULT_STATE_KEY)
        key = await sealed_store._keys(user_id).for_read(messages[0])
        assert key is not None
        messages[0] = envelope.seal_text(key, b'{"id": "forged"}', elsewhere)
        conn.execute(
            "UPDATE t_agent_state_message SET messages = %s"
            " WHERE user_id = %s AND session_id = %s AND position = %s",
            (messages, user_id, cid, position),
        )
    with pytest.raises(d.CiphertextRejected, match="moved from another row"):
        await sealed_store.get_state(
            user_id=user_id, conversation_id=cid, state_key=DEFAULT_STATE_KEY
        )


_PIECES = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\x01", b"")),
    st.sampled_from([b", ", b"[", b"]", b'"', b"\\", b"=", b"A", b"+/", b"\xe8\xae\xa2", b"{}"]),
    st.text(max_size=60).map(lambda t: _seal(t)),
    st.text(max_size=20).map(lambda t: _seal(t, ad=b"elsewhere")),
    st.just(b"\x01"),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECES, max_size=12))
def test_open_all_answers_as_the_exact_path_on_any_mix(pieces: list[bytes]) -> None:
    """Tokens, tokens of another row, stray marks, plaintext and punctuation in any
    order: open_all returns what the exact path returns, or raises what it raises."""
    text = b"".join(pieces)
    try:
        expected: bytes | type[Exception] = _exact(text)
    except (d.CiphertextRejected, d.DataKeyDestroyed) as exc:
        expected = type(exc)
    try:
        got: bytes | type[Exception] = envelope.open_all(KEY, text, AD, user_id="u1")
    except (d.CiphertextRejected, d.DataKeyDestroyed) as exc:
        got = type(exc)
    assert got == expected
