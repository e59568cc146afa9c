"""``lorabench ab``: two environments measured in alternation on one node.

``plan`` says what runs when and where, ``runner`` runs it; the comparison pair by pair
is ``lorabench.analysis.compare.paired``. A side's pytest session learns its pair from the
environment (``lorabench.results.provenance``), so its rows say which pair they belong to.
"""
