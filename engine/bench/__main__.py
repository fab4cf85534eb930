"""`python -m engine.bench ...` (or `python -m engine bench ...`): see engine/bench/cli.py."""

from engine.bench.cli import main

raise SystemExit(main())
