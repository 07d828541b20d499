"""``mnemoplan config``: the effective configuration."""

from __future__ import annotations

import argparse
import json

from mnemoplan.cli.common import add_common_arguments, settings_from_args


def run(args: argparse.Namespace) -> int:
    """Print the effective configuration as JSON."""
    settings = settings_from_args(args)
    print(json.dumps(settings.public_dict(), indent=2, default=str))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``config`` to the command's subparsers."""
    p = sub.add_parser("config", help="print the effective configuration", description=run.__doc__)
    add_common_arguments(p)
    p.set_defaults(func=run)
