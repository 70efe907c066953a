"""Which client created each stored Responses answer, so `previous_response_id` continues only
the caller's own conversation.

vLLM's Responses store (`VLLM_ENABLE_RESPONSES_API_STORE`) keys a conversation by its response
id alone: a client that learned another's id (a log, a shared screen) could continue that
conversation and read it back. The gateway notes the client of every response id it relays
(`note`) and refuses a `previous_response_id` that another client created (`owner`).

Bounded: the most recent `size` ids (least recently noted dropped first), at most `per_client`
of them for one client (its own oldest dropped), so no client pushes out another's ids. An id
this replica never saw (created through another replica, or before a restart) is not known
here and is forwarded as before: the check holds per replica.
"""

from __future__ import annotations

from collections import OrderedDict

MAX_ID_CHARS = 128  # a response id longer than this is not one vLLM made


class ResponseOwners:
    def __init__(self, size: int = 100_000, per_client: int = 50_000) -> None:
        self.size, self.per_client = size, per_client
        self._owner: OrderedDict[str, str] = OrderedDict()
        self._by_client: dict[str, OrderedDict[str, None]] = {}

    def __len__(self) -> int:
        return len(self._owner)

    def note(self, response_id: str, client: str) -> None:
        if not response_id or len(response_id) > MAX_ID_CHARS or response_id in self._owner:
            return  # an id is noted once: the first client to be answered with it owns it
        self._owner[response_id] = client
        mine = self._by_client.setdefault(client, OrderedDict())
        mine[response_id] = None
        if len(mine) > self.per_client:
            self._drop(next(iter(mine)))
        while len(self._owner) > self.size:
            self._drop(next(iter(self._owner)))

    def owner(self, response_id: str) -> str | None:
        return self._owner.get(response_id)

    def _drop(self, response_id: str) -> None:
        client = self._owner.pop(response_id)
        mine = self._by_client[client]
        del mine[response_id]
        if not mine:
            del self._by_client[client]
