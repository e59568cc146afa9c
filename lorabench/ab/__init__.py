"""``lorabench ab``: two environments measured in alternation on one node.

``plan`` says what runs when and where, ``runner`` runs it; the comparison pair by pair
is ``lorabench.compare.paired``. A side's pytest session learns its pair from the
environment, so its rows say which pair they belong to.
"""

from __future__ import annotations

import os

PAIR_ENV = "LORABENCH_AB_PAIR"


def pair_from_env() -> int | None:
    """The A/B pair index ``lorabench ab`` gave this session, or None outside A/B mode."""
    text = os.environ.get(PAIR_ENV, "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{PAIR_ENV}={text!r}: expected a pair index such as 3 (set by lorabench ab; unset it)")
    return int(text)
