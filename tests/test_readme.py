"""The README's complete examples (the Python blocks that start with their imports) use only names they define."""

from __future__ import annotations

import builtins
import re
import symtable
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def complete(block: str) -> bool:
    """A whole script, as opposed to a few lines that continue an earlier example."""
    return block.lstrip().startswith(("import ", "from "))


def undefined_names(code: str) -> set[str]:
    """Names the code reads at module level, or as globals inside its functions and lambdas, but never binds."""
    top = symtable.symtable(code, "<README>", "exec")
    bound = {symbol.get_name() for symbol in top.get_symbols() if symbol.is_assigned() or symbol.is_imported()}
    read: set[str] = set()
    tables = [top]
    while tables:
        table = tables.pop()
        tables += table.get_children()
        for symbol in table.get_symbols():
            if symbol.is_referenced() and (table is top or symbol.is_global()):
                read.add(symbol.get_name())
    return read - bound - set(dir(builtins))


def test_undefined_names_finds_an_unbound_name() -> None:
    assert undefined_names("import os\nx = os.sep\nprint(y, (lambda: z)(), x)") == {"y", "z"}
    assert undefined_names("f = lambda a: a + 1\nprint(f(2), [i for i in range(3)])") == set()


BLOCKS = [block for block in python_blocks() if complete(block)]


def test_the_readme_has_complete_examples() -> None:
    assert len(BLOCKS) >= 3  # PPO, SAC, POCA


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_example_defines_what_it_uses(block: str) -> None:
    assert undefined_names(block) == set(), block


def test_the_module_switches_the_readme_names_are_the_modules_own() -> None:
    """``covey.networks.mlp.PAIR_TRUNKS = False`` as written must set the module's switch: the package re-exported
    the function ``mlp`` under the module's name, so the assignment set an attribute of the function, silently."""
    import importlib

    switches = re.findall(r"`(covey(?:\.[a-z_]+)+)\.([A-Z][A-Z_]+)(?: = \w+)?`", README.read_text())
    assert len(switches) >= 5
    for path, name in switches:
        module = importlib.import_module(path)
        reached = importlib.import_module("covey")
        for part in path.split(".")[1:]:
            reached = getattr(reached, part)  # as the README's dotted assignment resolves it
        assert reached is module, f"covey...{path} is {reached!r}, not the module"
        assert hasattr(module, name), f"{path} has no switch {name}"


def test_covey_submodules_are_reached_after_a_plain_import_as_the_readme_writes_them(tmp_path) -> None:
    """The README's ``covey.agents.load("runs/cartpole/model.zip")`` after ``import covey``: covey's modules load
    on first use (as its agents do, so the import stays cheap), where this was an AttributeError."""
    import subprocess
    import sys

    script = (
        "import sys, covey\n"
        "assert 'torch' not in sys.modules\n"
        "assert callable(covey.agents.load) and callable(covey.export.export_onnx)\n"
        "assert not hasattr(covey, '__main__')\n"  # which would run the command line
        "try:\n"
        "    covey.no_such_module\n"
        "except AttributeError as err:\n"
        "    print(err)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "module 'covey' has no attribute 'no_such_module'" in result.stdout
    assert "covey.agents.load(" in README.read_text()


def test_the_docstring_examples_run_as_written_without_warnings() -> None:
    """The ``>>>`` examples in covey's docstrings give the output they show, and warn of nothing: an example
    that a user copies should not teach a setting that covey warns against."""
    import doctest
    import importlib
    import pkgutil
    import warnings

    import covey

    failures: list[str] = []
    examples = 0
    for info in pkgutil.walk_packages(covey.__path__, "covey."):
        if info.name == "covey.__main__":  # importing it runs the command line
            continue
        for test in doctest.DocTestFinder().find(importlib.import_module(info.name)):
            examples += len(test.examples)
            runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                runner.run(test, out=failures.append)
    assert examples >= 40  # the docstrings' examples were found
    assert not failures, "".join(failures)
