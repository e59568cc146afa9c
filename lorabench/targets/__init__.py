"""Where requests go: the in-process vLLM engine, a server over HTTP, and the stand-in engine
whose costs a test sets; with the engine's own clock and timeline."""
