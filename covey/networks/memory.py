"""Recurrent memory (LSTM or GRU) between an encoder and a trunk, stepped one observation at a time while
acting and run over fixed-length sequences while training.

States are tuples of tensors ``(1, B, hidden)``: ``(h, c)`` for an LSTM, ``(h,)`` for a GRU (the shape
SB3-contrib's RecurrentPPO uses, with one layer).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import nn

State = tuple[torch.Tensor, ...]


class Memory(nn.Module):
    """One recurrent layer. ``step`` resets the state of rows that start an episode; ``sequences`` runs
    ``(S, L)`` sequences from given initial states and leaves the state untouched on padding steps, so a
    sequence padded at the front starts its real steps from exactly its recorded memory."""

    def __init__(self, in_dim: int, hidden_size: int = 128, kind: Literal["lstm", "gru"] = "lstm") -> None:
        super().__init__()
        if kind not in ("lstm", "gru"):
            raise ValueError(f"memory kind {kind!r} is unknown; use 'lstm' or 'gru'.")
        self.kind, self.hidden_size, self.out_dim = kind, hidden_size, hidden_size
        self.cell = nn.LSTMCell(in_dim, hidden_size) if kind == "lstm" else nn.GRUCell(in_dim, hidden_size)

    @property
    def n_state(self) -> int:
        return 2 if self.kind == "lstm" else 1

    def initial_state(self, batch: int, device: torch.device | str = "cpu") -> State:
        dtype = self.cell.weight_hh.dtype  # the cell's, whatever torch's default dtype is now
        return tuple(torch.zeros(1, batch, self.hidden_size, dtype=dtype, device=device) for _ in range(self.n_state))

    def _cell(self, x: torch.Tensor, state: State) -> State:
        if self.kind == "lstm":
            h, c = self.cell(x, (state[0][0], state[1][0]))
            return h.unsqueeze(0), c.unsqueeze(0)
        return (self.cell(x, state[0][0]).unsqueeze(0),)

    def step(self, x: torch.Tensor, state: State, episode_starts: torch.Tensor) -> tuple[torch.Tensor, State]:
        """One step for a batch ``(B, in_dim)``: the memory of rows with ``episode_starts`` is reset first."""
        keep = (~episode_starts).to(x.dtype).view(1, -1, 1)  # (1, B, 1)
        state = self._cell(x, tuple(s * keep for s in state))
        return state[0][0], state  # (B, hidden)

    def encode_step(
        self, encoder: nn.Module, obs, state: State, episode_starts: torch.Tensor
    ) -> tuple[torch.Tensor, State]:
        """``encoder`` then one memory step: latent features ``(B, hidden)`` and the next memory."""
        return self.step(encoder(obs), state, episode_starts)

    def encode_sequences(
        self,
        encoder: nn.Module,
        obs: torch.Tensor,
        state: State,
        valid: torch.Tensor,
        resets: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``encoder`` on observations ``(S, L, ...)`` (or a dict of such) then the memory over the sequences:
        ``(S, L, hidden)``."""
        return self.sequences(sequence_features(encoder, obs, valid), state, valid, resets)

    def read(self, x: torch.Tensor, state: State) -> torch.Tensor:
        """The output ``(B, hidden)`` of one step from ``state`` without keeping the new state: for a head
        that reads the memory another input drives (MA-POCA's baselines read the value path's memory)."""
        return self._cell(x, state)[0][0]

    def sequences(
        self, x: torch.Tensor, state: State, valid: torch.Tensor, resets: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Run ``x`` ``(S, L, in_dim)`` from ``state`` (one per sequence); padding steps (``valid`` False)
        keep the state as it is; ``resets`` ``(S, L)`` (optional) zeroes the state before the real steps where
        a new trajectory starts inside a sequence (a reset on a padding step is ignored: padding holds another
        step's data). Returns the outputs ``(S, L, hidden)`` (meaningless on padding).

        Sequences padded only at the front and reset at most at their first real step (what training cuts)
        run as one fused recurrent op over left-aligned steps, several times faster than step by step."""
        length = valid.shape[1]
        steps = torch.arange(length, device=valid.device)
        pad = length - valid.sum(dim=1)  # (S,)
        if not bool((valid == (steps >= pad[:, None])).all()):
            return self.run(x, state, valid, resets)[1][0]
        if resets is not None:
            first = pad.clamp(max=length - 1)[:, None]  # (S, 1)
            if bool((resets & (steps > first)).any()):
                return self.run(x, state, valid, resets)[1][0]
            keep = (~resets.gather(1, first)).to(x.dtype).view(1, -1, 1)
            state = tuple(s * keep for s in state)
        # Left-align the real steps (row i moves by its padding), run them, and put the outputs back in place.
        aligned = _roll_rows(x, pad)
        weights = [self.cell.weight_ih, self.cell.weight_hh, self.cell.bias_ih, self.cell.bias_hh]
        if self.kind == "lstm":
            out = torch.lstm(aligned, state, weights, True, 1, 0.0, self.training, False, True)[0]
        else:
            out = torch.gru(aligned, state[0], weights, True, 1, 0.0, self.training, False, True)[0]
        return _roll_rows(out, -pad)

    def run(
        self, x: torch.Tensor, state: State, valid: torch.Tensor, resets: torch.Tensor | None = None
    ) -> tuple[State, State]:
        """:meth:`sequences` keeping every state: ``(started, finished)``, each a tuple of ``(S, L, hidden)``
        tensors: the state each step started from (after its reset) and the state after it (its output
        is ``finished[0]``)."""
        started, finished = [], []
        for t in range(x.shape[1]):
            if resets is not None:  # a padding step starts nothing (its data is another step's)
                keep = (~(resets[:, t] & valid[:, t])).to(x.dtype).view(1, -1, 1)
                state = tuple(s * keep for s in state)
            started.append(state)
            new = self._cell(x[:, t], state)
            keep = valid[:, t].view(1, -1, 1)
            state = tuple(torch.where(keep, n, s) for n, s in zip(new, state))
            finished.append(state)

        def stack(states: list[State]) -> State:
            return tuple(torch.stack([s[i][0] for s in states], dim=1) for i in range(self.n_state))

        return stack(started), stack(finished)


def sequence_features(encoder: nn.Module, obs, valid: torch.Tensor) -> torch.Tensor:
    """``encoder`` on observations ``(S, L, ...)`` (or a dict of such), as one batch: features ``(S, L, F)``."""
    s, length = valid.shape

    def merge(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(s * length, *x.shape[2:])

    flat = {k: merge(v) for k, v in obs.items()} if isinstance(obs, dict) else merge(obs)
    return encoder(flat).reshape(s, length, -1)


def _roll_rows(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Row ``i`` of ``x`` ``(S, L, D)`` rotated left by ``shift[i]`` steps: ``out[i, j] = x[i, (j + shift[i]) % L]``."""
    length = x.shape[1]
    index = (torch.arange(length, device=x.device)[None] + shift[:, None]) % length  # (S, L)
    return x.gather(1, index[..., None].expand(-1, -1, x.shape[2]))
