"""SB3's policy weights under covey's names: how an SB3 user brings a trained model over.

``covey_model.set_parameters(sb3_model.get_parameters())`` reads the ``"policy"`` state dict of SB3's PPO or
SAC (recognized by SB3's module names) through :func:`from_sb3`. The layers are the same (covey's actor and
critic trunks are SB3's ``mlp_extractor``/``latent_pi``/``qf`` layers, index for index, and covey's
``NatureCNN`` is SB3's, ``convs`` for its ``cnn``); only the names differ, and SAC's mean and log-std layers
are covey's one head layer. SB3's ``CombinedExtractor`` (``MultiInputPolicy``) is covey's ``DictEncoder``:
a NatureCNN per image key, flattening for the others, concatenated in the space's key order. Other SB3
features extractors with weights (custom classes) have no counterpart here. :func:`to_sb3` is the way back
(``model.get_sb3_parameters()``).
The optimizers' states go both ways through :func:`move_optimizer_state`: each parameter's moments go where
its weights go.

>>> sd = {"mlp_extractor.policy_net.0.weight": 1, "action_net.bias": 2, "log_std": 3}
>>> sorted(from_sb3("PPO", sd))
['actor.head.log_std', 'actor.head.proj.bias', 'actor.trunk.0.weight']
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from covey.warning import warn_user

# PPO: SB3 prefix -> covey prefix (the first that matches a key's start).
_PPO = (
    ("mlp_extractor.policy_net.", "actor.trunk."),
    ("mlp_extractor.value_net.", "critic.trunk."),
    ("action_net.", "actor.head.proj."),
    ("value_net.", "critic.value_head.proj."),
    ("log_std", "actor.head.log_std"),
)
_SAC_Q = re.compile(r"^(critic|critic_target)\.qf(\d+)\.(\d+)\.(weight|bias)$")
# A NatureCNN features extractor: PPO's pi_/vf_ ones (features_extractor is pi's under another name) and
# SAC's, one per network; in a CombinedExtractor (MultiInputPolicy), one per image key of the Dict space.
_NATURE_CNN = re.compile(
    r"^(?:(actor|critic|critic_target)\.)?(pi_|vf_)?features_extractor\.(?:extractors\.([^.]+)\.)?(cnn|linear)\.(.+)$"
)
_PPO_ENCODERS = {"pi_": "actor.encoder", "vf_": "critic.encoder"}
# sb3-contrib's RecurrentPPO: one torch LSTM layer per network, whose layer 0 is covey's LSTMCell (the same gates,
# in the same order).
_LSTM = re.compile(r"^lstm_(actor|critic)\.(weight_ih|weight_hh|bias_ih|bias_hh)_l(\d+)$")


def translate_groups(
    agent: str,
    params: dict,
    optimizers: tuple[str, ...],
    flat_image: tuple[int, ...] | None,
    move_state: Callable[[str, dict], dict],
) -> dict:
    """Parameter groups as SB3's ``get_parameters()`` returns them, for covey's ``set_parameters``: the
    ``"policy"`` state dict renamed (:func:`from_sb3`), and the states of SB3's ``optimizers`` moved to covey's
    parameter order by ``move_state(name, state)`` (the model's; a state it cannot move, raising ValueError, is
    left out with a warning, and that optimizer keeps its own). Groups with covey's names pass through
    unchanged. ``flat_image``: the shape of the channel-last image observations the model's networks read
    flattened (an ``MlpPolicy``), whose first layers take SB3's columns reordered (:func:`image_inputs_to_covey`)."""
    policy = params.get("policy")
    if not isinstance(policy, dict) or not is_sb3(agent, policy):
        return params
    moved, dropped = {}, []
    for name in optimizers:
        if name not in params:
            continue
        try:
            moved[name] = move_state(name, params[name])
        except ValueError as err:
            dropped.append(f"{name}: {err}")
    if dropped:
        warn_user(
            f"Copied SB3's {agent} weights; these optimizer states are not copied ({'; '.join(dropped)}): those "
            "optimizers start from their current state."
        )
    rest = {name: group for name, group in params.items() if name not in optimizers and name != "policy"}
    policy = from_sb3(agent, policy)
    policy = image_inputs_to_covey(policy, flat_image) if flat_image is not None else policy
    return {**rest, **moved, "policy": policy}


