"""``gnnfuse.explain`` (which kernel would run, with what guarantees) and ``show_config``."""
from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass, replace

import torch

from . import _build
from .config import current as environment_settings
from .constants import HALF_DTYPES
from .locality import locality_stats
from .ops.gather_scatter import check_call


@dataclass(frozen=True)
class KernelPlan:
    backend: str
    kernel: str
    reduce: str
    value_dtype: torch.dtype
    accumulate_dtype: torch.dtype
    index_dtype: torch.dtype
    deterministic: bool
    threads: int
    notes: str

    def __str__(self) -> str:
        lines = [f"{k}: {v}" for k, v in self.__dict__.items()]
        return "\n".join(lines)


# What runs, named by importable objects (the C++ kernels are functions of the module that
# gnnfuse._build.load_extension("graph") returns), not by source paths, which an install lacks.
_KERNELS = {
    "cpu": (
        "gnnfuse._build.load_extension('graph').gather_scatter_forward: CSR row-parallel (edge-balanced "
        "partitions, no atomics); .gather_scatter_backward: row-parallel over the cached transpose"
    ),
    "reference": "gnnfuse.reference.gather_scatter: index_select + scatter_reduce (materialises E x F)",
    "triton": "gnnfuse.triton.gather_scatter.forward / .backward (plan chosen per graph by "
              "gnnfuse.triton.gather_scatter_dispatch.choose)",
}


def explain(x: torch.Tensor, edge_index_or_csr, reduce: str = "sum", *, edge_weight: torch.Tensor | None = None,
            num_nodes: int | None = None, backend: str = "auto") -> KernelPlan:
    """Says which kernel ``fused_gather_scatter(x, edge_index_or_csr, reduce, ...)`` would run,
    without running it. It makes the op's own checks (so it rejects what the op rejects) and, for a
    raw edge_index, builds and caches its CSR as the op would: ``index_dtype`` is the one that runs.

    Example::

        print(gnnfuse.explain(x, edge_index, "max"))   # backend, kernel, deterministic?, dtypes, notes
    """
    csr, chosen = check_call(x, edge_index_or_csr, reduce, edge_weight, num_nodes, backend)
    half = x.dtype in HALF_DTYPES
    notes = []
    if reduce in ("max", "min"):
        notes.append("gradient goes to one winning edge per (row, feature): the lowest CSR position among ties")
    if reduce == "mean":
        notes.append("divides by in-degree; empty rows give 0")
    if chosen == "reference":
        notes.append("deterministic on CPU; on CUDA scatter_reduce uses atomics")
    kernel, deterministic = _KERNELS[chosen], chosen == "cpu" or (chosen == "reference" and x.device.type == "cpu")
    if chosen == "triton":
        from .triton.gather_scatter_dispatch import choose

        num_dst, num_edges = csr.num_dst, csr.num_edges
        feat = 1
        for d in x.shape[1:]:
            feat *= d
        plan = choose(reduce, num_dst, num_edges, feat, x.dtype)
        if plan.kernel == "hybrid":  # its row order follows the graph's measured id locality
            from .triton.schedule import choose_window

            window, why = choose_window(csr.rowptr, csr.col, x.shape[0], feat, x.element_size(), x.device)
            plan = replace(plan, window=window, reason=f"{plan.reason}; {why}")
        kernel, deterministic = plan.describe(), plan.deterministic
        if reduce in ("max", "min") and not torch.are_deterministic_algorithms_enabled():
            deterministic = deterministic and not x.requires_grad
            notes.append("backward: x's gradient adds each winner's gradient to its source row with atomics "
                         "(summation order varies; torch.use_deterministic_algorithms(True) walks the transpose "
                         "instead) + per-edge dot for edge_weight")
        else:
            notes.append("backward: atomic-free, over the cached transpose + per-edge dot for edge_weight")
    notes.append(f"locality: {locality_stats(csr)}")
    return KernelPlan(
        backend=chosen,
        kernel=kernel,
        reduce=reduce,
        value_dtype=x.dtype,
        accumulate_dtype=torch.float32 if half else x.dtype,
        index_dtype=csr.index_dtype,
        deterministic=deterministic,
        threads=torch.get_num_threads() if x.device.type == "cpu" else 0,
        notes="; ".join(notes),
    )


def _first_line(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "not found"


def config() -> dict[str, str]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    cxx = _build.compiler()
    info = {
        "gnnfuse": __import__("gnnfuse").__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "compiler": f"{cxx}: {_first_line([cxx, '--version'])}" if cxx else "not found (CPU kernels cannot build)",
        "cpu threads (torch / OpenMP)": str(torch.get_num_threads()),
        "build cache": str(_build.cache_root()),
        "cpu kernels built": ", ".join(
            f"{name}={(_build.build_dir(name) / 'BUILD_OK').exists()}" for name in _build.EXTENSIONS
        ),
        "cuda device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
    }
    info.update(environment_settings())  # every environment variable gnnfuse reads (gnnfuse.config)
    return info


def show_config() -> None:
    """Prints versions, compiler, threads, build cache, devices and every environment variable
    gnnfuse reads (its value, or "unset"; what each does: ``gnnfuse.config.SETTINGS``)."""
    info = config()
    width = max(map(len, info))
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")
