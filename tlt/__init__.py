"""tlt: Taming the Long Tail. Lossless adaptive speculative decoding for RL training of reasoning LLMs."""

__version__ = "0.1.0"
