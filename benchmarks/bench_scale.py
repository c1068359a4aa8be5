"""Scale benchmark: what each stage costs as the dataset grows to the real set's 612,560 samples.

The dataset is made of HARD-LINKED frames: the sample data's rendered episodes
(``janus_core.sample_data``, real 640x480 PNGs and description JSONs) linked many times into
episode folders of ``--steps`` frames (every frame a sample), so a 612k-sample dataset costs
directory entries, not disk (check ``df -i``). Each measured step runs as its own process (its
wall time and peak RSS come from ``wait4``: for a launch, the largest process of the tree, which
for a precompute is its index worker; each rank's own peak is read from the summary's
``peak memory`` line and is what the per-rank target checks):

* ``index 1st`` / ``index 2nd``: ``janus-cache index`` with an empty, then a filled index store;
* ``plan 1st`` / ``plan 2nd``: ``janus-cache plan`` likewise (target: the 2nd >= 5x faster);
* on the (smaller) ``--precompute-sizes``: ``precompute`` (``--nproc`` ranks, the tiny profile at
  ``--resolution``; target: each rank <= 1 GB), ``resume`` (the same command with nothing to do;
  target <= 60 s),
  ``verify --data`` (``--live 0``, all checksums), ``start-up check`` (the trainer's
  ``check_cache_for_training``, timed inside the process, whose total with Python start-up and
  imports is shown too; target <= 5 s, <= 600 MB) and ``read`` (ms per random sample
  read through the zarr reader).

Prints one table (seconds and MB per size) with each cost's growth per 10x samples, checks the
targets at the largest size measured and writes everything to ``--results`` (JSON) and a
Markdown table next to it. A full precompute of 612k samples at pad112 takes about 80 minutes on
2 idle cores; ``--precompute-sizes`` chooses the sizes (their growth is printed too).

Run: ``make bench-scale SAMPLES=10000,100000,612560 PRECOMPUTE_SAMPLES=2000,20000``
or ``python benchmarks/bench_scale.py --sizes 1000,10000``; ``--only index`` (or ``verify``, with
a finished cache from an earlier run) measures one cost alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
TINY_PROFILE = REPO / "configs" / "profiles" / "tiny.yaml"
TEMPLATE_EPISODES, TEMPLATE_STEPS = 2, 20
READS = 200
TARGETS = {  # metric -> (limit, unit, what)
    "resume": (60.0, "s", "resume with nothing to do <= 60 s"),
    "start-up check": (5.0, "s", "trainer start-up check <= 5 s"),
}
RSS_TARGETS = {
    "start-up check": (600.0, "trainer start-up check <= 600 MB RSS"),
    "precompute": (1024.0, "precompute per-rank RSS <= 1 GB"),
    "resume": (1024.0, "resume per-rank RSS <= 1 GB"),
    # verify --data compares the dataset with the cache's stored column index, never a whole index
    # of objects on rank 0 (2.4 GB at 612,560 samples before): the largest process of the launch.
    "verify": (1024.0, "verify --data RSS <= 1 GB"),
    "index 1st": (1024.0, "first index build RSS <= 1 GB"),
}


@dataclass
class Measure:
    metric: str
    samples: int
    seconds: float
    rss_mb: float
    ok: bool
    note: str = ""
    cpu_seconds: float | None = None
    """User + system CPU time of the process and its descendants (steadier than wall time on a
    shared machine)."""
    rank_rss_mb: float | None = None
    """Precompute: the largest rank's own peak RSS (its summary line), without its worker processes
    (the index worker and the decode workers, whose peak is in ``note``)."""
    inner_seconds: float | None = None
    """Start-up check: the check itself, timed in the process (without Python start-up and imports,
    which a trainer has paid before it checks its cache)."""


@dataclass
class Results:
    sizes: list[int]
    precompute_sizes: list[int]
    machine: str
    measures: list[Measure] = field(default_factory=list)

    def get(self, metric: str, samples: int) -> Measure | None:
        return next((m for m in self.measures if m.metric == metric and m.samples == samples), None)


# ------------------------------------------------------------------------------ the dataset


def template(work: Path) -> Path:
    from janus_core.sample_data import write_sample_data

    root = work / "template"
    if not (root / ".complete").exists():
        shutil.rmtree(root, ignore_errors=True)
        write_sample_data(root, episodes=TEMPLATE_EPISODES, steps=TEMPLATE_STEPS, seed=0)
        # An hour old, as a real dataset's files are: a file modified moments before indexing is
        # re-read by the next run (janus_core.index.cached.RACY_NS); hard links share this mtime.
        then = time.time_ns() - 3600 * 10**9
        for path in root.rglob("*"):
            os.utime(path, ns=(then, then))
        (root / ".complete").touch()
    return root


def linked_dataset(work: Path, samples: int, steps: int) -> Path:
    """Episode folders of ``steps`` frames (the last one shorter) holding ``samples`` frames, every
    file a hard link to the template's (made once per size, reused by later runs)."""
    from janus_core.index import MILESTONES_FILE

    root = work / f"data-{samples}"
    marker = root / f".complete-{steps}"
    if marker.exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    source = template(work)
    episodes = sorted(p for p in source.iterdir() if p.is_dir())
    frames = [sorted(p.name for p in e.iterdir() if p.suffix == ".png") for e in episodes]
    for e in range(math.ceil(samples / steps)):
        src = episodes[e % len(episodes)]
        names = frames[e % len(episodes)]
        folder = root / f"episode_{e:06d}"
        folder.mkdir(parents=True)
        os.link(src / MILESTONES_FILE, folder / MILESTONES_FILE)
        for k in range(min(steps, samples - e * steps)):
            name = names[k % len(names)]
            action = name[len("step_0000_"):-len(".png")]
            stem = f"step_{k:04d}_{action}"
            os.link(src / name, folder / f"{stem}.png")
            os.link(src / name.replace(".png", ".json"), folder / f"{stem}.json")
    marker.touch()
    return root


