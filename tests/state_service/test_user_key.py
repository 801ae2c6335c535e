"""One key for every row: the user (issue 23, item 7; docs/scaling.md, "Distributing by
user"). Every statement the PostgreSQL store runs, in the SQL modules and in the functions,
that reads or writes a user's table keys it by one user (`user_id` compared with one
value), so an erase finds a user's rows by an index and a distributed engine (Citus, by
`user_id`) could route it to one shard. Every table of a user has `user_id` in its primary
key, its unique keys and its foreign keys, read from the migrated catalog. The statements,
functions and tables that go across users are listed here, each with its reason, and
documented.

The statement checks are textual (a comparison of `user_id` with a parameter, a trigger's
row or a variable), not a parse: they catch a new statement written without the user,
which is what they are for."""

from __future__ import annotations

import re
import uuid

import psycopg
import pytest
from psycopg.rows import tuple_row

from agentstate.common.embedded_postgres import EmbeddedPostgres
from agentstate.state_service.storage.postgres import lifecycle_sql, migrations, sql
from tests.conftest import create_database
from tests.support.paths import REPO

# Tables that hold a user's rows (t_erasure holds none: a receipt names nobody).
USER_TABLES = {
    "t_conversation",
    "t_agent_message",
    "t_agent_state",
    "t_agent_state_message",
    "t_run_lease",
    "t_context_compaction",
    "t_checkpoint",
    "t_checkpoint_blob",
    "t_checkpoint_write",
    "t_conversation_item",
    "t_scoped_state",
    "t_user_key",  # the data key that seals the user's rows (migration 14)
    "t_erasure_fence",
    "t_conversation_label",
}

# Tables with no user's rows, each with its reason (docs/scaling.md): the only tables
# whose primary key may leave out user_id.
CROSS_USER_TABLES = {
    "t_erasure": "erasure receipts: keyed by the receipt id, the user only as user_hash",
    "agentstate_schema_migrations": "schema bookkeeping",
    "agentstate_schema_functions": "schema bookkeeping",
}

# The documented cross-user statements of the SQL modules (docs/scaling.md).
ACROSS_USERS = {
    # The maintenance job of migration 11: states stored whole, of every user.
    "sql.COUNT_UNSPLIT_STATES": "split-states counts every user's unsplit states",
    # The retention sweeps pick conversations of every user, then delete by user.
    "sql.SELECT_INACTIVE_CONVERSATIONS": "the retention sweep (STATE_RETENTION_DAYS)",
    "lifecycle_sql.SELECT_EXPIRED_CONVERSATIONS": "the retention sweep (time to live)",
}

# Fragments, not statements: correlated subqueries on a row `c` of one user, joined by
# user_id (each statement that uses them is checked with them in it).
FRAGMENTS = {
    "sql.STATUS_COLUMNS",
    "lifecycle_sql.STATUS_COLUMNS",
    "sql._STATE_TEXT",  # inside SELECT_STATE and LIST_ITEMS_WITH_STATES, both keyed
    "sql._ITEM_PAGE",  # inside LIST_ITEMS and LIST_ITEMS_WITH_STATES, both keyed
}

# Functions that read or write across users, each with its reason (docs/scaling.md).
# App-scoped state is rows of t_scoped_state with user_id '' read beside the user's own
# (`user_id IN ('', …)`), so it is keyed like the rest.
CROSS_USER_FUNCTIONS = {
    "agentstate_split_states": "migration 11's maintenance walk over every user's states",
}

_TABLE = re.compile(r"\b(?:FROM|UPDATE|INTO|JOIN)\s+(t_\w+)", re.IGNORECASE)


def _keyed_by_one_user(bound: str) -> re.Pattern[str]:
    """A statement keyed by one user: user_id compared with a value matching `bound`
    (either side, or in an IN list), or an INSERT whose columns name user_id."""
    return re.compile(
        rf"\buser_id\s*(=\s*({bound})|IN\s*\([^)]*({bound}))"
        rf"|({bound})\s*=\s*(\w+\.)?user_id\b"
        r"|INSERT INTO \w+(\s+AS\s+\w+)?\s*\([^)]*\buser_id\b",
        re.IGNORECASE,
    )