_FIRST_LAYERS = re.compile(
    r"^(actor|critic(?:_target)?(?:\.qs\.\d+)?)\.(?:trunk\.0|head\.proj|value_head\.proj)\.weight$"
)


def image_inputs_to_covey(state_dict: dict, shape: tuple[int, ...]) -> dict:
    """SB3 moves the channels of a channel-last image first (its ``VecTransposeImage``) before an ``MlpPolicy``
    flattens it; covey flattens the image as it comes. Each network's first layer (its first trunk layer, or its
    head where it has none; with gSDE and no trunk, the exploration's log-std rows too) takes SB3's columns of
    the image reordered from (C, H, W) to (H, W, C); the columns after them (SAC's critics' actions) stay."""
    h, w, c = shape
    n = h * w * c
    order = torch.arange(n).reshape(c, h, w).permute(1, 2, 0).reshape(-1)  # covey's column i is SB3's order[i]
    out = dict(state_dict)
    networks = {match.group(1) for match in map(_FIRST_LAYERS.match, state_dict) if match}
    for network in networks:
        first = f"{network}.trunk.0.weight"
        if first not in state_dict:
            first = next(k for k in (f"{network}.head.proj.weight", f"{network}.value_head.proj.weight") if k in out)
            log_std = out.get(f"{network}.head.log_std")
            if log_std is not None and log_std.dim() == 2 and log_std.shape[0] == n:  # gSDE on the features
                out[f"{network}.head.log_std"] = log_std[order]
        weight = out[first]
        out[first] = torch.cat([weight[:, :n][:, order], weight[:, n:]], dim=1)
    return out


def is_sb3(agent: str, state_dict: dict) -> bool:
    """Whether ``state_dict`` is an SB3 ``policy.state_dict()`` of ``agent`` ("PPO" or "SAC")."""
    marks = ("mlp_extractor.", "action_net.") if agent == "PPO" else ("actor.latent_pi.", "actor.mu.", "actor.log_std")
    return any(key.startswith(marks) for key in state_dict)


def from_sb3(agent: str, state_dict: dict) -> dict:
    """An SB3 PPO or SAC ``MlpPolicy``, ``CnnPolicy`` or ``MultiInputPolicy`` state dict (or an sb3-contrib
    RecurrentPPO one of these with its LSTMs) renamed to covey's ``model.policy`` names."""
    nets = {key: value for key, value in state_dict.items() if "features_extractor." not in key}
    out = _ppo(nets) if agent == "PPO" else _sac(nets)
    for key, value in state_dict.items():
        if "features_extractor." not in key:
            continue
        match = _NATURE_CNN.match(key)
        if match is None:
            raise ValueError(
                f"SB3 parameter {key!r} belongs to a features extractor that covey has no counterpart for: "
                "weights copy from SB3's MlpPolicy, CnnPolicy and MultiInputPolicy (NatureCNN and "
                "CombinedExtractor) only."
            )
        network, branch, key_name, part, rest = match.groups()
        if agent == "PPO" and branch is None:
            continue  # PPO's features_extractor is its pi_features_extractor
        encoder = _PPO_ENCODERS[branch] if agent == "PPO" else f"{network}.encoder"
        if key_name is not None:  # covey's DictEncoder holds one encoder per key, in the space's key order too
            encoder = f"{encoder}.encoders.{key_name}"
        out[f"{encoder}.{'convs' if part == 'cnn' else part}.{rest}"] = value
    return out


