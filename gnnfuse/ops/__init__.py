"""torch.library ops of the ``gnnfuse`` namespace, one module per op (each described once with _opdef.OpDef)."""
