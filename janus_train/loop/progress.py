"""Where a run is: what every checkpoint stores of the loop, and what a resume restores."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from janus_train.checkpoint.elastic import DataLayout


@dataclass
class Progress:
    """The loop's state: optimizer steps done, the epoch and the data position (samples of the
    epoch's global sequence consumed by all ranks together), and the samples and steps left out so
    far (``train.damaged_samples: skip``, ``train.nonfinite: skip``)."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    nonfinite_skips: int = 0
    damaged_skips: int = 0

    def client_state(self, layout: DataLayout, rng: dict[str, Any], lr_schedule: dict[str, int]) -> dict[str, Any]:
        """The trainer's part of a checkpoint (DeepSpeed's ``client_state``), with the run's LR plan
        (:class:`~janus_train.loop.parts.LRSchedule`)."""
        return {"step": self.step, "epoch": self.epoch, "position": self.position,
                "data_layout": layout.to_dict(), "rng": rng, "lr_schedule": lr_schedule,
                "nonfinite_skips": self.nonfinite_skips, "damaged_skips": self.damaged_skips}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Progress:
        """The progress a checkpoint's client state saved (older checkpoints count no skips, and
        counted one rank's position: :meth:`DataLayout.global_position`)."""
        return cls(step=state["step"], epoch=state["epoch"], position=DataLayout.global_position(state),
                   nonfinite_skips=state.get("nonfinite_skips", 0), damaged_skips=state.get("damaged_skips", 0))