def _ppo(state_dict: dict) -> dict:
    out = {}
    for key, value in state_dict.items():
        lstm = _LSTM.match(key)
        if lstm is not None:
            network, kind, layer = lstm.groups()
            if layer != "0":
                raise ValueError(
                    f"sb3-contrib RecurrentPPO parameter {key!r} is of a second LSTM layer (n_lstm_layers > 1): "
                    "covey's memory has one layer."
                )
            out[f"{network}.memory.cell.{kind}"] = value
            continue
        for sb3, ours in _PPO:
            if key.startswith(sb3):
                out[ours + key[len(sb3) :]] = value
                break
        else:
            if key.startswith("critic."):  # RecurrentPPO's enable_critic_lstm=False: a linear layer for a memory
                raise ValueError(
                    f"sb3-contrib RecurrentPPO parameter {key!r} is the critic's linear layer of "
                    "enable_critic_lstm=False: covey's recurrent critic has a memory of its own."
                )
            raise ValueError(f"SB3 PPO parameter {key!r} has no counterpart in covey's networks.")
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
        elif key == "actor.log_std":  # use_sde: the exploration's log-std matrix, and the mean layer (before
            out["actor.head.log_std"] = value  # SB3's Hardtanh when clip_mean > 0)
        elif key.startswith("actor.mu.") and "actor.log_std" in state_dict:
            out["actor.head.proj." + key.removeprefix("actor.mu.").removeprefix("0.")] = value
        elif key.startswith(("actor.mu.", "actor.log_std.")):
            continue  # below: one layer of means then log-stds
        else:
            raise ValueError(f"SB3 SAC parameter {key!r} has no counterpart in covey's networks.")
    for kind in ("weight", "bias"):
        halves = [f"actor.mu.{kind}", f"actor.log_std.{kind}"]
        given = [key for key in halves if key in state_dict]
        if "actor.log_std" in state_dict or not given:
            continue
        if len(given) == 1:
            raise ValueError(
                f"SB3's {given[0]} without {(set(halves) - set(given)).pop()}: covey's SAC actor holds SB3's mean "
                "and log-std layers as one head layer, loaded whole. Give both, or load through "
                "model.set_parameters(..., exact_match=False), which keeps the model's values for the other."
            )
        out[f"actor.head.proj.{kind}"] = torch.cat([state_dict[key] for key in halves])
    return out


def to_sb3(agent: str, state_dict: dict, template: dict, flat_image: tuple[int, ...] | None = None) -> dict:
    """covey's ``model.policy`` state dict under SB3's names: the state dict that :func:`from_sb3` (with
    :func:`image_inputs_to_covey` for ``flat_image``) turns into ``state_dict``. ``template`` is the state dict of
    an SB3 policy of the same layout; its names, shapes and dtypes are kept.

    The inverse is read off the forward map rather than written beside it: every element of the template gets its
    index, the indices go through :func:`from_sb3`, and each of covey's elements lands where its index says.

    >>> sd = {"actor.trunk.0.weight": torch.ones(2, 3), "actor.head.proj.weight": torch.zeros(1, 2)}
    >>> like = {"mlp_extractor.policy_net.0.weight": torch.empty(2, 3), "action_net.weight": torch.empty(1, 2)}
    >>> {key: value.sum().item() for key, value in to_sb3("PPO", sd, like).items()}
    {'mlp_extractor.policy_net.0.weight': 6.0, 'action_net.weight': 0.0}
    """
    index, ours, start = _positions(agent, template, flat_image)
    unknown = sorted(set(state_dict) - set(ours))
    if unknown:
        raise ValueError(
            f"covey's parameters {unknown} have no counterpart in SB3's {agent} policy of these settings: the model "
            "uses a network SB3's policy does not have."
        )
    values = torch.zeros(start, dtype=torch.float64)
    filled = torch.zeros(start, dtype=torch.bool)
    for key, where in ours.items():
        if key not in state_dict:
            continue  # an SB3 copy of a shared network that covey keeps once (checked below)
        value = state_dict[key]
        if value.shape != where.shape:
            raise ValueError(
                f"covey's {key} has shape {tuple(value.shape)} where SB3's {agent} policy of these settings has "
                f"{tuple(where.shape)}: the model's networks are not SB3's."
            )
        positions = where.reshape(-1)
        values[positions] = value.detach().to("cpu", torch.float64).reshape(-1)
        filled[positions] = True
    out = {}
    for key, value in template.items():
        positions = index[key].reshape(-1)
        if not filled[positions].all():
            shared = "pi_" + key if key.startswith("features_extractor.") else None  # PPO: SB3 names it twice
            if shared is None or shared not in template:
                raise ValueError(f"SB3's {key} has no counterpart in covey's parameters: the networks differ.")
            positions = index[shared].reshape(-1)
        out[key] = values[positions].to(value.dtype).reshape(value.shape)
    return out


