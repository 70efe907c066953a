import sys

from loadtests.bench.overhead.cli import main

sys.exit(main())
