"""A checkpoint back into a run: the newest that loads, its files read back and checked, the
state restored, and the model files a folder held before (adopted by `resume()`)."""
