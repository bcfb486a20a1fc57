"""`python -m prefetch ...`: the `prefetch` command (see prefetch.cli)."""

from prefetch.cli import main

raise SystemExit(main())
