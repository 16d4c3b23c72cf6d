"""Prompts prefilled on the decode device in the last few steps, for ``prefill.decode_tail_s``.

On a device that runs a prompt's prefill between two decode steps (the CPU serving
loop's disaggregated prefill, whose time is cut from the decode clock), the steps
that follow pay for what the prefill left behind in the caches: the first one most,
the next few less. A profile states that as ``prefill.decode_tail_s[k]``, seconds per
prompt for the k-th decode step after it; an engine counts the prompts prefilled
before each of its last steps here and charges a step their dot product.
"""

from __future__ import annotations

import numpy as np

from simulator.costs import HardwareProfile


class RecentPrefills:
    """``counts[k]``: prompts prefilled before the k-th step back (0: the step being planned)."""

    def __init__(self, profile: HardwareProfile) -> None:
        self.profile = profile
        self.counts = np.zeros(len(profile.decode_tail_s))
        self.since_last = 0  # prompts prefilled since the last planned step

    def add(self, num_prompts: int) -> None:
        if self.counts.size:  # without the field nothing is charged, and nothing kept
            self.since_last += num_prompts

    def step_s(self) -> float:
        """Seconds the step being planned pays for the prompts prefilled before it and its predecessors (moves
        the window one step on); 0 without ``prefill.decode_tail_s``."""
        if not self.counts.size:
            return 0.0
        self.counts[1:] = self.counts[:-1]
        self.counts[0], self.since_last = self.since_last, 0
        return self.profile.decode_tail_at_s(self.counts)

    @property
    def pending(self) -> bool:
        """Whether a later step would still pay for a prompt prefilled before it."""
        return bool(self.since_last or self.counts[:-1].any())
