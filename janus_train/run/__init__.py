"""A run directory: every file's name, what the run records about itself, and its metric logs."""
