"""``python -m minirunner``: the command line (see minirunner.cli)."""

from minirunner.cli import main

raise SystemExit(main())
