"""What every command shares: Settings from the arguments, logging, and opening the service."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # both import pydantic, the storage libraries or torch: each command loads what it needs
    from mnemoplan.config import Settings
    from mnemoplan.service.service import MemoryService
    from mnemoplan.service.share import RemoteService


def add_common_arguments(parser: argparse.ArgumentParser, user_help: str = "") -> None:
    """The ``--data-dir`` and ``--user`` options of a command that reads the memory.

    Args:
        parser: The command's parser.
        user_help: Help of ``--user`` where it means something else than the default user.
    """
    data_help = (
        "data directory (default: $MNEMOPLAN_DATA_DIR or the platform's user data directory, "
        "e.g. ~/.local/share/mnemoplan on Linux)"
    )
    parser.add_argument("--data-dir", type=Path, help=data_help)
    user_help = user_help or "default user id (default: $MNEMOPLAN_DEFAULT_USER_ID or 'default')"
    parser.add_argument("--user", help=user_help)


def setup_logging(level: str, log_file: Path | None) -> None:
    """Send every log record to stderr or to ``log_file``; quiet the chattiest libraries.

    stdout belongs to the MCP stdio transport, so no log goes there.

    Args:
        level: The root logger's level name.
        log_file: A file to log to instead of stderr.
    """
    handler: logging.Handler = (
        logging.FileHandler(log_file) if log_file else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("httpx", "sentence_transformers", "transformers", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The environment's Settings, with ``--data-dir`` and ``--user`` applied.

    Raises:
        SystemExit: With a message, when the configuration is invalid.
    """
    from pydantic import ValidationError

    from mnemoplan.config import Settings

    overrides = {}
    if getattr(args, "data_dir", None):
        overrides["data_dir"] = args.data_dir
    if getattr(args, "user", None):
        overrides["default_user_id"] = args.user
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        sys.exit(f"mnemoplan: invalid configuration:\n{exc}")


def open_service(
    args: argparse.Namespace, *, existing: bool = False, shared: bool = False
) -> MemoryService | RemoteService:
    """The service over the data directory; with ``existing``, one that must hold a memory
    already (a search in a mistyped directory is an error, not an empty store made there).
    With ``shared``, a data directory a server holds is reached through that server
    (``service.share``) instead of failing with ``data_dir_locked``.

    Raises:
        NotFound: With ``existing``, when the data directory does not exist.
        SystemExit: With a message, when the configuration is invalid or the service cannot be
            opened.
    """
    settings = settings_from_args(args)
    if existing and not settings.data_dir.exists():
        from mnemoplan.errors import NotFound

        raise NotFound(f"There is no data directory {settings.data_dir}.",
                       hint="Check --data-dir or $MNEMOPLAN_DATA_DIR.")  # fmt: skip
    setup_logging("WARNING" if not getattr(args, "verbose", False) else "INFO", settings.log_file)
    from mnemoplan.errors import MnemoError
    from mnemoplan.service.bootstrap import build_service

    try:
        if shared:
            from mnemoplan.service.share import open_shared

            return open_shared(settings.data_dir, lambda: build_service(settings), settings.default_user_id,
                               wait_s=60.0, unserved_wait_s=5.0)  # fmt: skip
        return build_service(settings)
    except MnemoError as exc:
        sys.exit(f"mnemoplan: {exc.to_text()}")
