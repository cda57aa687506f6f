"""Networks shared by every covey agent: encoders, MLP trunks, action heads, actor and critic."""

from covey.networks.actor_critic import Actor, Critic, PolicyConfig, build_actor_critic
from covey.networks.encoders import DictEncoder, FlattenEncoder, NatureCNN, OneHotEncoder, make_encoder
from covey.networks.mlp import mlp, parse_net_arch

__all__ = [
    "Actor",
    "Critic",
    "DictEncoder",
    "FlattenEncoder",
    "NatureCNN",
    "OneHotEncoder",
    "PolicyConfig",
    "build_actor_critic",
    "make_encoder",
    "mlp",
    "parse_net_arch",
]