def _positions(agent: str, template: dict, flat_image: tuple[int, ...] | None) -> tuple[dict, dict, int]:
    """Every element of the SB3 state dict ``template`` numbered: ``(SB3 name -> its elements' numbers, covey
    name -> the numbers of the SB3 elements it is made of, how many)``, the second read off :func:`from_sb3` (and
    :func:`image_inputs_to_covey` for ``flat_image``)."""
    index, start = {}, 0
    for key, value in template.items():
        index[key] = torch.arange(start, start + value.numel(), dtype=torch.float64).reshape(value.shape)
        start += value.numel()
    ours = from_sb3(agent, index)
    if flat_image is not None:
        ours = image_inputs_to_covey(ours, flat_image)
    return {k: v.long() for k, v in index.items()}, {k: v.long() for k, v in ours.items()}, start


# Settings that tell optimizer classes apart (Adam's betas, SGD's and RMSprop's momentum, ...): a state moves only
# between optimizers that have the same ones.
_OPTIMIZER_SETTINGS = frozenset(
    {"betas", "momentum", "dampening", "nesterov", "alpha", "centered", "rho", "lr_decay", "etas", "step_sizes"}
)


def move_optimizer_state(
    agent: str,
    state: dict,
    template: dict,
    flat_image: tuple[int, ...] | None,
    names: tuple[list[list[str]], list[list[str]]],
    param_groups: list[dict],
    to_sb3: bool,
) -> dict:
    """An optimizer's state dict moved between SB3's parameter order and covey's: per-parameter tensors (Adam's
    moments) go element by element where the weights go (:func:`from_sb3`, or its inverse with ``to_sb3``), and
    scalars (Adam's step count) stay as they are.

    ``template`` is the state dict of SB3's policy of the model's settings; ``names`` holds, for SB3's optimizer
    and then covey's, every parameter's names in its policy's state dict, in the optimizer's order (a parameter
    may have several). ``param_groups`` (one group) are the receiving optimizer's own settings. Raises
    ValueError where the two optimizers do not step the same parameters, or are of different kinds."""
    index, ours, total = _positions(agent, template, flat_image)
    sb3_names, covey_names = names
    (source_names, source_at), (target_names, target_at) = (
        ((covey_names, ours), (sb3_names, index)) if to_sb3 else ((sb3_names, index), (covey_names, ours))
    )
    groups = state.get("param_groups", [])
    if len(groups) != 1 or len(param_groups) != 1 or len(groups[0]["params"]) != len(source_names):
        raise ValueError(
            f"the optimizer state has {[len(g['params']) for g in groups]} parameters per group where "
            f"{len(source_names)} in one group were expected"
        )
    if _OPTIMIZER_SETTINGS & set(groups[0]) != _OPTIMIZER_SETTINGS & set(param_groups[0]):
        raise ValueError("the optimizers are of different kinds")
    entries = {slot: state["state"][i] for slot, i in enumerate(groups[0]["params"]) if i in state["state"]}
    moved: dict[int, dict] = {}
    if entries:
        first = next(iter(entries.values()))
        moved = {j: {} for j in range(len(target_names))}
        for key, sample in first.items():
            if not torch.is_tensor(sample) or sample.dim() == 0:  # the step count: one for every parameter
                for entry in moved.values():
                    entry[key] = sample.clone() if torch.is_tensor(sample) else sample
                continue
            values = torch.zeros(total, dtype=torch.float64)
            filled = torch.zeros(total, dtype=torch.bool)
            for slot, entry in entries.items():
                for name in source_names[slot]:
                    if name not in source_at:
                        continue  # an SB3 name of a shared network that covey keeps once, or none
                    where = source_at[name].reshape(-1)
                    if entry[key].numel() != where.numel():
                        raise ValueError(f"{key} of {name} has {entry[key].numel()} elements, not {where.numel()}")
                    values[where] = entry[key].detach().to("cpu", torch.float64).reshape(-1)
                    filled[where] = True
            for j, aliases in enumerate(target_names):
                where = next((target_at[a] for a in aliases if a in target_at and filled[target_at[a]].all()), None)
                if where is None:
                    raise ValueError(f"the other optimizer does not step {aliases[0]}")
                moved[j][key] = values[where.reshape(-1)].to(sample.dtype).reshape(where.shape)
    return {"state": moved, "param_groups": [{**param_groups[0], "params": list(range(len(target_names)))}]}
