"""What every aggregate's RPCs share: the store, the payload limit, the capabilities."""

from __future__ import annotations

from agentstate.state_service import domain as d
from agentstate.state_service.storage.base import CheckpointStore, Feature, ItemStore, StateStore
from agentstate.state_service.storage.base.lifecycle import EraseSettings


class ServicerBase:
    """The store and the settings the handlers read."""

    def __init__(
        self,
        store: StateStore,
        *,
        max_payload_bytes: int,
        allow_list_all_users: bool = False,
        erase: EraseSettings | None = None,
    ) -> None:
        self._store = store
        self._max_payload_bytes = max_payload_bytes
        self._features = store.features()
        self._allow_list_all_users = allow_list_all_users
        self._erase = erase or EraseSettings()

    def _checkpoints(self) -> CheckpointStore:
        if Feature.CHECKPOINTS not in self._features or not isinstance(
            self._store, CheckpointStore
        ):
            raise d.not_supported(Feature.CHECKPOINTS, type(self._store).__name__)
        return self._store

    def _items(self) -> ItemStore:
        if Feature.ITEMS not in self._features or not isinstance(self._store, ItemStore):
            raise d.not_supported(Feature.ITEMS, type(self._store).__name__)
        return self._store
