"""`python -m loadtests.bench.sweep [SET] [options]`: the one runner of the sweeps, by set.

    decide     agent sessions x every configuration, cells interleaved (docs/sweep.md); the
               default when no set is named (`make sweep`)
    sessions   agent sessions at the source documents' context sizes, resumable by stage
               (`run`, `plan`, `render`; docs/sessions-sweep.md)
    policy     a policy against each of its variants alone, probe streams (docs/policy-sweep.md)

`python -m loadtests.bench.sweep SET --help` lists a set's options.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from loadtests.bench.sweep import decide, policy
from loadtests.bench.sweep.sessions import cli as sessions

SETS: dict[str, Callable[[list[str] | None], int]] = {
    "decide": decide.main,
    "sessions": sessions.main,
    "policy": policy.main,
}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in SETS:
        return SETS[args[0]](args[1:])
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    return decide.main(args)


if __name__ == "__main__":
    raise SystemExit(main())
