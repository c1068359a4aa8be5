"""What a command costs the whole machine: its wall time and the busy CPU time of every core over it.

``time`` (a process's rusage) counts the processes its command waits for and misses those left to
init: the test suite's 2-rank runs are forked by multiprocessing's fork server, which no test
process waits for, so ``time make test`` leaves their CPU out. The machine's busy time from
``/proc/stat`` counts everything; it is the command's own only on an otherwise idle machine.

    python -m benchmarks.machine_cpu make test
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")
# Fields of /proc/stat's "cpu" line that count busy time: user, nice, system, irq, softirq, steal
# (guest time is already inside user and nice; idle and iowait are not busy).
BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


def busy_cpu_seconds(stat_text: str, ticks_per_second: int) -> float:
    """The busy CPU-seconds of all cores since boot, from the text of ``/proc/stat``."""
    fields = stat_text.splitlines()[0].split()
    if fields[0] != "cpu":
        raise ValueError(f"the first line of {PROC_STAT} is not the all-cores 'cpu' line: {fields[:1]}")
    ticks = [int(value) for value in fields[1:]]
    return sum(ticks[i] for i in BUSY_FIELDS) / ticks_per_second


@dataclass(frozen=True)
class MachineCost:
    wall_s: float
    busy_cpu_s: float
    cores: int
    returncode: int

    def line(self) -> str:
        return (f"wall {self.wall_s:.1f} s, machine busy {self.busy_cpu_s:.1f} CPU-s "
                f"({self.busy_cpu_s / 60:.1f} CPU-min, {self.busy_cpu_s / self.wall_s:.2f} of {self.cores} cores "
                f"on average), exit code {self.returncode}")


def measure(command: list[str]) -> MachineCost:
    """Run ``command`` (inheriting this process's streams) and measure it."""
    ticks = os.sysconf("SC_CLK_TCK")
    busy_before, start = busy_cpu_seconds(PROC_STAT.read_text(), ticks), time.monotonic()
    returncode = subprocess.run(command, check=False).returncode
    wall = time.monotonic() - start
    busy = busy_cpu_seconds(PROC_STAT.read_text(), ticks) - busy_before
    return MachineCost(wall, busy, os.cpu_count() or 1, returncode)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip(), file=sys.stderr)
        return 0 if argv else 2
    if not PROC_STAT.is_file():
        print(f"error: {PROC_STAT} is not there: the machine's busy time is read on Linux only", file=sys.stderr)
        return 2
    cost = measure(argv)
    print(cost.line(), file=sys.stderr)
    return cost.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