def bench_profile(work: Path, resolution: str) -> Path:
    """The tiny profile at ``resolution`` with shards sized for large caches."""
    data = yaml.safe_load(TINY_PROFILE.read_text())
    for section, key in (("vggt", "config"), ("qwen", "path")):
        data[section][key] = str((TINY_PROFILE.parent / data[section][key]).resolve())
    data["name"] = "bench-scale"
    data["cache"].update(resolution=resolution, frames_per_shard=256, samples_per_shard=64)
    path = work / "profile.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ------------------------------------------------------------------------------ measuring


def measure(command: list[str], env: dict[str, str] | None = None, log: Path | None = None
            ) -> tuple[float, float, float, int, str]:
    """(wall seconds, CPU seconds, peak RSS in MB of the process or its largest waited-for
    descendant, exit code, output) of ``command``."""
    started = time.perf_counter()
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                          env={**os.environ, **(env or {})}) as proc:
        output = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - started
    if log is not None:
        log.write_text(output)
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode, output


def launch(module: str, args: list[str], nproc: int) -> list[str]:
    if nproc <= 1:
        return [sys.executable, "-m", module, *args]
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    return [torchrun, "--standalone", "--nproc_per_node", str(nproc), "-m", module, *args]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipelines.cache_cli", *args]


STARTUP = """
import sys, time
from janus_cache.verify import check_cache_for_training
start = time.perf_counter()
check_cache_for_training(sys.argv[1], sys.argv[2])
print(f"check {time.perf_counter() - start:.3f} s")
"""
PEAKS = re.compile(r"peak memory: ranks? ([\d, ]+) MB; workers up to (\d+) MB")
CHECK = re.compile(r"^check ([\d.]+) s$", re.M)

