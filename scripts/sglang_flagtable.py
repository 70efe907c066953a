"""SGLang's `launch_server` flags, read from its own parser (nothing is launched).

    "$(scripts/sglang.sh)/venv/bin/python" scripts/sglang_flagtable.py \
        > proxy/ops/deploy/sglang_flags/0.5.23.txt

Runs in the venv scripts/sglang.sh makes (SGLang's server does not run on this CPU, but its
argument parser does): `ServerArgs.add_cli_args` builds the parser `python -m
sglang.launch_server` uses; every `--` option string is kept, then the `--speculative-algorithm`
names (the `SpeculativeAlgorithm` members but NONE, and the aliases SGLang reserves) and the
`--attention-backend` choices.
"""

from __future__ import annotations

import argparse

import sglang
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.spec_registry import _RESERVED_ALIASES

ALGORITHM = "speculative-algorithm "  # a table line naming one --speculative-algorithm value
ATTENTION = "attention-backend "  # one --attention-backend value


def main() -> None:
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    flags = sorted({o for a in parser._actions for o in a.option_strings if o.startswith("--")})
    attention = next(a for a in parser._actions if a.dest == "attention_backend").choices or []
    algorithms = sorted({m.name for m in SpeculativeAlgorithm if m.name != "NONE"})
    algorithms += sorted(_RESERVED_ALIASES)
    print(
        f"# SGLang {sglang.__version__}, `python -m sglang.launch_server` flags, one per line, "
        "sorted; then its --speculative-algorithm names and --attention-backend choices."
    )
    print("# Read with scripts/sglang_flagtable.py from ServerArgs.add_cli_args (its own parser).")
    print(*flags, sep="\n")
    print(*(ALGORITHM + a for a in algorithms), sep="\n")
    print(*(ATTENTION + a for a in attention), sep="\n")


if __name__ == "__main__":
    main()
