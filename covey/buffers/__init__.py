"""Buffers shared by every covey agent, and the returns maths they use."""

from covey.buffers.returns import gae
from covey.buffers.rollout import RolloutBatch, RolloutBuffer

__all__ = ["RolloutBatch", "RolloutBuffer", "gae"]
