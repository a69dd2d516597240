"""The pure core: names, manifests, retention policy, checksums, errors and display.

Nothing here touches a file system or imports Keras; every other layer builds on it.
"""
