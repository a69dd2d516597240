"""The drop-ins for Keras' names: `ModelCheckpoint`, `BackupAndRestore`, `save_model` and
`load_model`, and the newest good file of a `ModelCheckpoint` folder."""
