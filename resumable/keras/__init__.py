"""The Keras side, grouped by job; each sub-package imports only those listed before it.

- `compat`: every use of Keras', TensorFlow's, JAX's and torch's private names (one place to fix
  when a release moves them); `topology`: where a job runs (strategy, distribution, hosts).
- `checkpoint`: a checkpoint's contents, a model and its training state to files and back.
- `replay`: the inputs a fit reads, positioned so that a resumed epoch reads what it would have.
- `multihost`: a job split across hosts, each writing its part of one checkpoint.
- `callback`: `CheckpointCallback` and its parts (options, schedule, the save it hands the manager).
- `resuming`: the newest good checkpoint found, loaded and handed to the next fit.
- `dropins`: Keras' names (`ModelCheckpoint`, `BackupAndRestore`, `save_model`, ...) and adopting
  Keras' own checkpoints.
- `run`: `resume()` and `Run`, the notebook's entry point.
"""
