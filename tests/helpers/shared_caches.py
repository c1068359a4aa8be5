"""Session fixtures: precomputed caches built once per test session and shared (read-only).

A test that damages, appends to or repairs a cache copies it first (``shutil.copytree``).
"""
