"""`python -m bench ...`: see bench/bench.py."""

from bench.bench import main

raise SystemExit(main())
