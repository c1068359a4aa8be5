"""benchmarks.machine_cpu reads the machine's busy time from /proc/stat (the command run through it:
tests/e2e/test_machine_cpu_command.py)."""

from __future__ import annotations

import pytest

from benchmarks.machine_cpu import busy_cpu_seconds

# user nice system idle iowait irq softirq steal guest guest_nice, in ticks
STAT = "cpu  1000 20 300 9000 400 5 6 7 50 0\ncpu0 500 10 150 4500 200 2 3 3 25 0\nintr 1 2 3\n"


def test_busy_time_is_user_nice_system_irq_softirq_and_steal_of_all_cores() -> None:
    assert busy_cpu_seconds(STAT, ticks_per_second=100) == pytest.approx((1000 + 20 + 300 + 5 + 6 + 7) / 100)


def test_a_text_without_the_all_cores_line_is_refused() -> None:
    with pytest.raises(ValueError, match="'cpu' line"):
        busy_cpu_seconds(STAT.split("\n", 1)[1], ticks_per_second=100)
