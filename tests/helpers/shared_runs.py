"""Session fixtures: finished training runs built once per test session and shared (read-only).

A test that resumes, damages or exports into a run copies it first (``shutil.copytree``).
"""
