"""Build-time tools: generators of the committed assets (not part of the installed packages)."""
