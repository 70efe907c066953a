"""The request's record: what one request did, written by the request path (`relay/`) and read
by the sinks that report on it (`observe/`, the dashboard). It imports neither of them.

- request.py: `RequestRecord`, one request from arrival to its last byte.
- measure.py: `Measurement`, its times and token counts, and what they give (TTFT, ITL,
  tokens per step, phases).
- steps.py: tokens per target step, the one definition for every engine kind.
"""
