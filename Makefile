# janus: `make demo` runs the pipeline on built-in sample data, `make test` runs the test suite.
# Every target installs what it needs on first use (into $(VENV)).

SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON_SYS ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
JANUS_CACHE := $(VENV)/bin/janus-cache
JANUS_TRAIN := $(VENV)/bin/janus-train
EXTRAS ?= train,test,s3
# CPU machines pin torch to the CPU wheel (no CUDA downloads); a machine with nvidia-smi keeps
# whatever torch its environment has. Override with TORCH_CONSTRAINTS= or a file of your own.
TORCH_CONSTRAINTS ?= $(if $(shell command -v nvidia-smi 2>/dev/null),,constraints-cpu.txt)

PROFILE ?= tiny
# Profile overrides without a new YAML file: SET="train.grad_accum=4 cache.resolution=pad448" (each word
# becomes one --set KEY=VALUE of every profile-taking command below; these values cannot hold spaces).
SET ?=
SET_ARGS = $(foreach s,$(SET),--set $(s))
# One demo folder per profile (demo_out/tiny, demo_out/tiny-qwen3): a profile's demo starts its own
# folder afresh and leaves the other profiles' demos as they are.
DEMO_ROOT ?= demo_out
DEMO_DIR ?= $(DEMO_ROOT)/$(PROFILE)
DATA ?=
# DATA as one single-quoted shell word (its own ' written '\''): any path a user can type (spaces,
# quotes, '$', non-ASCII) arrives as typed, and `make -n` shows it.
DATA_ARG = '$(subst ','\'',$(value DATA))'
# OUT, CACHE and RUN (paths) likewise, as one single-quoted word each: a path with spaces stays one
# argument (RUN="my run" must not become --out my plus a stray word that torchrun would run).
shell_word = '$(subst ','\'',$($(1)))'
OUT ?= cache
FORMAT ?= zarr
# DATA: the dataset; several sources, in cache order, as DATA="r2r=data/r2r rxr=data/rxr" (a bare
# path keeps its own keys; NAME=PATH prefixes them with NAME/; one existing path may hold spaces, quote
# such a path among several: DATA='r2r="my data/r2r" rxr=data/rxr'). make train DATA=... checks the cache
# against it before training.
# Processes per node; default: the profile's nproc_per_node. Multi-node: pass torchrun's own
# settings, e.g. TORCHRUN_ARGS="--nnodes 2 --node-rank 0 --master-addr node0 --master-port 29500".
NPROC ?= $(shell $(PY) -c "import sys; from janus_core.profile import load_profile; print(load_profile(sys.argv[1], sys.argv[2:]).nproc_per_node)" '$(PROFILE)' $(SET) 2>/dev/null || echo 1)
TORCHRUN_ARGS ?= --standalone
# torchrun runs through pipelines.launch: a failed rank's own `error:` line stays the last thing on the
# console, and torchrun's 30-50 line failure report goes to a log file that one line names.
LAUNCH = $(PY) -m pipelines.launch
# torchrun gives each of several processes on a node OMP_NUM_THREADS=1 when it is unset, with a
# 4-line warning; naming its own default keeps the log short (set OMP_NUM_THREADS to change).
LAUNCH_ENV = $(if $(filter-out 1,$(NPROC)),OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1})
PRECOMPUTE_ARGS ?=
VERIFY_ARGS ?=
# The demo's export: JanusVLN's reference layout (janusvln) for a Qwen2.5-VL profile; that layout is
# Qwen2.5-VL's, so a profile on another base (PROFILE=tiny-qwen3) exports transformers' own (janus).
DEMO_FORMAT = $(shell $(PY) -c "import sys; from janus_core.profile import load_profile; from janus_core.bases import DEFAULT_BASE, base_of_qwen_dir; print('janusvln' if base_of_qwen_dir(load_profile(sys.argv[1]).qwen.path) is DEFAULT_BASE else 'janus')" '$(PROFILE)' 2>/dev/null || echo janusvln)
STAMP := $(VENV)/.janus-setup

.PHONY: help setup test test-fast demo precompute train verify bench bench-gpu bench-scale device-wheels clean-demo

