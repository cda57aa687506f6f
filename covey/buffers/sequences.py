"""Cutting a rollout into fixed-length training sequences for recurrent policies."""

from __future__ import annotations

import numpy as np


def cut_sequences(episode_starts: np.ndarray, sequence_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Split every env's trajectory segments of a ``(T, N)`` rollout into sequences of ``sequence_length``.

    A segment starts at ``t = 0`` and wherever ``episode_starts[t, n]`` is True; no sequence crosses a
    segment boundary. A segment whose length is not a multiple of ``sequence_length`` gets its *first*
    sequence padded at the front. Returns ``index`` ``(n_sequences, L)``: positions in the time-major
    flattening ``t * N + n``, ``-1`` on padding; and ``valid`` ``(n_sequences, L)``.

    >>> idx, valid = cut_sequences(np.array([[1], [0], [0]], bool), 2)
    >>> idx.tolist(), valid.tolist()
    ([[-1, 0], [1, 2]], [[False, True], [True, True]])
    """
    if sequence_length < 1:
        raise ValueError(f"sequence_length={sequence_length} must be >= 1.")
    n_steps, n_envs = episode_starts.shape
    rows: list[list[int]] = []
    for n in range(n_envs):
        starts = [0] + [t for t in range(1, n_steps) if episode_starts[t, n]] + [n_steps]
        for begin, end in zip(starts[:-1], starts[1:]):
            length = end - begin
            n_seq = -(-length // sequence_length)  # ceil
            flat = [-1] * (n_seq * sequence_length - length) + [t * n_envs + n for t in range(begin, end)]
            rows.extend(flat[i : i + sequence_length] for i in range(0, len(flat), sequence_length))
    index = np.array(rows, dtype=np.int64).reshape(-1, sequence_length)
    return index, index >= 0
