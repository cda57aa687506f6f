"""``python -m covey ...``: the ``covey`` command line."""

from covey.cli import main

raise SystemExit(main())
