"""The machine under both stages, apart from the domain: crash-safe files, disk space, the one-writer
lock, worker processes and compute threads, file modes and devices."""
