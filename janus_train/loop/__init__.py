"""The training loop: the trainer, validation, per-step metrics and the guards that stop a run cleanly."""
