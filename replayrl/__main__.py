"""`python -m replayrl ...` is the `replayrl` command."""

from replayrl.cli import main

raise SystemExit(main())
