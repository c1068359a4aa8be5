"""The benchmarks, in one home: ``make bench`` (:mod:`benchmarks.bench`), ``make bench-gpu``
(:mod:`benchmarks.bench_gpu`), ``make bench-scale`` (``bench_scale.py``) and the component
benchmarks (``bench_imaging.py``, ``bench_store.py``, ``bench_vggt.py``); ``machine_cpu`` measures
what a command (``make test``) costs the whole machine. Results and plots go to
``benchmarks/results/`` (its README says what was measured when and where).

The top layer: a benchmark may import ``pipelines``, ``janus_train`` and ``janus_cache``; none of
them imports a benchmark (``tests/unit/test_import_layers.py``), so ``janus-cache`` never pays for one.
"""
