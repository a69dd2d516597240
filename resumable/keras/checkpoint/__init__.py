"""A checkpoint's contents: a model and its training state to files (`model_to_files`, through a
`snapshot` held in host memory) and back (`files_to_model`), every file read back checked."""
