"""gnnfuse benchmark suite (see benchmarks/README.md)."""
