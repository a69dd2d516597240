"""``python -m resumable``: the same as the ``resumable`` command."""

from resumable.cli.app import main

raise SystemExit(main())