help:
	@echo "make setup       install janus and its dependencies into $(VENV)"
	@echo "make demo [PROFILE=tiny|tiny-qwen3]  run janus on generated sample data into demo_out/PROFILE (tiny profile, CPU; tiny-qwen3: Qwen3-VL)"
	@echo "make test        run the test suite (both tiers: tests/unit and tests/e2e)"
	@echo "make test-fast   run the unit tier only (in-process tests, no CLI/torchrun/make)"
	@echo "make precompute DATA=dir [PROFILE=tiny] [SET='cache.resolution=pad448 ...'] [OUT=cache] [NPROC=n] [FORMAT=zarr|wds]  (DATA=\"r2r=dir1 rxr=dir2\": several sources)"
	@echo "make verify CACHE=dir [DATA=dir] [PROFILE=tiny] [NPROC=n] [VERIFY_ARGS='--live 8 --json report.json']"
	@echo "make train [PROFILE=tiny|h800] [SET='train.grad_accum=4 ...'] [CACHE=cache | MIXTURE='r2r=dir:0.7 rxr=dir:0.3'] [DATA=dir] [RUN=runs/PROFILE] [NPROC=n]"
	@echo "make bench       live vs cached data path, storage, FLOPs per sample (CPU; GPU section with CUDA)"
	@echo "make bench-gpu   janus vs reference precompute and training step on one GPU (< 10 min)"
	@echo "make bench-scale [SAMPLES=10000,100000,612560] [PRECOMPUTE_SAMPLES=1000,10000]  costs vs dataset size"
	@echo "make device-wheels  the wheels benchmarks/device_run.sh carries to a GPU machine without network (.whl/)"

$(STAMP): pyproject.toml $(TORCH_CONSTRAINTS)
	@test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_CONSTRAINTS),-c $(TORCH_CONSTRAINTS)) -e ".[$(EXTRAS)]"
	@# An editable install leaves the source tree uncompiled: compile it once, as pip does for a regular
	@# install (where PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile each module).
	$(PY) -m compileall -q janus_core janus_cache janus_train pipelines benchmarks
	$(PY) -m pipelines.cpu_comm_op
	@touch $(STAMP)

setup: $(STAMP)

# Tests run in TEST_WORKERS pytest-xdist processes, one test file at a time each; TEST_WORKERS=0 runs
# them in this process. Files go out in collection order (tests/e2e, the long ones, first), so the
# many short unit files fill the end and neither worker waits long on the other's last file.
TEST_WORKERS ?= 2
TEST_RUN = $(PY) -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

test: $(STAMP)
	$(TEST_RUN) $(PYTEST_ARGS)

# The unit tier alone (no process starts: tests/unit/conftest.py refuses them).
test-fast: $(STAMP)
	$(TEST_RUN) tests/unit $(PYTEST_ARGS)

demo: $(STAMP)
	rm -rf $(DEMO_DIR)
	$(JANUS_CACHE) sample-data $(DEMO_DIR)/data --episodes 3 --steps 14 --seed 0
	$(JANUS_CACHE) index $(DEMO_DIR)/data --profile $(PROFILE)
	$(MAKE) --no-print-directory precompute DATA=$(DEMO_DIR)/data OUT=$(DEMO_DIR)/cache PROFILE=$(PROFILE) NPROC=2
	$(JANUS_CACHE) info $(DEMO_DIR)/cache
	$(MAKE) --no-print-directory verify CACHE=$(DEMO_DIR)/cache DATA=$(DEMO_DIR)/data PROFILE=$(PROFILE) NPROC=2
	$(MAKE) --no-print-directory train CACHE=$(DEMO_DIR)/cache DATA=$(DEMO_DIR)/data RUN=$(DEMO_DIR)/run PROFILE=$(PROFILE) NPROC=2
	$(JANUS_TRAIN) export $(DEMO_DIR)/run --out $(DEMO_DIR)/$(DEMO_FORMAT) --profile $(PROFILE) --format $(DEMO_FORMAT)
	@echo "demo done: data $(DEMO_DIR)/data, cache $(DEMO_DIR)/cache, run $(DEMO_DIR)/run (metrics.jsonl, export/), $(if $(filter janusvln,$(DEMO_FORMAT)),reference JanusVLN checkpoint,transformers export) $(DEMO_DIR)/$(DEMO_FORMAT)"

