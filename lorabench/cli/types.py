"""Option types the subcommands share: argparse refuses a bad value with one line naming
the option (exit 2) before anything runs, where a bad value deep in numpy or the
generator gave a traceback or a message that named nothing."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from lorabench.config.strict import SEED_MAX


def seed(text: str) -> int:
    """A random seed, as a config's seed fields take one."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected a whole number from 0 to {SEED_MAX}, got {text!r}")
    return value


def distinct_list(kind: Callable[[str], object], what: str) -> Callable[[str], list]:
    """A comma-separated list of ``what`` (each read by ``kind``): at least one, none twice."""

    def parse(text: str) -> list:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        try:
            values = [kind(part) for part in parts]
        except (ValueError, argparse.ArgumentTypeError):
            values = []
        if not values or len(set(values)) < len(values):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, each once, got {text!r}")
        return values

    return parse


def positive_int(text: str) -> int:
    """A whole number above 0."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number above 0, got {text!r}")
    return value
