"""What is measured around a target: latency from timestamps, trace replay at scheduled
arrivals, correctness digests, the capacity search, where the wall time went."""
