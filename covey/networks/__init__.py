"""Networks shared by every covey agent: encoders, MLP trunks, action heads, actor and critic.

The package's attributes named after its modules are those modules (``covey.networks.mlp`` is the module, whose
switches such as ``PAIR_TRUNKS`` the README names, not its function ``mlp``)."""

from covey.networks.actor_critic import Actor, Critic, PolicyConfig, build_actor_critic
from covey.networks.encoders import DictEncoder, FlattenEncoder, NatureCNN, OneHotEncoder, make_encoder
from covey.networks.mlp import parse_net_arch

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
    "parse_net_arch",
]