READ = """
import random, sys, time
from janus_core.profile import load_profile
from janus_cache.keys import window_variant
from janus_cache.store import open_cache
profile = load_profile(sys.argv[2])
reader = open_cache(sys.argv[1], resolution=profile.cache.resolution.name,
                    variant=window_variant(profile.cache).name).reader
rows = random.Random(0).sample(range(len(reader)), min(int(sys.argv[3]), len(reader)))
reader[rows[0]]
start = time.perf_counter()
for row in rows:
    reader[row]
print(f"ms per sample {(time.perf_counter() - start) / len(rows) * 1e3:.3f}")
"""


ONLY: set[str] = set()
"""``--only``: the costs to measure (``index``, ``plan``, ``precompute``, ``resume``, ``verify``,
``start-up``, ``read``); empty: all of them."""


def run_step(results: Results, metric: str, samples: int, command: list[str], work: Path,
             env: dict[str, str] | None = None) -> Measure:
    if ONLY and metric.split()[0] not in ONLY and metric != "python + imports":
        return Measure(metric, samples, 0.0, 0.0, True, "not measured (--only)")
    log = work / "logs" / f"{metric.replace(' ', '_')}-{samples}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    seconds, cpu, rss, code, output = measure(command, env, log)
    note = "" if code == 0 else f"exit {code}, see {log}: {output.strip().splitlines()[-1] if output.strip() else ''}"
    if metric == "read" and code == 0:
        note = output.strip().splitlines()[-1]
    m = Measure(metric, samples, seconds, rss, code == 0, note, cpu)
    peaks, check = PEAKS.search(output), CHECK.search(output)
    if peaks:
        m.rank_rss_mb = max(float(v) for v in peaks.group(1).split(","))
        m.note = f"ranks {peaks.group(1)} MB, workers up to {peaks.group(2)} MB"
    if check:
        m.inner_seconds = float(check.group(1))
        m.note = f"the check itself {m.inner_seconds:.2f} s"
    results.measures.append(m)
    print(f"  {metric:<16} {samples:>8} samples  {seconds:8.1f} s (cpu {cpu:6.1f} s)  {rss:7.0f} MB"
          + (f"  {note}" if note else ""), flush=True)
    return m


BASELINE = "import pipelines.cache_cli, pipelines.precompute, janus_cache.verify"


def bench_baseline(results: Results, work: Path) -> None:
    """What every measured command pays before its work: Python and the imports (size 0)."""
    run_step(results, "python + imports", 0, [sys.executable, "-c", BASELINE], work)


def bench_size(results: Results, work: Path, profile: Path, samples: int, steps: int) -> None:
    start = time.perf_counter()
    data = linked_dataset(work, samples, steps)
    print(f"dataset of {samples} samples ready in {time.perf_counter() - start:.1f} s: {data}", flush=True)
    for what, args in (("index", ["index", str(data), "--profile", str(profile), "--json"]),
                       ("plan", ["plan", str(data), "--profile", str(profile), "--json"])):
        store = work / "stores" / f"{what}-{samples}"
        shutil.rmtree(store, ignore_errors=True)
        env = {"JANUS_INDEX_CACHE": str(store)}
        run_step(results, f"{what} 1st", samples, cli(*args), work, env)
        run_step(results, f"{what} 2nd", samples, cli(*args), work, env)


