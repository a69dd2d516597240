"""A checkpoint taken from a model: the snapshot in host memory, the builder that hands it to the
manager, and the files a model and its training state become."""
