"""The run manager: one writer's lease, staging, background uploads, commits, retention, fetching.

Imports no Keras: the Keras callback, `resume()` and the CLI all go through it.
"""
