"""Running a session's engine configurations in parallel: over the devices of this node, or a Ray cluster."""