_PARAMETER = _keyed_by_one_user(r"%\(\w+\)s")


def statements() -> dict[str, str]:
    """name -> SQL text, for every statement of the SQL modules and of each function."""
    found: dict[str, str] = {}
    for module in (sql, lifecycle_sql):
        short = module.__name__.rsplit(".", 1)[1]
        for name in dir(module):
            value = getattr(module, name)
            if name.isupper() and isinstance(value, str) and _TABLE.search(value):
                found[f"{short}.{name}"] = value
        if module is lifecycle_sql:
            found["lifecycle_sql.search"] = lifecycle_sql.search_statement(
                list(lifecycle_sql.SEARCH_CLAUSES), statuses=True, state=True
            )
            found["lifecycle_sql.search_by_label"] = lifecycle_sql.search_statement(
                list(lifecycle_sql.SEARCH_CLAUSES), statuses=True, state=True, by_label=True
            )
            found["lifecycle_sql.search_by_failure"] = lifecycle_sql.search_statement(
                list(lifecycle_sql.SEARCH_CLAUSES), statuses=True, state=True, by_failure=True
            )
            for drive in ("by_label", "by_failure", ""):
                found[f"lifecycle_sql.count{drive}"] = lifecycle_sql.count_statement(
                    list(lifecycle_sql.SEARCH_CLAUSES),
                    statuses=True,
                    by_label=drive == "by_label",
                    by_failure=drive == "by_failure",
                )
    for name in migrations.function_names():
        body = re.sub(r"--[^\n]*", "", migrations.function_sql(name))
        for index, part in enumerate(body.split(";")):
            if _TABLE.search(part):
                found[f"{name}[{index}]"] = part
    return found


def _on_user_tables(text: str) -> bool:
    return bool({t.lower() for t in _TABLE.findall(text)} & USER_TABLES)


def test_every_statement_on_a_users_table_names_the_user() -> None:
    all_statements = statements()
    assert len(all_statements) > 80  # the modules and the functions were read
    missing = {}
    for name, text in all_statements.items():
        if _on_user_tables(text) and "user_id" not in text and name not in ACROSS_USERS:
            missing[name] = " ".join(text.split())[:200]
    assert missing == {}, f"statements on a user's table without user_id: {missing}"


def test_every_module_statement_is_keyed_by_one_user() -> None:
    """Naming user_id is not enough: a join on it alone reads every user. Each statement
    of the SQL modules compares it with a parameter, except the documented ones."""
    loose = {
        name: " ".join(text.split())[:200]
        for name, text in statements().items()
        if "[" not in name
        and _on_user_tables(text)
        and not _PARAMETER.search(text)
        and name not in ACROSS_USERS
        and name not in FRAGMENTS
    }
    assert loose == {}, f"statements not keyed by one user: {loose}"


def test_every_on_conflict_names_the_user_first() -> None:
    """An upsert's conflict target is a key of the user's table, so it leads with user_id
    (every such key does, test_every_tables_primary_key_starts_with_the_user)."""
    targets = {
        name: target
        for name, text in statements().items()
        for target in re.findall(r"ON CONFLICT\s*\(([^)]*)\)", text, re.IGNORECASE)
    }
    assert len(targets) >= 6
    assert {n: t for n, t in targets.items() if not t.startswith("user_id")} == {}


def test_a_statement_keyed_only_by_a_join_is_caught() -> None:
    """The check can fail: a join on user_id without a bound user is not keyed."""
    joined = "SELECT 1 FROM t_conversation c JOIN t_run_lease l ON l.user_id = c.user_id"
    assert not _PARAMETER.search(joined)
    assert _PARAMETER.search(joined + " WHERE c.user_id = %(user_id)s")
    assert _PARAMETER.search("SELECT 1 FROM t_scoped_state WHERE user_id IN ('', %(user_id)s)")


