"""`--access-log`: one line per finished request on stderr (off by default).

What the request log stores, minus prompt and completion text (neither is ever kept):
request id, client, endpoint, backend, status, outcome, TTFT, tokens and duration.
"""

from __future__ import annotations

import logging

from proxy.record.request import RequestRecord

log = logging.getLogger("specrouter.access")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}ms"


def access_line(record: RequestRecord) -> str:
    m = record.m
    return (
        f"{record.request_id} client={record.client} {record.endpoint} "
        f"backend={record.backend or '-'} status={record.status} outcome={record.outcome} "
        f"ttft={_ms(m.ttft)} tokens={m.completion_tokens} e2e={_ms(m.e2e)}"
    )


def access_sink(record: RequestRecord) -> None:
    # WARNING so the process's one WARNING-level handler prints it; the logger name says access.
    log.warning("%s", access_line(record))
