"""One key for every row: the user (issue 23, item 7; docs/scaling.md, "Distributing by
user"). Every statement the PostgreSQL store runs, in the SQL modules and in the functions,
that reads or writes a user's table names `user_id`, so an erase finds a user's rows by an
index and a distributed engine (Citus, by `user_id`) could route it to one shard. The
statements that go across users are listed here, each with its reason, and documented.

The check is textual (the statement mentions `user_id`), not a parse: it catches a new
statement written without the user, which is what it is for."""

from __future__ import annotations

import re

from agentstate.state_service.storage.postgres import lifecycle_sql, migrations, sql
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
    "t_erasure_fence",
    "t_conversation_label",
}

# The documented cross-user paths (docs/scaling.md), and the statements still to change.
ACROSS_USERS = {
    # The maintenance job of migration 11: states stored whole, of every user.
    "sql.COUNT_UNSPLIT_STATES": "split-states counts every user's unsplit states",
    # EndTurn's release of the lease: keyed by conversation and task (both unique); to be
    # given the user before a distributed layout (it is agentstate_save_state's).
    "agentstate_save_state:lease release": "to change: add user_id (docs/scaling.md)",
}

_TABLE = re.compile(r"\b(?:FROM|UPDATE|INTO|JOIN)\s+(t_\w+)", re.IGNORECASE)


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
    for name in migrations.function_names():
        body = re.sub(r"--[^\n]*", "", migrations.function_sql(name))
        for index, part in enumerate(body.split(";")):
            if _TABLE.search(part):
                found[f"{name}[{index}]"] = part
    return found


def _named(name: str, text: str) -> str:
    """The exception key of a statement: by name, or by what it does."""
    if name.startswith("agentstate_save_state[") and "DELETE FROM t_run_lease" in text:
        return "agentstate_save_state:lease release"
    return name


def test_every_statement_on_a_users_table_names_the_user() -> None:
    all_statements = statements()
    assert len(all_statements) > 80  # the modules and the functions were read
    missing = {}
    for name, text in all_statements.items():
        tables = {t.lower() for t in _TABLE.findall(text)} & USER_TABLES
        if tables and "user_id" not in text and _named(name, text) not in ACROSS_USERS:
            missing[name] = " ".join(text.split())[:200]
    assert missing == {}, f"statements on a user's table without user_id: {missing}"


def test_the_cross_user_paths_are_documented_and_still_exist() -> None:
    names = {_named(n, t) for n, t in statements().items()}
    assert set(ACROSS_USERS) <= names  # an exception whose statement is gone must go too
    scaling = (REPO / "docs" / "scaling.md").read_text()
    section = scaling.split("## Distributing by user", 1)[1]
    for needle in ("COUNT_UNSPLIT_STATES", "agentstate_save_state", "retention sweep"):
        assert needle in section, needle


def test_every_user_table_has_the_user_column() -> None:
    """Every table of a user carries user_id (the distribution column to be)."""
    text = "\n".join(m.sql for m in migrations.MIGRATIONS)
    for table in USER_TABLES:
        create = re.search(rf"CREATE TABLE {table} \((.*?)\n\);", text, re.DOTALL)
        assert create is not None, table
        assert re.search(r"^\s+user_id\s+text (NOT NULL|PRIMARY KEY)", create.group(1), re.M), table
