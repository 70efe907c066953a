from loadtests.bench.soak.cli import main

raise SystemExit(main())
