"""Keras' own names and files: the drop-ins (`ModelCheckpoint`, `BackupAndRestore`, `save_model` and
`load_model`), the newest good file of a `ModelCheckpoint` folder, and the checkpoints Keras' own
callbacks wrote, adopted by `resume()` (`adopt`, `orbax_steps`)."""
