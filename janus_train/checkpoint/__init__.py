"""Checkpoints: tags a resume can trust, the best one, resuming elsewhere, export, and the reference trainer's layout."""
