"""Triton GPU kernels (one module per op). Imported lazily by the ops, so gnnfuse works
without Triton on CPU. Under ``TRITON_INTERPRET=1`` the same kernels run on CPU tensors."""
