"""Stage 1, everything up to the cache: what a cache is keyed on, the plan, the precompute job and its
work units, the store (zarr and webdataset) and verify. Plain single-process code: ranks, barriers
and progress across processes are the launch layer's (``pipelines``)."""
