"""The ``resumable`` command line (see `resumable.cli.app`)."""