def test_the_cross_user_paths_are_documented_and_still_exist() -> None:
    names = set(statements())
    assert set(ACROSS_USERS) <= names  # an exception whose statement is gone must go too
    assert names >= FRAGMENTS
    scaling = (REPO / "docs" / "scaling.md").read_text()
    section = scaling.split("## Distributing by user", 1)[1]
    for needle in (
        "COUNT_UNSPLIT_STATES",
        "SELECT_INACTIVE_CONVERSATIONS",
        "SELECT_EXPIRED_CONVERSATIONS",
        "retention sweep",
        "app-scoped state",
        *CROSS_USER_TABLES,
        *CROSS_USER_FUNCTIONS,
    ):
        assert needle in section, needle


def test_every_user_table_has_the_user_column() -> None:
    """Every table of a user carries user_id (the distribution column to be)."""
    text = "\n".join(m.sql for m in migrations.MIGRATIONS)
    for table in USER_TABLES:
        create = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", text, re.DOTALL)
        assert create is not None, table
        assert re.search(r"^\s+user_id\s+text (NOT NULL|PRIMARY KEY)", create.group(1), re.M), table


# ------------------------------------------------------------ the migrated catalog

# Primary keys, unique constraints and foreign keys (with the columns they reference),
# and unique indexes that are no constraint: Citus needs the distribution column in all.
KEYS_QUERY = """
SELECT c.relname::text, con.contype::text,
       ARRAY(SELECT a.attname::text FROM unnest(con.conkey) WITH ORDINALITY AS k(attnum, n)
             JOIN pg_attribute AS a ON a.attrelid = con.conrelid AND a.attnum = k.attnum
             ORDER BY k.n),
       con.conname::text,
       coalesce(con.confrelid::regclass::text, ''),
       ARRAY(SELECT a.attname::text FROM unnest(con.confkey) WITH ORDINALITY AS k(attnum, n)
             JOIN pg_attribute AS a ON a.attrelid = con.confrelid AND a.attnum = k.attnum
             ORDER BY k.n)
FROM pg_constraint AS con JOIN pg_class AS c ON c.oid = con.conrelid
WHERE c.relnamespace = 'public'::regnamespace AND con.contype IN ('p', 'u', 'f')
UNION ALL
SELECT c.relname::text, 'i',
       ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) AS k(attnum)
             JOIN pg_attribute AS a ON a.attrelid = i.indrelid AND a.attnum = k.attnum),
       ic.relname::text, '', '{}'::text[]
FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indrelid
JOIN pg_class AS ic ON ic.oid = i.indexrelid
WHERE c.relnamespace = 'public'::regnamespace AND i.indisunique
  AND NOT EXISTS (SELECT 1 FROM pg_constraint AS con WHERE con.conindid = i.indexrelid)
"""


@pytest.fixture(scope="module")
def catalog(postgres: EmbeddedPostgres) -> str:
    """A database of its own, migrated to the newest version by the first _fetch."""
    return create_database(postgres, f"user_key_{uuid.uuid4().hex[:8]}")


