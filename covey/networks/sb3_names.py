"""SB3's ``MlpPolicy`` weights under covey's names: how an SB3 user brings a trained model over.

``covey_model.set_parameters(sb3_model.get_parameters())`` reads the ``"policy"`` state dict of SB3's PPO or
SAC (recognized by SB3's module names) through :func:`from_sb3`. The layers are the same (covey's actor and
critic trunks are SB3's ``mlp_extractor``/``latent_pi``/``qf`` layers, index for index); only the names
differ, and SAC's mean and log-std layers are covey's one head layer. Networks with SB3 features extractors
that have weights (CNNs, custom extractors) have no counterpart here.

>>> sd = {"mlp_extractor.policy_net.0.weight": 1, "action_net.bias": 2, "log_std": 3}
>>> sorted(from_sb3("PPO", sd))
['actor.head.log_std', 'actor.head.proj.bias', 'actor.trunk.0.weight']
"""

from __future__ import annotations

import re
import warnings

import torch

# PPO: SB3 prefix -> covey prefix (the first that matches a key's start).
_PPO = (
    ("mlp_extractor.policy_net.", "actor.trunk."),
    ("mlp_extractor.value_net.", "critic.trunk."),
    ("action_net.", "actor.head.proj."),
    ("value_net.", "critic.value_head.proj."),
    ("log_std", "actor.head.log_std"),
)
_SAC_Q = re.compile(r"^(critic|critic_target)\.qf(\d+)\.(\d+)\.(weight|bias)$")


def translate_groups(agent: str, params: dict, optimizers: tuple[str, ...]) -> dict:
    """Parameter groups as SB3's ``get_parameters()`` returns them, for covey's ``set_parameters``: the
    ``"policy"`` state dict renamed (:func:`from_sb3`), SB3's ``optimizers`` left out with a warning (their
    states follow SB3's parameter order). Groups with covey's names pass through unchanged."""
    policy = params.get("policy")
    if not isinstance(policy, dict) or not is_sb3(agent, policy):
        return params
    dropped = [name for name in optimizers if name in params]
    if dropped:
        warnings.warn(
            f"Copied SB3's {agent} weights; its optimizer states ({', '.join(dropped)}) follow SB3's parameter "
            "order and are not copied: covey's optimizers start from their current state.",
            UserWarning,
            stacklevel=4,
        )
    rest = {name: group for name, group in params.items() if name not in optimizers and name != "policy"}
    return {**rest, "policy": from_sb3(agent, policy)}


def is_sb3(agent: str, state_dict: dict) -> bool:
    """Whether ``state_dict`` is an SB3 ``policy.state_dict()`` of ``agent`` ("PPO" or "SAC")."""
    marks = ("mlp_extractor.", "action_net.") if agent == "PPO" else ("actor.latent_pi.", "actor.mu.")
    return any(key.startswith(marks) for key in state_dict)


def from_sb3(agent: str, state_dict: dict) -> dict:
    """An SB3 PPO or SAC ``MlpPolicy`` state dict renamed to covey's ``model.policy`` names."""
    out = _ppo(state_dict) if agent == "PPO" else _sac(state_dict)
    extractors = sorted(key for key in state_dict if "features_extractor." in key)
    if extractors:
        raise ValueError(
            f"The SB3 parameters include a features extractor with weights ({extractors[0]}, ...): only SB3 "
            "MlpPolicy weights (trunks and heads on flattened observations) can be copied into covey."
        )
    return out


def _ppo(state_dict: dict) -> dict:
    out = {}
    for key, value in state_dict.items():
        for sb3, ours in _PPO:
            if key.startswith(sb3):
                out[ours + key[len(sb3) :]] = value
                break
        else:
            if "features_extractor." not in key:
                raise ValueError(f"SB3 PPO parameter {key!r} has no counterpart in covey's MlpPolicy.")
    return out


def _sac(state_dict: dict) -> dict:
    out, last = {}, {}
    for key in state_dict:  # the last layer of every Q network is covey's head
        match = _SAC_Q.match(key)
        if match:
            net = match.group(1), match.group(2)
            last[net] = max(last.get(net, 0), int(match.group(3)))
    for key, value in state_dict.items():
        match = _SAC_Q.match(key)
        if match:
            critic, q, layer, kind = match.groups()
            where = "head.proj" if int(layer) == last[critic, q] else f"trunk.{layer}"
            out[f"{critic}.qs.{q}.{where}.{kind}"] = value
        elif key.startswith("actor.latent_pi."):
            out["actor.trunk." + key[len("actor.latent_pi.") :]] = value
        elif key.startswith(("actor.mu.", "actor.log_std.")):
            continue  # below: one layer of means then log-stds
        elif "features_extractor." not in key:
            raise ValueError(f"SB3 SAC parameter {key!r} has no counterpart in covey's MlpPolicy.")
    for kind in ("weight", "bias"):
        if f"actor.mu.{kind}" in state_dict:
            mean, log_std = state_dict[f"actor.mu.{kind}"], state_dict[f"actor.log_std.{kind}"]
            out[f"actor.head.proj.{kind}"] = torch.cat([mean, log_std])
    return out
