"""Buffers shared by every covey agent, and the returns maths they use."""

from covey.buffers.replay import ReplayBatch, ReplayBuffer
from covey.buffers.returns import gae
from covey.buffers.rollout import RolloutBatch, RolloutBuffer

__all__ = ["ReplayBatch", "ReplayBuffer", "RolloutBatch", "RolloutBuffer", "gae"]