async def _fetch(dsn: str, query: str) -> list[tuple[object, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await migrations.apply_migrations(conn)  # idempotent: the first call migrates
        await conn.commit()
        cur = conn.cursor(row_factory=tuple_row)
        await cur.execute(query)
        return list(await cur.fetchall())


def _names(value: object) -> list[str]:
    assert isinstance(value, list)
    return [str(v) for v in value]


async def test_every_tables_primary_key_starts_with_the_user(catalog: str) -> None:
    """Every table's primary key leads with user_id (a user's rows are one range of it:
    one shard, one index range for an erase), except the documented tables that hold no
    user's rows; and the lists here match the catalog (a new table must be put in one)."""
    tables = {
        str(name)
        for (name,) in await _fetch(
            catalog,
            "SELECT relname::text FROM pg_class WHERE relnamespace = 'public'::regnamespace"
            " AND relkind IN ('r', 'p')",
        )
    }
    assert tables == USER_TABLES | set(CROSS_USER_TABLES), (
        "every table is a user's (USER_TABLES, user_id first in its key) or a documented "
        "cross-user one (CROSS_USER_TABLES and docs/scaling.md)"
    )
    keys = await _fetch(catalog, KEYS_QUERY)
    primary = {str(r[0]): _names(r[2]) for r in keys if r[1] == "p"}
    assert set(primary) == tables, "every table has a primary key"
    wrong = {t: k for t, k in primary.items() if t in USER_TABLES and k[0] != "user_id"}
    assert wrong == {}, f"primary keys that do not start with user_id: {wrong}"


async def test_every_unique_key_and_foreign_key_of_a_user_table_holds_the_user(
    catalog: str,
) -> None:
    """What Citus's colocated tables need: each unique constraint or index contains the
    distribution column, and each foreign key between them joins user_id to user_id."""
    problems = []
    foreign = 0
    for table, kind, columns, name, referenced_table, referenced in await _fetch(
        catalog, KEYS_QUERY
    ):
        if table not in USER_TABLES:
            continue
        cols = _names(columns)
        if kind in ("u", "i") and "user_id" not in cols:
            problems.append(f"unique {name} {cols}")
        if kind == "f":
            foreign += 1
            pairs = dict(zip(cols, _names(referenced), strict=True))
            if referenced_table not in USER_TABLES or pairs.get("user_id") != "user_id":
                problems.append(f"foreign key {name} {cols} -> {referenced_table}")
    assert foreign >= 10  # the child tables' keys to t_conversation were read
    assert problems == []


def _user_statements(body: str) -> list[str]:
    """The statements of a function body that touch a user's table (a FOR … IN query
    ends at its LOOP)."""
    text = re.sub(r"--[^\n]*", "", body)
    return [part for part in re.split(r";|\bLOOP\b", text) if _on_user_tables(part)]


async def test_no_function_or_trigger_reaches_across_users(catalog: str) -> None:
    """Every function in the catalog (the triggers' included) keys each statement on a
    user's table by one user: user_id compared with one of its arguments, a variable, or
    the trigger's row. The exceptions are documented (docs/scaling.md)."""
    functions = {
        str(name): (str(body), _names(args or []))
        for name, body, args in await _fetch(
            catalog,
            "SELECT proname::text, prosrc, proargnames::text[] FROM pg_proc"
            " WHERE pronamespace = 'public'::regnamespace"
            " AND prolang = (SELECT oid FROM pg_language WHERE lanname = 'plpgsql')",
        )
    }
    assert set(functions) <= set(migrations.function_names())
    assert len(functions) > 30
    across = {}
    for name, (body, args) in functions.items():
        values = [re.escape(a) for a in args if a] + [r"v_\w+", "NEW", "OLD"]
        keyed = _keyed_by_one_user(r"\b(?:" + "|".join(values) + r")(?:\.user_id)?\b")
        loose = [" ".join(s.split())[:160] for s in _user_statements(body) if not keyed.search(s)]
        if loose and name not in CROSS_USER_FUNCTIONS:
            across[name] = loose
    assert across == {}, f"statements not keyed by one user: {across}"
    assert set(CROSS_USER_FUNCTIONS) <= set(functions)
    # Triggers: on a user's table, and each statement of the function keyed by the row's
    # user (NEW.user_id / OLD.user_id), not by an argument or a variable.
    triggers = await _fetch(
        catalog,
        "SELECT t.tgname::text, c.relname::text, p.proname::text FROM pg_trigger AS t"
        " JOIN pg_class AS c ON c.oid = t.tgrelid JOIN pg_proc AS p ON p.oid = t.tgfoid"
        " WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal",
    )
    assert len(triggers) >= 6
    by_row = _keyed_by_one_user(r"\b(?:NEW|OLD)\.user_id\b")
    for trigger, table, function in triggers:
        assert table in USER_TABLES, trigger
        for statement in _user_statements(functions[str(function)][0]):
            assert by_row.search(statement), (trigger, " ".join(statement.split()))
