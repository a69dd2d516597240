"""`CheckpointCallback` and its parts: its options, its schedule, where a fit stands, the run folder
held for a fit, the checkpoint it builds and hands to the manager, what a restored checkpoint hands
to the next fit, the lines it prints, and interrupts (Ctrl-C, SIGTERM, notebook cells)."""
