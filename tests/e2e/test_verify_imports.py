"""The verify library stays a layer of its own: a fresh interpreter that imports it has imported
neither the trainer nor the launch layer. (The training gate itself, in process:
tests/unit/test_verify_gate.py.)"""

from __future__ import annotations

import subprocess
import sys


def test_the_verify_library_imports_neither_the_trainer_nor_the_launch_layer() -> None:
    code = ("import sys, janus_cache.verify; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'janus_train', 'pipelines'}))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
