"""What a check returns and how results are reported: the printed table, the ``--json`` report
and the one-line failure message (shared by ``janus-cache verify`` and the trainer's gate)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from janus_cache.store.remote.errors import RemoteError

SCHEMA, INTEGRITY, COMPLETENESS, FRESHNESS, LIVE = "schema", "integrity", "completeness", "freshness", "live"
CHECK_NAMES: tuple[str, ...] = (SCHEMA, INTEGRITY, COMPLETENESS, FRESHNESS, LIVE)
"""Every check, in the order they run and are reported."""

DEFAULT_SEED = 0
REPORT_SCHEMA_VERSION = 1
"""Version of the ``--json`` report layout (docs/verify.md); bumped when a key changes meaning."""

LISTED = 8
"""Keys or files named per problem line before "and N more"."""


@dataclass
class CheckResult:
    """Outcome of one check. ``problems`` are one line each; ``data`` is the machine-readable part
    of the ``--json`` report (keys per check in docs/verify.md). A ``skipped`` check did not run
    (its ``detail`` says why) and counts neither as passed nor as failed."""

    name: str
    passed: bool
    detail: str
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0
    skipped: bool = False
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "skip" if self.skipped else ("pass" if self.passed else "fail")

    @property
    def failed(self) -> bool:
        return not self.passed and not self.skipped

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "passed": self.passed,
            "detail": self.detail,
            "problems": list(self.problems),
            "seconds": round(self.seconds, 4),
            "data": self.data,
        }


def result(name: str, problems: list[str], detail: str, seconds: float, **data: Any) -> CheckResult:
    """A check's result: passed exactly when it found no problem."""
    return CheckResult(name, not problems, detail, problems, seconds, data=data)


def skipped(name: str, reason: str) -> CheckResult:
    """A check that did not run, with the reason (e.g. "needs --data")."""
    return CheckResult(name, False, reason, skipped=True)


def crashed(name: str, err: BaseException, seconds: float = 0.0) -> CheckResult:
    """A check that could not finish: damaged data can make any reader raise, and that is a finding."""
    reason = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    return CheckResult(name, False, "could not finish", [f"cannot check: {reason}"], seconds)


F = TypeVar("F", bound=Callable[..., CheckResult])


def guarded(name: str) -> Callable[[F], F]:
    """Turn an exception raised while reading a damaged cache into a failed ``name`` result."""

    def wrap(check: F) -> F:
        @functools.wraps(check)
        def run(*args: Any, **kwargs: Any) -> CheckResult:
            started = time.perf_counter()
            try:
                return check(*args, **kwargs)
            except RemoteError:  # a bucket that cannot be read says nothing of the cache: one line
                raise
            except Exception as err:  # noqa: BLE001 - reported as this check's failure
                return crashed(name, err, time.perf_counter() - started)

        return run  # type: ignore[return-value]

    return wrap


@contextmanager
def timer() -> Iterator[Callable[[], float]]:
    """``with timer() as elapsed:`` - ``elapsed()`` is the seconds since the block began."""
    start = time.perf_counter()
    yield lambda: time.perf_counter() - start


def listed(items: Sequence[str], limit: int = LISTED) -> str:
    """The first ``limit`` items, comma separated, then "and N more"."""
    shown = ", ".join(str(i) for i in items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def short(digest: str) -> str:
    """A hex digest shortened for a message."""
    return digest[:12] + "…" if len(digest) > 12 else digest


class CacheVerificationError(RuntimeError):
    """A cache failed checks; the message is the one line ``janus-cache verify`` prints for it."""

    def __init__(self, cache: Path | str, results: Sequence[CheckResult]) -> None:
        self.results = list(results)
        super().__init__(failure_message(cache, self.results))


def failure_message(cache: Path | str, results: Sequence[CheckResult]) -> str:
    """One line naming every failed check and its first problem (empty when none failed)."""
    failed = [r for r in results if r.failed]
    if not failed:
        return ""
    def first(r: CheckResult) -> str:
        return r.problems[0] if r.problems else r.detail

    # One failed check names its problem; several, each problem after its check's name.
    reasons = first(failed[0]) if len(failed) == 1 else "; ".join(f"{r.name}: {first(r)}" for r in failed)
    return f"cache {cache} failed {', '.join(r.name for r in failed)}: {reasons}"


def report_dict(cache: Path | str, results: Sequence[CheckResult], *, data: Path | str | None, profile: str,
                live: int, checksums: str, seed: int, world_size: int, seconds: float) -> dict[str, Any]:
    """The ``--json`` report (layout in docs/verify.md; ``schema_version`` :data:`REPORT_SCHEMA_VERSION`)."""
    schema = next((r for r in results if r.name == SCHEMA), None)
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "cache": str(cache),
        "format": schema.data.get("format") if schema else None,
        "data": None if data is None else str(data),
        "profile": profile,
        "options": {"live": live, "checksums": checksums, "seed": seed},
        "world_size": world_size,
        "passed": not any(r.failed for r in results),
        "seconds": round(seconds, 4),
        "error": failure_message(cache, results) or None,
        "checks": [r.to_dict() for r in results],
    }


def format_table(results: Sequence[CheckResult], max_problems: int = 20) -> str:
    """The printed table: check, result, time, detail; then each failed check's problems."""
    width = max(len(n) for n in CHECK_NAMES)
    lines = [f"{'check':<{width}}  result  {'time':>8}  detail"]
    for r in results:
        status = r.status.upper() if r.failed else r.status  # a failure stands out
        lines.append(f"{r.name:<{width}}  {status:<6}  {r.seconds:>7.2f}s  {r.detail}")
    for r in results:
        if r.problems:
            lines.append(f"{r.name} problems:")
            lines += [f"  - {p}" for p in r.problems[:max_problems]]
            if len(r.problems) > max_problems:
                lines.append(f"  ... and {len(r.problems) - max_problems} more (see --json)")
    return "\n".join(lines)