def bench_cache(results: Results, work: Path, profile: Path, samples: int, steps: int, nproc: int,
                reuse: bool = False) -> None:
    """Precompute, resume, verify, start-up check and reads at ``samples``; with ``reuse`` a finished
    cache of an earlier run is kept and only the steps after the precompute are measured."""
    data = linked_dataset(work, samples, steps)
    cache = work / "caches" / f"cache-{samples}"
    precompute = launch("pipelines.precompute", [str(data), "--out", str(cache), "--profile", str(profile)], nproc)
    reuse = reuse or bool(ONLY) and "precompute" not in ONLY
    if reuse and (cache / "report.json").is_file():
        print(f"  precompute       {samples:>8} samples  (reusing the finished cache {cache})", flush=True)
    elif ONLY and "precompute" not in ONLY:
        print(f"  (no finished cache {cache} to measure: add precompute to --only, or --reuse-caches)", flush=True)
        return
    else:
        shutil.rmtree(cache, ignore_errors=True)
        if not run_step(results, "precompute", samples, precompute, work).ok:
            return
    run_step(results, "resume", samples, precompute, work)
    run_step(results, "verify", samples, launch("pipelines.verify", [str(cache), "--data", str(data), "--profile",
                                                                     str(profile), "--live", "0"], nproc), work)
    run_step(results, "start-up check", samples, [sys.executable, "-c", STARTUP, str(cache), str(profile)], work)
    run_step(results, "read", samples, [sys.executable, "-c", READ, str(cache), str(profile), str(READS)], work)


# ------------------------------------------------------------------------------ the table


def growth(results: Results, metric: str, cpu: bool = False) -> str:
    """Cost ratio per 10x samples between the two largest sizes measured (wall or CPU seconds)."""
    points = sorted((m.samples, m.cpu_seconds if cpu else m.seconds) for m in results.measures
                    if m.metric == metric and m.ok and (m.cpu_seconds is not None or not cpu))
    if len(points) < 2 or points[-1][0] == points[-2][0]:
        return "-"
    (n1, t1), (n2, t2) = points[-2], points[-1]
    return f"x{(t2 / max(t1, 1e-9)) ** (1 / math.log10(n2 / n1)):.2f}"


def table(results: Results) -> str:
    metrics = list(dict.fromkeys(m.metric for m in results.measures))
    sizes = sorted({m.samples for m in results.measures})
    head = ["cost"] + [f"{n} samples" if n else "no data" for n in sizes] + ["per 10x samples (wall)", "(cpu)"]
    rows = []
    for metric in metrics:
        cells = []
        for n in sizes:
            m = results.get(metric, n)
            cpu = f" (cpu {m.cpu_seconds:.1f} s)" if m is not None and m.cpu_seconds is not None else ""
            extra = "" if m is None else (f"; check {m.inner_seconds:.2f} s" if m.inner_seconds is not None else "") + (
                f"; ranks <= {m.rank_rss_mb:.0f} MB" if m.rank_rss_mb is not None else "")
            cells.append("" if m is None else (f"{m.seconds:.1f} s{cpu}, {m.rss_mb:.0f} MB{extra}" if m.ok else "failed"))
        rows.append([metric, *cells, growth(results, metric), growth(results, metric, cpu=True)])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    reads = [m for m in results.measures if m.metric == "read" and m.ok]
    lines += [f"\nread latency at {m.samples} samples: {m.note}" for m in reads]
    return "\n".join(lines)


