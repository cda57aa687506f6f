"""The oldest dependency versions covey runs with: checked when the agents load, and the same as setup.cfg's."""

import configparser
import re
from pathlib import Path

import pytest

from covey.requirements import MINIMUM, check_versions, installed_versions, release


def test_this_environment_passes_the_check():
    installed = installed_versions()
    assert set(installed) == set(MINIMUM)  # every package has metadata here
    check_versions()


@pytest.mark.parametrize(
    "version, numbers",
    [("2.13.0+cpu", (2, 13, 0)), ("2.7.0a1", (2, 7, 0)), ("1.0", (1, 0)), ("2.10.0.dev20250101", (2, 10, 0))],
)
def test_release_reads_the_leading_numbers(version, numbers):
    assert release(version) == numbers


def test_too_old_packages_are_named_with_the_upgrade_command():
    installed = {"torch": "2.3.1+cpu", "stable-baselines3": "2.6.0", "gymnasium": "1.1.0", "supersuit": "3.11.0"}
    with pytest.raises(ImportError) as error:
        check_versions(installed)
    message = str(error.value)
    assert "torch 2.3.1+cpu is installed, covey needs >=2.4" in message
    assert "stable-baselines3 2.6.0 is installed, covey needs >=2.7" in message
    command = message.split("Upgrade them")[1]
    assert "gymnasium" not in command and "supersuit" not in command  # new enough: not in the command
    assert 'pip install -U "torch>=2.4" "stable-baselines3>=2.7"' in message


@pytest.mark.parametrize("name", sorted(MINIMUM))
def test_each_package_at_its_minimum_passes_and_one_release_below_fails(name):
    at_minimum = {package: ".".join(map(str, version)) for package, version in MINIMUM.items()}
    check_versions(at_minimum)
    major, minor = MINIMUM[name]
    below = dict(at_minimum, **{name: f"{major - 1}.99.0" if minor == 0 else f"{major}.{minor - 1}.5"})
    with pytest.raises(ImportError, match=re.escape(f"{name} {below[name]} is installed")):
        check_versions(below)


def test_packages_without_metadata_are_not_checked():
    check_versions({})  # a source build of torch, say: nothing to compare


def test_setup_cfg_declares_the_same_minimums():
    cfg = configparser.ConfigParser()
    cfg.read(Path(__file__).resolve().parents[1] / "setup.cfg")
    declared = {}
    for line in cfg["options"]["install_requires"].split("\n"):
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)>=([0-9.]+)", line.strip())
        if match:
            declared[match.group(1)] = tuple(int(x) for x in match.group(2).split("."))
    assert {name: declared.get(name) for name in MINIMUM} == MINIMUM


def test_export_on_an_older_torch_names_the_upgrade_and_writes_nothing(tmp_path, monkeypatch):
    import torch

    from covey import PPO
    from covey.export import _check_torch_for_export, export_onnx

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, seed=0)
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    with pytest.raises(ImportError) as error:
        export_onnx(model, tmp_path / "policy.onnx")
    assert str(error.value) == (
        "ONNX export needs torch>=2.8, whose exporter keeps every actor's batch size free; this environment has "
        'torch 2.6.0+cu124: pip install -U "torch>=2.8".'
    )
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(torch, "__version__", "2.8.0")
    _check_torch_for_export()  # new enough
