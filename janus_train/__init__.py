"""Stage 2, training from a cache, by job: the reader stage (``data/``), the model (``model/``), the
train settings (``config.py``), the run directory (``run/``), checkpoints (``checkpoint/``), the loop
(``loop/``) and a run built from a profile (``build.py``); each folder imports only those before it."""
