import resource, time, sys
sys.path.insert(0, "tests")
from helpers.forked_ranks import forked_launch
from helpers.training import torchrun_train
import pytest
def cpu():
    s = resource.getrusage(resource.RUSAGE_SELF); c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
def test_proto(tiny_training, tmp_path):
    for name, fn in [("forked", lambda *a: forked_launch("pipelines.train", *a)), ("forked2", lambda *a: forked_launch("pipelines.train", *a, env={"ZZ_PROFILE": "/tmp/prof"}))]:
        c0, t0 = cpu(), time.time()
        r = fn("--out", tmp_path / name, "--cache", tiny_training.fp32_cache, "--profile", tiny_training.fp32_profile, "--no-export", "--max-steps", "2")
        print(name, r.returncode, f"cpu {cpu()-c0:.1f} wall {time.time()-t0:.1f}")
        print(r.stdout[-600:], r.stderr[-1500:])
