"""The ``resumable`` command line; its entry point is `resumable.cli.app.main`.

- `app`: the parser, `main`, and the one place errors become an ``error:`` line and an exit code
- `listing`, `inspection`, `verify`, `prune`, `demo`: one command each, as a plain function
- `common`: exit codes, `UsageError`, opening a run, picking and ranking checkpoints
- `output`: printing lines, JSON and progress bars, and the cell formats commands share
"""
