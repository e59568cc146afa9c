"""lorabench: a pytest plugin and harness that benchmarks multi-LoRA inference on vLLM."""

__version__ = "0.1.0"
