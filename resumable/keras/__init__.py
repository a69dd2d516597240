"""The Keras side: the callback, model I/O, positioning in an epoch, `resume()` and `Run`."""
