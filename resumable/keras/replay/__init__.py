"""The inputs of `Run.fit` replayed, so a resumed run reads the batches an unbroken run reads."""
