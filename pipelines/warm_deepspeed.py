"""Build DeepSpeed's just-in-time ops once at setup time, not inside every test or first step.

On a CPU machine DeepSpeed compiles its shared-memory communication op (~30 s, needs g++) on the
first distributed start; the build lands in TORCH_EXTENSIONS_DIR and is reused afterwards.
On CUDA machines NCCL needs no such op and this is a no-op.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> int:
    try:
        import deepspeed  # noqa: F401  (training extra; absent in a cache-only install)
        from deepspeed.accelerator import get_accelerator
        from deepspeed.comm.torch import build_shm_op
    except ImportError:
        print("warm_deepspeed: deepspeed is not installed; skipping (install the 'train' extra to train)")
        return 0
    if get_accelerator().device_name() != "cpu":
        print(f"warm_deepspeed: accelerator is {get_accelerator().device_name()}; no CPU op to build")
        return 0
    start = time.perf_counter()
    op = build_shm_op()
    where = os.environ.get("TORCH_EXTENSIONS_DIR", "the default torch extensions dir")
    state = "ready" if op is not None else "not supported here (DeepSpeed falls back to plain gloo)"
    print(f"warm_deepspeed: shared-memory comm op {state} in {time.perf_counter() - start:.1f}s ({where})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
