"""MLP trunks and SB3-style ``net_arch`` parsing."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def mlp(in_dim: int, hidden: Sequence[int], activation: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    """``Linear -> activation`` for each width in ``hidden``; the identity when ``hidden`` is empty.

    The output width is ``hidden[-1]`` (or ``in_dim``), also stored as ``.out_dim``.
    """
    layers: list[nn.Module] = []
    width = in_dim
    for size in hidden:
        layers += [nn.Linear(width, int(size)), activation()]
        width = int(size)
    net = nn.Sequential(*layers)
    net.out_dim = width
    return net


def parse_net_arch(net_arch: Sequence[int] | dict | None, keys: tuple[str, ...], default: list[int]) -> dict:
    """SB3's ``net_arch`` forms to one hidden-size list per network.

    A list applies to every network (separate weights); ``dict(pi=[..], vf=[..])`` names each one.

    >>> parse_net_arch([32], ("pi", "vf"), [64, 64])
    {'pi': [32], 'vf': [32]}
    >>> parse_net_arch(dict(pi=[8], vf=[16]), ("pi", "vf"), [64, 64])
    {'pi': [8], 'vf': [16]}
    """
    if net_arch is None:
        return {key: list(default) for key in keys}
    if isinstance(net_arch, dict):
        unknown = set(net_arch) - set(keys)
        if unknown:
            raise ValueError(
                f"net_arch has unknown keys {sorted(unknown)}; expected a list of layer sizes or a dict "
                f"with keys {list(keys)}, e.g. dict({keys[0]}=[64, 64], {keys[1]}=[64, 64])."
            )
        return {key: _sizes(net_arch.get(key, []), key) for key in keys}
    return {key: _sizes(net_arch, "net_arch") for key in keys}


def _sizes(sizes, name: str) -> list[int]:
    if not isinstance(sizes, (list, tuple)) or not all(isinstance(s, int) and s > 0 for s in sizes):
        raise ValueError(
            f"net_arch entry {name!r} must be a list of positive layer sizes such as [64, 64], got {sizes!r}. "
            "(The old form [dict(pi=..., vf=...)] is written dict(pi=..., vf=...) now.)"
        )
    return list(sizes)
