"""The oldest versions of its main dependencies that covey runs with, checked when the agents load.

pip enforces them when it installs covey; an environment changed afterwards (a downgrade, ``--no-deps``, conda)
can still hold older ones, and those fail deep inside covey with an error that does not say why. So
``covey.agents`` checks the installed versions first (from the packages' metadata, without importing them) and
names what to upgrade.
"""

from __future__ import annotations

import re
from importlib import metadata

MINIMUM = {"torch": (2, 4), "stable-baselines3": (2, 7), "gymnasium": (1, 1), "supersuit": (3, 10)}
"""The oldest version of each package that covey runs with (setup.cfg's ``install_requires`` says the same)."""
WHY = {
    "torch": "Adam's fused CPU step, which covey's optimizers take, arrived in torch 2.4",
    "stable-baselines3": "covey accepts SB3's NStepReplayBuffer and LinearSchedule, which arrived in 2.7",
    "gymnasium": "covey reads a Gymnasium vector env's autoreset mode, which arrived in 1.1",
    "supersuit": "SuperSuit 3.9's reward_lambda_v0 gave a parallel env zero rewards under PettingZoo 1.27",
}


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version string: ``"2.13.0+cpu"`` -> ``(2, 13, 0)``, ``"2.7.0a1"`` -> ``(2, 7, 0)``."""
    numbers = []
    for part in version.split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.end() < len(part):  # "0a1", "0+cpu": the release ends here
            break
    return tuple(numbers)


def installed_versions() -> dict[str, str]:
    """The installed version of each package of :data:`MINIMUM` that has metadata (others are left out)."""
    versions = {}
    for name in MINIMUM:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return versions


def check_versions(installed: dict[str, str] | None = None) -> None:
    """Raise ImportError naming every package of :data:`MINIMUM` older than covey needs, and the pip command that
    upgrades them. ``installed``: ``{package: version}`` (default: this environment's)."""
    installed = installed_versions() if installed is None else installed
    old = {name: version for name, version in installed.items() if name in MINIMUM and release(version) < MINIMUM[name]}
    if not old:
        return
    needed = {name: ".".join(map(str, MINIMUM[name])) for name in old}
    found = "; ".join(
        f"{name} {version} is installed, covey needs >={needed[name]} ({WHY[name]})" for name, version in old.items()
    )
    command = "pip install -U " + " ".join(f'"{name}>={needed[name]}"' for name in old)
    hint = (
        " (for the CPU-only torch wheel, add --index-url https://download.pytorch.org/whl/cpu)"
        if "torch" in old
        else ""
    )
    raise ImportError(f"covey cannot run with the installed packages: {found}. Upgrade them: {command}{hint}.")
