"""``python -m benchmarks.machine_cpu COMMAND``: the command's wall time and the machine's busy CPU
time over it, which counts a process the command left to init (as the test suite's fork servers
are left): the CPU that ``time``, a process's rusage, misses."""

from __future__ import annotations

import re
import resource
import subprocess
import sys

from helpers.profiles import REPO_ROOT

BURN_S = 0.6
# The command forks a process that forks again and exits: the grandchild, left to init, burns
# BURN_S of CPU and then writes a line; the command waits for that line, not for the process.
ORPHAN_BURNS = f"""
import os, sys, time
read, write = os.pipe()
if os.fork() == 0:
    if os.fork() == 0:
        end = time.process_time() + {BURN_S}
        while time.process_time() < end:
            pass
        os.write(write, b"done\\n")
    os._exit(0)
os.close(write)
os.wait()
assert os.read(read, 5) == b"done\\n"
"""


def machine_cpu(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "benchmarks.machine_cpu", *command], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_cpu_of_a_process_left_to_init_is_counted_where_rusage_misses_it() -> None:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = machine_cpu(sys.executable, "-c", ORPHAN_BURNS)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(r"wall ([0-9.]+) s, machine busy ([0-9.]+) CPU-s \(([0-9.]+) CPU-min, [0-9.]+ of \d+ cores "
                         r"on average\), exit code 0", result.stderr.strip())
    assert match, result.stderr
    assert float(match.group(2)) >= 0.8 * BURN_S  # the orphan's CPU is in the machine's busy time
    rusage = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    assert rusage < float(match.group(2)) - 0.5 * BURN_S  # and not in what `time` would report


def test_the_commands_exit_code_is_passed_on() -> None:
    result = machine_cpu(sys.executable, "-c", "import sys; sys.exit(3)")
    assert result.returncode == 3 and result.stderr.strip().endswith("exit code 3"), result.stderr
