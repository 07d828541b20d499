"""Placeholder until the harness lands."""
import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dataset")


def run_from_args(args: argparse.Namespace) -> int:
    raise SystemExit("not yet")
