"""Entity attention for groups of agents, and MA-POCA's centralized critic (Cohen et al. 2021,
https://arxiv.org/abs/2111.05992).

Absent agents (dead, not yet spawned, padding) are an explicit boolean mask: they are left out of
attention and pooling, and whatever their slots hold is replaced by zeros before encoding, so garbage or
NaN there cannot leak into the outputs.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F
from gymnasium import spaces
from torch import nn
from torch.autograd.function import once_differentiable

from covey.networks.encoders import Encoder
from covey.networks.linear import Linear, autocast_on, linear
from covey.networks.memory import Memory, State
from covey.networks.mlp import mlp


class ResidualSelfAttention(nn.Module):
    """Multi-head self-attention over entities with a residual connection and layer norm.

    ``x`` is ``(B, n_entities, h)``; ``present`` ``(B, n_entities)`` marks real entities. Absent ones are
    never attended to; their own output rows are meaningless (pool with :func:`masked_mean`).
    """

    def __init__(self, width: int, n_heads: int = 4) -> None:
        super().__init__()
        if width % n_heads:
            raise ValueError(f"attention width {width} must be divisible by n_heads={n_heads}.")
        self.n_heads = n_heads
        self.attention = nn.MultiheadAttention(width, n_heads, batch_first=True)  # holds the weights
        self.norm = nn.LayerNorm(width)

    def forward(self, x: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return self.attend(x, self.project(x), present)  # (B, n_entities, h)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Queries, keys and values of entities ``(..., h)`` -> ``(..., 3h)``: a linear map of each entity
        alone, so callers may project entities once and reuse them in several sets."""
        return linear(x, self.attention.in_proj_weight, self.attention.in_proj_bias)

    def _out_proj(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.attention.out_proj.weight, self.attention.out_proj.bias)

    def attend(self, x: torch.Tensor, qkv: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """The block's output for entities ``x`` ``(B, n, h)`` whose projections ``qkv`` ``(B, n, 3h)`` are
        given (``project(x)``)."""
        b, n, width = x.shape
        q, k, v = qkv.view(b, n, 3, self.n_heads, width // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, heads, n, d)
        # A row with no entity at all would attend to nothing (NaN); let it attend to its zeros instead.
        attend = present | ~present.any(dim=1, keepdim=True)  # (B, n): True = attended to
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attend[:, None, None, :])
        out = self._out_proj(out.transpose(1, 2).reshape(b, n, width))
        return self.norm(x + out)

    def attend_sets(
        self, x: torch.Tensor, qkv: torch.Tensor, queries: torch.Tensor, members: torch.Tensor, present: torch.Tensor
    ) -> torch.Tensor:
        """The block's outputs in several sets drawn from the same entities, without copying them per set.

        ``x`` ``(B, m, h)`` are the entities and ``qkv`` their projections (``project(x)``), ``present``
        ``(B, m)``. Output row r is for entity ``queries[r]`` inside the set ``members[r]`` (``(R, m)``
        booleans): it attends to the present members of that set (to all of them when none is present).
        Returns ``(B, R, h)``; each row equals :meth:`attend` on its set alone. Scores are computed once per
        pair of entities and shared by every set holding both, which for small sets is far cheaper than one
        attention call per set."""
        attend = members & present[:, None, :]  # (B, R, m)
        attend = attend | (members & ~attend.any(dim=-1, keepdim=True))
        if SET_ATTENTION_BY_HAND and not autocast_on() and qkv.dtype in (torch.float32, torch.float64):
            out = _SetAttention.apply(qkv, queries, attend, self.n_heads)
        else:
            out = set_attention(qkv, queries, attend, self.n_heads)
        return self.norm(x.index_select(1, queries) + self._out_proj(out))


SET_ATTENTION_BY_HAND = True
"""Whether :meth:`ResidualSelfAttention.attend_sets` differentiates its attention by hand (:class:`_SetAttention`)
instead of through autograd (:func:`set_attention`): the same values (up to a floor on the exponent that float32
cannot see), with fewer copies between layouts."""


def set_attention(qkv: torch.Tensor, queries: torch.Tensor, attend: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Multi-head attention of query rows over entities, before the output projection: ``qkv`` ``(B, m, 3h)``
    are the entities' queries, keys and values, row r is for entity ``queries[r]`` and attends to the
    entities where ``attend[:, r]`` ``(B, R, m)`` is True (at least one per row). Returns ``(B, R, h)``."""
    b, m, width = qkv.shape[0], qkv.shape[1], qkv.shape[2] // 3
    q, k, v = qkv.view(b, m, 3, n_heads, width // n_heads).permute(2, 0, 3, 1, 4)  # (B, heads, m, d)
    scores = (q * q.shape[-1] ** -0.5) @ k.transpose(-1, -2)  # (B, heads, m, m): every entity pair once
    scores = scores[:, :, queries].masked_fill(~attend[:, None], float("-inf"))  # (B, heads, R, m)
    # Softmax by hand: torch.softmax over a last axis this short is several times slower on CPU (the shift by
    # the row's maximum is only for range, so it takes no gradient).
    weights = (scores - scores.detach().amax(dim=-1, keepdim=True)).exp()
    out = (weights / weights.sum(dim=-1, keepdim=True)) @ v  # (B, heads, R, d)
    return out.transpose(1, 2).reshape(b, len(queries), width)


_EXP_FLOOR = -30.0
"""The lowest shifted attention score :class:`_SetAttention` exponentiates (exp(-30) = 9.4e-14)."""


class _SetAttention(torch.autograd.Function):
    """:func:`set_attention` with its gradient written out. Autograd's version moves queries, keys, values
    and their gradients between the projection's layout ``(B, m, 3, heads, d)`` and the heads' ``(B, heads, m,
    d)`` one tensor at a time; here each direction is one copy. The softmax runs in place, over attention
    weights laid out keys first, ``(m, B, heads, R)``: its sums and maxima over the m keys then run along
    B * heads * R contiguous numbers instead of over rows of m (several times faster on CPU for m = 6)."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, queries: torch.Tensor, attend: torch.Tensor, n_heads: int) -> torch.Tensor:
        b, m = qkv.shape[:2]
        d = qkv.shape[2] // (3 * n_heads)
        r, bh = len(queries), b * n_heads
        heads = qkv.view(b, m, 3, n_heads, d).permute(2, 0, 3, 1, 4).contiguous()  # (3, B, heads, m, d)
        q, k, v = (heads[i].view(bh, m, d) for i in range(3))
        scores = torch.bmm(k, q.transpose(1, 2)).view(b, n_heads, m, m)  # (key, query): every entity pair once
        weights = scores.permute(2, 0, 1, 3).index_select(3, queries)  # (m, B, heads, R), a new tensor
        attended = attend.permute(2, 0, 1).unsqueeze(2)  # (m, B, 1, R)
        weights.mul_(d**-0.5).add_(torch.where(attended, 0.0, float("-inf")).to(weights.dtype))
        # exp of the shifted scores, floored at exp(-30): exp of -inf, or of a number so low that the result is
        # zero or denormal, takes a slow path on some CPUs (over ten times slower on an Intel Xeon); the masked
        # entries are then zeroed exactly. The floor moves a weight by at most 1e-13 against the row's largest, 1.
        weights.sub_(weights.amax(dim=0)).clamp_(min=_EXP_FLOOR).exp_().mul_(attended)
        weights.div_(weights.sum(dim=0))
        out = torch.bmm(weights.permute(1, 2, 3, 0).reshape(bh, r, m), v)  # (B * heads, R, d)
        ctx.save_for_backward(heads, weights, queries)
        return out.view(b, n_heads, r, d).transpose(1, 2).reshape(b, r, n_heads * d)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        heads, weights, queries = ctx.saved_tensors  # weights: (m, B, heads, R)
        _, b, n_heads, m, d = heads.shape
        r, bh = len(queries), b * n_heads
        q, k, v = (heads[i].view(bh, m, d) for i in range(3))
        grad_out = grad.reshape(b, r, n_heads, d).transpose(1, 2).reshape(bh, r, d)
        w = weights.permute(1, 2, 3, 0).reshape(bh, r, m)  # a view
        grad_heads = torch.empty_like(heads).view(3, bh, m, d)
        torch.bmm(w.transpose(1, 2), grad_out, out=grad_heads[2])  # values
        grad_w = torch.bmm(v, grad_out.transpose(1, 2)).view(b, n_heads, m, r).permute(2, 0, 1, 3).contiguous()
        # softmax: dL/ds = w * (dL/dw - sum_j(w * dL/dw)); masked entries have w = 0 and get none
        grad_s = grad_w.sub_((grad_w * weights).sum(dim=0)).mul_(weights).mul_(d**-0.5)  # (m, B, heads, R)
        grad_scores = torch.zeros(b, n_heads, m, m, dtype=grad_s.dtype, device=grad_s.device)  # (key, query)
        grad_scores = grad_scores.index_add_(3, queries, grad_s.permute(1, 2, 0, 3)).view(bh, m, m)
        torch.bmm(grad_scores.transpose(1, 2), k, out=grad_heads[0])  # queries
        torch.bmm(grad_scores, q, out=grad_heads[1])  # keys
        grad_qkv = grad_heads.view(3, b, n_heads, m, d).permute(1, 3, 0, 2, 4)  # (B, m, 3, heads, d)
        return grad_qkv.reshape(b, m, 3 * n_heads * d), None, None, None


def masked_mean(x: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Mean over the present entities: ``(B, n_entities, h)`` -> ``(B, h)`` (zeros when none is present)."""
    weights = present.unsqueeze(-1).to(x.dtype)  # (B, n_entities, 1)
    return (x * weights).sum(1) / weights.sum(1).clamp_min(1.0)


class EntityEncoder(Encoder):
    """Encodes an observation that is a list of entities, a Box ``(n_entities, n_features)`` such as KAZ's
    vector state: each entity is embedded, entities attend to each other, and the present ones are
    pooled. All-zero rows are padding (absent entities).

    >>> enc = EntityEncoder(spaces.Box(-1, 1, (27, 5)))
    >>> enc(torch.zeros(2, 27, 5)).shape
    torch.Size([2, 64])
    """

    def __init__(self, space: spaces.Box, width: int = 64, n_heads: int = 4) -> None:
        super().__init__()
        if not isinstance(space, spaces.Box) or len(space.shape) != 2:
            raise ValueError(
                f"entity_encoder needs observations that are a 2-D Box (n_entities, n_features), got {space}: remove "
                "entity_encoder=True from policy_kwargs, or give the env such an observation space."
            )
        self.embedding = nn.Sequential(Linear(space.shape[1], width), nn.ReLU())
        self.attention = ResidualSelfAttention(width, n_heads)
        self.out_dim = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()  # (B, n_entities, n_features)
        present = x.abs().sum(-1) > 0  # (B, n_entities): zero rows are padding
        return masked_mean(self.attention(self.embedding(x), present), present)  # (B, width)


def action_features(actions: torch.Tensor, space: spaces.Space) -> torch.Tensor:
    """Actions as the rollout buffer stores them (:func:`covey.buffers.rollout.action_storage`: a Discrete action
    a number, any other a flat row) to network inputs ``(..., action_features_dim)``: one-hot for discrete,
    floats otherwise."""
    if isinstance(space, spaces.Discrete):
        return F.one_hot((actions.long() - int(space.start)).clamp(0, int(space.n) - 1), int(space.n)).float()
    if isinstance(space, spaces.MultiDiscrete):
        nvec = [int(n) for n in space.nvec.reshape(-1)]
        idx = actions.long() - torch.as_tensor(space.start.reshape(-1))
        return torch.cat([F.one_hot(idx[..., i].clamp(0, n - 1), n).float() for i, n in enumerate(nvec)], dim=-1)
    return actions.float()


def action_features_dim(space: spaces.Space) -> int:
    if isinstance(space, spaces.Discrete):
        return int(space.n)
    if isinstance(space, spaces.MultiDiscrete):
        return int(space.nvec.sum())
    return int(np.prod(space.shape))


@lru_cache(maxsize=16)
def _poca_sets(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The value's set and every agent's baseline set over the entities ``[own_0..own_n-1, mates_0..mates_n-1]``
    (observation embeddings, then observation-action embeddings): ``(queries (R,), members (R, 2n))`` with
    ``R = n + n * n``. Rows ``0..n-1``: own_j in the value's set {own_*}; row ``n + i * n + j``: slot j in agent
    i's set {own_i} + {mates_k, k != i}, i.e. own_i for j == i and mates_j otherwise.

    Built once per group size and device and shared: callers never modify them in place. They are built
    outside inference mode even when first asked for inside it, so that training can save them for backward."""
    with torch.inference_mode(False):
        return _build_poca_sets(n, device)


def _build_poca_sets(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    slots = torch.arange(n, device=device)
    in_set = torch.where(slots[:, None] == slots[None, :], slots[None, :], n + slots[None, :])  # (i, j) -> entity
    members = torch.zeros(n + n * n, 2 * n, dtype=torch.bool, device=device)
    members[:n, :n] = True
    members[n:] = F.one_hot(in_set, 2 * n).sum(1).bool().repeat_interleave(n, dim=0)
    return torch.cat([slots, in_set.reshape(-1)]), members


class POCACritic(nn.Module):
    """One attention network answering two questions about a group of agent slots.

    - ``value(obs, present)``: V of the group from every present agent's observation, ``(B,)``;
    - ``baseline(obs, actions, present)``: for every agent i, the value given its own observation and
      its groupmates' observations *and actions*, ``(B, n_slots)``: a counterfactual baseline that
      marginalizes agent i's own action.

    Observations are ``(B, n_slots, *obs_shape)``, actions ``(B, n_slots, *action_shape)``, ``present``
    ``(B, n_slots)`` booleans. ``raw_value``/``raw_baseline`` give the value head's raw outputs.

    With ``memory`` the critic is recurrent after pooling: the value path advances the group's memory
    (one per env copy) and the baselines read the same memory without advancing it
    (:meth:`raw_sequences`; step by step through :meth:`pooled_value`, :meth:`read` and :meth:`head`).
    """

    def __init__(
        self,
        encoder: nn.Module,
        action_space: spaces.Space,
        value_head_fn,
        width: int = 128,
        hidden: list[int] | None = None,
        n_heads: int = 4,
        activation: type[nn.Module] = nn.ReLU,
        memory: Memory | None = None,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.action_space = action_space
        self.obs_embedding = nn.Sequential(Linear(encoder.out_dim, width), activation())
        self.obs_action_embedding = nn.Sequential(
            Linear(encoder.out_dim + action_features_dim(action_space), width), activation()
        )
        self.attention = ResidualSelfAttention(width, n_heads)
        self.memory = memory
        trunk_in = width if memory is None else memory.out_dim
        self.trunk = mlp(trunk_in, [width, width] if hidden is None else hidden, activation)
        self.value_head = value_head_fn(self.trunk.out_dim)

    def _encode(self, obs: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        b, n = present.shape
        shape = (b, n) + (1,) * (obs.dim() - 2)
        obs = torch.where(present.reshape(shape), obs, torch.zeros((), dtype=obs.dtype))  # absent: zeros, not NaN
        return self.encoder(obs.reshape(b * n, *obs.shape[2:])).reshape(b, n, -1)  # (B, n_slots, enc)

    def _pool(self, entities: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return masked_mean(self.attention(entities, present), present)

    def raw(self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed-forward critics: raw values ``(B[, K])`` and raw baselines ``(B, n_slots[, K])`` in one pass (the
        trunk and head run once, on the value's and every baseline's pooled features together)."""
        self._no_memory("raw")
        pooled = self.pooled_together(obs, actions, present)  # (B, 1 + n_slots, width)
        # 2-D rows: a 3-D input would make each layer's output a view, which an in-place activation copies
        raw = self.head(pooled.reshape(-1, pooled.shape[-1]))
        raw = raw.view(*pooled.shape[:2], *raw.shape[1:])  # (B, 1 + n_slots[, K])
        return raw[:, 0], raw[:, 1:]

    def head(self, features: torch.Tensor) -> torch.Tensor:
        """Pooled features (or memory outputs) to the value head's raw output."""
        return self.value_head(self.trunk(features))

    def pooled_value(self, obs: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """The group's pooled features for the value, ``(B, width)``."""
        own = self.obs_embedding(self._encode(obs, present))
        return self._pool(own, present)

    def pooled(
        self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled features for the value ``(B, width)`` and for every agent's baseline ``(B, n_slots, width)``
        (views of :meth:`pooled_together`)."""
        pooled = self.pooled_together(obs, actions, present)
        return pooled[:, 0], pooled[:, 1:]

    def pooled_together(self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """Pooled features for the value and then every agent's baseline, ``(B, 1 + n_slots, width)``.

        Agent i's baseline attends over its own observation embedding and its groupmates' observation-action
        embeddings. Attention projects each entity alone, so the projections of both embeddings are computed
        once per slot, and the scores once per pair of entities, shared by the value's set and every agent's
        set (:meth:`ResidualSelfAttention.attend_sets`). Every set's row j is slot j's entity, so all sets pool
        with the same weights, present_j / (number present): one weighted sum over the attention's output."""
        b, n = present.shape
        entities = torch.cat(self._embed(obs, actions, present), dim=1)  # (B, 2n, h): own, then mates
        queries, members = _poca_sets(n, present.device)
        out = self.attention.attend_sets(
            entities, self.attention.project(entities), queries, members, present.repeat(1, 2)
        )  # (B, (1 + n) * n, h): the value's set, then agent 0's, ...
        weights = present.to(out.dtype)
        weights = weights / weights.sum(1, keepdim=True).clamp_min(1.0)  # (B, n)
        return (out.view(b, 1 + n, n, -1) * weights[:, None, :, None]).sum(2)

    def _embed(
        self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every slot's observation embedding and observation-action embedding, each ``(B, n_slots, width)``."""
        encoded = self._encode(obs, present)  # (B, n, enc)
        acts = action_features(actions, self.action_space)  # (B, n, A)
        acts = torch.where(present.unsqueeze(-1), acts, torch.zeros(()))
        return self.obs_embedding(encoded), self.obs_action_embedding(torch.cat([encoded, acts], dim=-1))

    def pooled_per_set(
        self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`pooled` by its definition: the attention block run on a copy of each set, the value's set and
        then every agent's. The same outputs, slower; kept as the reference that :meth:`pooled` is tested and
        benchmarked against."""
        n = present.shape[1]
        own, mates = self._embed(obs, actions, present)
        value = self._pool(own, present)
        sets = [torch.stack([own[:, j] if j == i else mates[:, j] for j in range(n)], dim=1) for i in range(n)]
        return value, torch.stack([self._pool(entities, present) for entities in sets], dim=1)

    def pooled_baseline(self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        """Every agent's pooled features for its baseline, ``(B, n_slots, width)``."""
        return self.pooled(obs, actions, present)[1]

    def read(self, features: torch.Tensor, state: State) -> torch.Tensor:
        """Recurrent critics: the raw output for pooled ``features`` ``(B, width)`` or ``(B, n, width)``
        from the memory ``state`` (each ``(1, B, hidden)``), without advancing the memory."""
        if features.dim() == 3:  # every agent's baseline reads its group's memory
            n = features.shape[1]
            state = tuple(s.repeat_interleave(n, dim=1) for s in state)
            out = self.memory.read(features.reshape(-1, features.shape[-1]), state)
            raw = self.head(out)
            return raw.reshape(features.shape[0], n, *raw.shape[1:])
        return self.head(self.memory.read(features, state))

    def raw_sequences(
        self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor, state: State, valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Recurrent critics on sequences of group-steps ``(S, L, n_slots, ...)`` from ``state`` (one memory
        per sequence): raw values ``(S, L[, K])`` (the value path advances the memory) and raw baselines
        ``(S, L, n_slots[, K])`` (each reads the memory its step started from)."""
        s, length, n = present.shape

        def flat(x: torch.Tensor) -> torch.Tensor:
            return x.reshape(s * length, *x.shape[2:])

        # Absent slots and padding steps: an all-absent step pools to zeros and is masked out of the losses.
        pooled_value, pooled_baseline = self.pooled(flat(obs), flat(actions), flat(present))
        pooled_value = pooled_value.reshape(s, length, -1)
        started, finished = self.memory.run(pooled_value, state, valid)
        raw_value = self.head(finished[0])
        raw_baseline = self.read(pooled_baseline, tuple(flat(x)[None] for x in started))
        return raw_value, raw_baseline.reshape(s, length, *raw_baseline.shape[1:])

    def raw_value(self, obs: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        self._no_memory("raw_value")
        return self.head(self.pooled_value(obs, present))

    def raw_baseline(self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        self._no_memory("raw_baseline")
        return self.head(self.pooled_baseline(obs, actions, present))  # (B, n_slots[, K])

    def value(self, obs: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return self.value_head.value(self.raw_value(obs, present))

    def baseline(self, obs: torch.Tensor, actions: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
        return self.value_head.value(self.raw_baseline(obs, actions, present))

    def _no_memory(self, name: str) -> None:
        if self.memory is not None:
            raise RuntimeError(f"POCACritic.{name} has no memory state; a recurrent critic runs raw_sequences.")
