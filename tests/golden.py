"""Where the vLLM golden fixtures live: in the repository (tests/fixtures/vllm-golden/<version>/),
byte-for-byte copies of the reference set's files that the tests read (each fixture's
`<name>.input.json` and its body), so that a clone with nothing beside it runs every golden test.
How the bodies were produced and how to compare them: tests/fixtures/vllm-golden/README.md."""

from __future__ import annotations

from pathlib import Path

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "vllm-golden"
VERSIONS = ("0.28.0", "0.33.0")
