"""torch.library ops of the ``gnnfuse`` namespace, one module per op (see _library.py)."""
