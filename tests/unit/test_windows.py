"""The history-window rule of a training sample (reference §2): 8 history frames + the current one."""

from __future__ import annotations

from fractions import Fraction
from itertools import pairwise

import numpy as np
import pytest

from janus_core.windows import DEFAULT_HISTORY, window_frames


def test_default_history_is_eight_so_a_sample_has_nine_images() -> None:
    assert DEFAULT_HISTORY == 8
    assert all(len(window_frames(j)) == 9 for j in range(40))


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (0, (0, 0, 0, 0, 0, 0, 0, 0, 0)),
        (1, (0, 0, 0, 0, 0, 0, 0, 0, 1)),
        (3, (0, 0, 0, 0, 0, 0, 1, 2, 3)),
        (7, (0, 0, 1, 2, 3, 4, 5, 6, 7)),
        (8, (0, 1, 2, 3, 4, 5, 6, 7, 8)),
    ],
)
def test_early_steps_see_all_frames_so_far_front_padded_with_frame_zero(step: int, expected: tuple[int, ...]) -> None:
    assert window_frames(step) == expected


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (9, (0, 1, 2, 3, 4, 5, 6, 7, 9)),
        (11, (0, 1, 2, 4, 5, 6, 8, 9, 11)),
        (20, (0, 2, 5, 7, 10, 12, 15, 17, 20)),
        (100, (0, 12, 25, 37, 50, 62, 75, 87, 100)),
    ],
)
def test_later_steps_sample_the_episode_evenly_from_frame_zero_to_the_current_frame(
    step: int, expected: tuple[int, ...]
) -> None:
    assert window_frames(step) == expected


def test_windows_beyond_the_history_equal_numpy_linspace_rounded_down_for_many_sizes() -> None:
    for history in range(1, 25):
        for step in range(history + 1, 1500):
            expected = tuple(np.linspace(0, step, history + 1).astype(int).tolist())
            assert window_frames(step, history) == expected, (step, history)


def test_rounding_follows_floating_point_linspace_not_exact_fractions() -> None:
    """For history 14, step 122, point 7 is exactly 61 in rational arithmetic, but the reference's
    float linspace gives 60.999..., which it truncates to 60; the window must say 60 too."""
    exact = int(Fraction(7 * 122, 14))
    assert exact == 61
    assert window_frames(122, 14)[7] == 60 == int(np.linspace(0, 122, 15)[7])


def test_every_window_starts_at_frame_zero_ends_at_the_current_frame_and_never_goes_back() -> None:
    for history in (1, 2, 4, 8, 16):
        for step in range(300):
            window = window_frames(step, history)
            assert len(window) == history + 1
            assert window[0] == 0 and window[-1] == step
            assert all(a <= b for a, b in pairwise(window))


def test_an_episode_shorter_than_the_window_repeats_its_first_frame() -> None:
    """A 3-frame episode: every sample still has 9 images, padded with frame 0."""
    assert [window_frames(j) for j in range(3)] == [
        (0, 0, 0, 0, 0, 0, 0, 0, 0),
        (0, 0, 0, 0, 0, 0, 0, 0, 1),
        (0, 0, 0, 0, 0, 0, 0, 1, 2),
    ]


@pytest.mark.parametrize(("step", "history"), [(-1, 8), (3, 0), (3, -2), (True, 8), (2.0, 8)])
def test_invalid_steps_and_history_sizes_are_rejected(step: object, history: object) -> None:
    with pytest.raises(ValueError):
        window_frames(step, history)  # type: ignore[arg-type]