precompute: $(STAMP)
	@test -n $(DATA_ARG) || { echo "make precompute: set DATA=<dataset folder or annotation file>" >&2; exit 2; }
	$(LAUNCH_ENV) $(LAUNCH) $(TORCHRUN_ARGS) --nproc_per_node $(NPROC) -m pipelines.precompute $(DATA_ARG) \
		--out $(call shell_word,OUT) --profile $(PROFILE) $(SET_ARGS) --format $(FORMAT) $(PRECOMPUTE_ARGS)

CACHE ?= $(OUT)
# Several zarr caches drawn with sampling weights, instead of CACHE: MIXTURE="r2r=DIR:0.7 rxr=DIR:0.3"
# (each word becomes one --cache NAME=PATH:WEIGHT; these paths cannot hold spaces).
MIXTURE ?=
RUN ?= runs/$(PROFILE)
TRAIN_ARGS ?=

train: $(STAMP)
	$(LAUNCH_ENV) $(LAUNCH) --launcher-log $(call shell_word,RUN)/launcher.log $(TORCHRUN_ARGS) --nproc_per_node $(NPROC) -m pipelines.train \
		$(if $(MIXTURE),$(foreach c,$(MIXTURE),--cache $(c)),--cache $(call shell_word,CACHE)) --out $(call shell_word,RUN) --profile $(PROFILE) $(SET_ARGS) \
		$(if $(value DATA),--data $(DATA_ARG)) $(TRAIN_ARGS)

verify: $(STAMP)
	@# CACHE defaults to OUT (cache, precompute's default): say so when no cache is there (a bucket's URL is checked by verify).
	@case "$(CACHE)" in s3://*) ;; *) test -e "$(CACHE)" || { echo "make verify: no cache at $(CACHE) (CACHE defaults to OUT=$(OUT)): set CACHE=<cache directory> (and DATA=<dataset> for the dataset and live checks)" >&2; exit 2; };; esac
	$(LAUNCH_ENV) $(LAUNCH) $(TORCHRUN_ARGS) --nproc_per_node $(NPROC) -m pipelines.verify $(call shell_word,CACHE) \
		--profile $(PROFILE) $(SET_ARGS) $(if $(value DATA),--data $(DATA_ARG)) $(VERIFY_ARGS)

# The benchmarks live in benchmarks/; results and plots go to benchmarks/results/ (--out DIR elsewhere).
bench: $(STAMP)
	$(PY) -m benchmarks.bench $(BENCH_ARGS)

bench-gpu: $(STAMP)
	$(PY) -m benchmarks.bench_gpu $(BENCH_ARGS)

# Hard-linked datasets of SAMPLES samples (index, plan) and PRECOMPUTE_SAMPLES (precompute, resume,
# verify, trainer start-up check, reads); results in benchmarks/results/bench_scale.{json,md}.
SAMPLES ?= 10000,100000,612560
PRECOMPUTE_SAMPLES ?= 1000,10000
bench-scale: $(STAMP)
	$(PY) benchmarks/bench_scale.py --sizes "$(SAMPLES)" --precompute-sizes "$(PRECOMPUTE_SAMPLES)" --nproc $(NPROC) $(BENCH_ARGS)

# The prepared GPU run (benchmarks/device_run.sh) on a machine without network: the wheels of
# benchmarks/device_wheels.txt for its CPython 3.12 on x86-64 Linux, downloaded without their
# dependencies (device_env.py checks those against the machine's image), then checked and test-installed.
DEVICE_WHEELS := .whl
device-wheels: $(STAMP)
	rm -rf $(DEVICE_WHEELS)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
		--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
		-d $(DEVICE_WHEELS) -r benchmarks/device_wheels.txt
	$(PY) -m benchmarks.device_env $(DEVICE_WHEELS)

clean-demo:
	rm -rf $(DEMO_DIR)
