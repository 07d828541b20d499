"""A local S3-compatible server for tests: moto in server mode, on loopback, one bucket per test."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

CREDENTIALS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}


@dataclass(frozen=True)
class Bucket:
    """Where a test's shared log lives, and how to reach it."""

    uri: str
    options: dict[str, str]

    def env(self) -> dict[str, str]:
        """The settings that point a server at it."""
        import json

        return {"MNEMOPLAN_STORAGE_URI": self.uri, "MNEMOPLAN_STORAGE_OPTIONS": json.dumps(self.options)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server() -> Iterator[str]:
    """moto's S3 on a free loopback port; its endpoint URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def new_bucket(endpoint: str) -> Bucket:
    """A fresh bucket on the server; the URI of a prefix in it and LanceDB's options to reach it."""
    import boto3

    name = f"mem-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **CREDENTIALS).create_bucket(Bucket=name)
    options = {"endpoint": endpoint, "region": "us-east-1", "allow_http": "true", **CREDENTIALS}
    return Bucket(f"s3://{name}/memory", options)