def check_targets(results: Results) -> list[str]:
    lines = []
    for metric, (limit, _unit, what) in TARGETS.items():
        m = max((x for x in results.measures if x.metric == metric and x.ok), key=lambda x: x.samples, default=None)
        if m is not None:
            seconds = m.inner_seconds if m.inner_seconds is not None else m.seconds
            total = f" (the process {m.seconds:.1f} s with Python start-up and imports)" \
                if m.inner_seconds is not None else ""
            lines.append(f"{'PASS' if seconds <= limit else 'FAIL'} {what}: {seconds:.1f} s at {m.samples}{total}")
    for metric, (limit, what) in RSS_TARGETS.items():
        m = max((x for x in results.measures if x.metric == metric and x.ok), key=lambda x: x.samples, default=None)
        if m is not None:
            rss = m.rank_rss_mb if m.rank_rss_mb is not None else m.rss_mb
            workers = f" (largest rank; {m.note})" if m.rank_rss_mb is not None else ""
            lines.append(f"{'PASS' if rss <= limit else 'FAIL'} {what}: {rss:.0f} MB at {m.samples}{workers}")
    for n in results.sizes:
        first, second = results.get("plan 1st", n), results.get("plan 2nd", n)
        if first and second and first.ok and second.ok:
            speedup = first.seconds / max(second.seconds, 1e-9)
            lines.append(f"{'PASS' if speedup >= 5 else 'FAIL'} second plan >= 5x faster than the first: "
                         f"x{speedup:.1f} at {n}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000,612560", help="Samples per dataset for index and plan.")
    parser.add_argument("--precompute-sizes", default="1000,10000",
                        help="Samples per dataset for precompute, resume, verify, start-up and reads ('' for none).")
    parser.add_argument("--steps", type=int, default=40, help="Frames (= samples) per episode.")
    parser.add_argument("--nproc", type=int, default=2, help="Ranks of precompute and verify.")
    parser.add_argument("--resolution", default="pad112", help="Resolution of the precomputed frames.")
    parser.add_argument("--work", type=Path, default=Path("/tmp/janus-bench-scale"),
                        help="Datasets, caches and logs (kept: datasets are reused).")
    parser.add_argument("--results", type=Path, default=REPO / "benchmarks" / "results" / "bench_scale.json")
    parser.add_argument("--reuse-caches", action="store_true",
                        help="Keep finished caches of an earlier run: measure resume, verify, start-up and reads only.")
    parser.add_argument("--only", default="",
                        help="Measure only these costs, comma-separated (index, plan, precompute, resume, verify, "
                             "start-up, read), e.g. 'index' at 612560 alone, or 'verify' with --reuse-caches.")
    parser.add_argument("--combine", type=Path, nargs="+", default=(),
                        help="Only print and save the table of these earlier --results files together.")
    args = parser.parse_args(argv)
    if args.combine:
        return combine(args.combine, args.results)
    ONLY.update(name.strip() for name in args.only.split(",") if name.strip())
    sizes = [int(s) for s in args.sizes.split(",") if s]
    pre_sizes = [int(s) for s in args.precompute_sizes.split(",") if s]
    args.work.mkdir(parents=True, exist_ok=True)
    profile = bench_profile(args.work, args.resolution)
    load = os.getloadavg()[0]  # a shared machine's wall times stretch with its load; CPU times less
    results = Results(sizes, pre_sizes, f"{platform.node()}: {os.cpu_count()} cores, load average {load:.1f} at "
                      f"start, Python {platform.python_version()}")
    print(f"bench-scale in {args.work} ({results.machine})", flush=True)
    bench_baseline(results, args.work)
    for n in sizes:
        bench_size(results, args.work, profile, n, args.steps)
    for n in pre_sizes:
        bench_cache(results, args.work, profile, n, args.steps, args.nproc, args.reuse_caches)
    save(results, args.results)
    return 0 if all(m.ok for m in results.measures) else 1


def save(results: Results, path: Path) -> None:
    """Print the table and the targets' verdicts; write them as JSON and Markdown (``.md``)."""
    text = table(results)
    verdicts = check_targets(results)
    print("\n" + text + "\n\n" + "\n".join(verdicts))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**asdict(results), "targets": verdicts}, indent=1) + "\n")
    path.with_suffix(".md").write_text(f"# bench_scale ({results.machine})\n\n{text}\n\n"
                                       + "\n".join(f"- {v}" for v in verdicts) + "\n")


def combine(files: list[Path], out: Path) -> int:
    """One table of several runs' results (e.g. index/plan sizes and precompute sizes run apart)."""
    loaded = [json.loads(f.read_text()) for f in files]
    results = Results(sorted({n for d in loaded for n in d["sizes"]}),
                      sorted({n for d in loaded for n in d["precompute_sizes"]}), loaded[0]["machine"])
    results.measures = [Measure(**m) for d in loaded for m in d["measures"]]
    save(results, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
