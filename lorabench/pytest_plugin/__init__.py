"""The pytest face: options, hooks, fixtures, the session's state and its terminal lines."""
