"""The ``covey`` command line (placeholder until the subcommands land)."""


def main(argv=None) -> int:
    raise SystemExit("covey: the command line is being built")
