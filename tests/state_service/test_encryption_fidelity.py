"""The behaviour suites again with encryption at rest on (issue 24 item 5): faithful
payloads byte for byte (issue 22 item 1), state deltas and their size limit, turns with
their fencing and compare-and-set, items, events and scoped-state merges, checkpoints.

The tests are the existing modules' own, imported here: pytest runs them in this module,
where `store` and `pg_store` are PostgreSQL stores with STATE_ENCRYPTION=on. The same
tests run with encryption off in their own modules. (Left out: the ones that rewrite rows
in SQL into the layout before migration 12, which was plaintext; rows written before
encryption was on are test_encryption.py's.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentstate.state_service.storage.base import StateStore
from agentstate.state_service.storage.postgres import PostgresStore
from tests.state_service.test_checkpoints import (  # noqa: F401
    test_bad_checkpoint_input,
    test_concurrent_writers_of_one_head_one_wins,
    test_delete_for_runs_copy_and_prune,
    test_deleted_with_the_conversation_and_never_resurrected,
    test_list_filters_pages_and_namespaces,
    test_put_carries_parent_writes_and_the_run_lease_in_one_transaction,
    test_put_get_values_and_head_compare_and_set,
    test_writes_are_idempotent_and_special_ones_replace,
    test_writes_of_a_checkpoint_not_stored_are_refused_and_store_nothing,
)
from tests.state_service.test_conversation_items import (  # noqa: F401
    test_append_event_scopes_and_revision,
    test_appends_without_the_texts_sent_back,
    test_items_and_state_go_with_the_conversation,
    test_items_append_list_pop_clear,
    test_items_compare_and_set,
    test_items_concurrent_appends_all_land,
    test_items_min_item_time,
    test_list_items_after_seq,
    test_list_items_with_state_and_scoped_state,
)
from tests.state_service.test_conversation_search import (  # noqa: F401
    operator_stub,
    test_labels_key_prefix_title_time_and_pages,
    test_list_over_grpc_with_states_and_across_users,
    test_status_is_kept_by_the_server,
)
from tests.state_service.test_faithful_merges import (  # noqa: F401
    test_a_whole_state_reads_back_as_sent,
    test_merges_keep_every_value,
)
from tests.state_service.test_faithful_payloads import (  # noqa: F401
    test_agent_state_keeps_every_value,
    test_checkpoint_metadata_as_sent_and_still_searchable,
    test_concurrent_merges_into_one_scoped_state_lose_nothing,
    test_event_deltas_merge_without_rewriting_values,
    test_items_come_back_byte_for_byte,
    test_merging_into_an_agent_state_is_refused,
)
from tests.state_service.test_state_delta import (  # noqa: F401
    test_begin_turn_omits_the_payload_the_caller_holds,
    test_delta_on_a_state_whose_context_is_not_an_array,
    test_delta_saves_match_a_whole_save_byte_for_byte,
    test_delta_with_records_and_lease_is_one_transaction,
    test_each_bad_part_is_named_and_nothing_changes,
    test_end_turn_and_upsert_with_a_delta_over_grpc,
    test_size_limit_applies_to_the_assembled_state,
)
from tests.state_service.test_turn_rpcs import (  # noqa: F401
    test_a_refused_begin_turn_changes_nothing,
    test_a_refused_end_turn_saves_nothing_and_keeps_the_lease,
    test_begin_turn_creates_the_conversation_and_appends_records,
    test_card_guards,
    test_end_turn_is_fenced_by_task_not_by_the_lease_row,
    test_end_turn_saves_everything_and_releases_the_lease,
    test_records_a_dead_turn_left_streaming_are_interrupted,
)
from tests.support.encryption import encrypted_store, write_key_file


@pytest.fixture
def key_file(tmp_path: Path) -> Path:
    return write_key_file(tmp_path / "keys.json")


@pytest.fixture(params=["postgres-encrypted"])
async def store(database_url: str, key_file: Path) -> AsyncIterator[StateStore]:
    """Overrides the suite's `store`: PostgreSQL with encryption at rest on."""
    pg = encrypted_store(database_url, key_file)
    await pg.open()
    yield pg
    await pg.close()


@pytest.fixture
async def pg_store(database_url: str, key_file: Path) -> AsyncIterator[PostgresStore]:
    pg = encrypted_store(database_url, key_file)
    await pg.open()
    yield pg
    await pg.close()
