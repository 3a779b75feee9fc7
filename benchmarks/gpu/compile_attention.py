"""Compiles every attention Triton kernel the launchers make (GAT, GATv2/dot, forward and
backward, with and without self loops, dropout and edge features, 8 x 8 and 4 x 64, float32 and
bfloat16) for an H100 (sm_90), without a GPU: the launches run on CPU
tensors and are recorded instead of launched, then compiled with triton.compile, with the
specialisation Triton's launcher gives them on the GPU (16-byte-aligned tensors and ints divisible by
16 marked so: without it the compiler cannot prove alignment and emits no 16-byte loads) and their
register cap (``maxnreg``). Prints each kernel's cp.async count (pipelined loads), its ld.local count
(spills in the PTX) and, where Triton's cuobjdump is at hand, its registers, its spill loads and
stores in the SASS (``LDL``/``STL``) and how many of those sit in the loop with the 16-byte loads:
what the interpreter-mode tests cannot see (they never compile). To check the Triton of the GPU
machines from elsewhere, put that Triton first on the path:

    PYTHONPATH=. python benchmarks/gpu/compile_attention.py [NAME_PART]
    PYTHONPATH=/path/to/triton-3.6/site:. python benchmarks/gpu/compile_attention.py forward
"""
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.compiler import ASTSource, compile as tcompile
from triton.backends.compiler import GPUTarget
from gnnfuse.triton import _launch
from gnnfuse.csr import CSR
from gnnfuse.graphs import random_graph

from gnnfuse.triton import attention as A  # noqa: E402
from gnnfuse.triton import pair_attention as P  # noqa: E402

rec = []
ONLY = sys.argv[1] if len(sys.argv) > 1 else ""  # only kernels whose name contains this
_launch.FastKernel._launch = lambda self, grid, args, meta: rec.append((self.kernel, args, meta))

TY = {torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16",
      torch.int64: "i64", torch.int32: "i32", torch.bool: "i1"}


def run_all(n, e, H, F, dtype):
    ei = random_graph(n, n, e, seed=1, power_law=True)
    csr = CSR.from_edge_index(ei, n)
    t = csr.transpose_parts()
    x = torch.randn(n, H, F, dtype=dtype)
    a = torch.randn(n, H, dtype=dtype)
    ae = torch.randn(e, H, dtype=dtype)
    for edge, loop, sl, p in ((None, None, True, 0.0), (ae, a, True, 0.5), (ae, None, False, 0.0)):
        out, m, z = A.forward(x, a, a, edge, loop, csr.rowptr, csr.col, *t, sl, 0.2, p, 3)
        needs = [True] * 5
        A.backward(torch.randn_like(out), out, m, z, x, a, a, edge, loop, csr.rowptr, csr.col, *t, sl, 0.2, p, 3, needs)
    att = torch.randn(H, F, dtype=dtype)
    ev = torch.randn(e + n, H, F, dtype=dtype)
    for gatv2, edge, sl, p in ((True, None, True, 0.3), (True, ev, True, 0.3), (False, None, False, 0.3),
                               (False, ev, False, 0.3), (True, None, True, 0.0), (False, None, False, 0.0)):
        v = x if gatv2 else torch.randn_like(x)
        perm = csr.perm if edge is not None else None
        out, m, z = P.forward(x, x, v, att if gatv2 else None, edge, csr.rowptr, csr.col, perm, *t, sl, gatv2, 0.2,
                              0.35, p, 7)
        for o in (out, out.new_empty(0)):  # D from out, and from the saved statistics (row-term kernel)
            P.backward(torch.randn_like(out), o, m, z, x, x, v, att if gatv2 else None, edge, csr.rowptr, csr.col,
                       perm, *t, sl, gatv2, 0.2, 0.35, p, 7, [True] * 5)


def sig_of(kernel, args, meta):
    sig, consts = {}, {}
    runtime = [p for p in kernel.params if not p.is_constexpr]
    for p, a in zip(runtime, args):
        if isinstance(a, torch.Tensor):
            sig[p.name] = "*" + TY[a.dtype]
        elif isinstance(a, bool):
            sig[p.name] = "i1"
        elif isinstance(a, int):
            sig[p.name] = "i32" if -2**31 <= a < 2**31 else "i64"
        else:
            sig[p.name] = "fp32"
    for p in kernel.params:
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            consts[p.name] = meta[p.name]
    return sig, consts


def attrs_of(kernel, args):
    """The divisibility marks Triton's launcher gives these arguments (16-byte-aligned tensors, ints
    divisible by 16 not in do_not_specialize)."""
    runtime = [p for p in kernel.params if not p.is_constexpr]
    marks = {}
    for p, a in zip(runtime, args):
        unspecialized = p.num in kernel.do_not_specialize or p.name in kernel.do_not_specialize
        if isinstance(a, torch.Tensor) or (type(a) is int and a % 16 == 0 and not unspecialized):
            marks[(p.num,)] = [["tt.divisibility", 16]]
    return marks


CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def sass_report(cubin: bytes) -> str:
    """Registers, spill ops, and spill ops in the loop that holds the 16-byte gathers (a backward branch's
    range with LDG.E.128), from the SASS; '' without Triton's cuobjdump."""
    if not os.path.exists(CUOBJDUMP):
        return ""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([CUOBJDUMP, "-sass", f.name], capture_output=True, text=True).stdout
    ins = [(int(a, 16), op.strip()) for a, op in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    at = {a: i for i, (a, _) in enumerate(ins)}
    spill = [("LDL" in op or "STL" in op) for _, op in ins]
    in_loop = 0
    for i, (a, op) in enumerate(ins):
        target = re.search(r"BRA (0x[0-9a-f]+)", op)
        if target and int(target.group(1), 16) < a and int(target.group(1), 16) in at:
            j = at[int(target.group(1), 16)]
            if any("LDG.E.128" in o for _, o in ins[j:i + 1]):
                in_loop = max(in_loop, sum(spill[j:i + 1]))
    regs = re.findall(r"REG:(\d+)", usage)
    return f" regs {regs[0] if regs else '?'} spill ops {sum(spill)} (in the gather loop {in_loop})"


def main():
    print(f"Triton {triton.__version__}, target sm_90")
    seen, failures = set(), 0
    for n, e, H, F, dtype in ((3000, 18000, 8, 8, torch.float32), (500, 20000, 8, 8, torch.float32),
                              (3000, 18000, 4, 64, torch.float32), (500, 20000, 4, 64, torch.bfloat16)):
        rec.clear()
        run_all(n, e, H, F, dtype)
        for kernel, args, meta in rec:
            if ONLY not in kernel.fn.__name__:
                continue
            sig, consts = sig_of(kernel, args, meta)
            warps = meta.get("num_warps", 4)
            options = {"num_warps": warps, **({"maxnreg": meta["maxnreg"]} if meta.get("maxnreg") else {})}
            key = (kernel.fn.__name__, tuple(sorted(sig.items())),
                   tuple(sorted((k, str(v)) for k, v in consts.items())), warps, options.get("maxnreg"))
            if key in seen:
                continue
            seen.add(key)
            label = f"{kernel.fn.__name__} {H}x{F} {str(dtype)[6:]} warps {warps} maxnreg {options.get('maxnreg')}"
            try:
                asm = tcompile(ASTSource(kernel, sig, consts, attrs_of(kernel, args)),
                               target=GPUTarget("cuda", 90, 32), options=options).asm
                ptx = asm["ptx"]
            except Exception as exc:  # noqa: BLE001  (reported, counted, the run goes on)
                failures += 1
                print(f"FAIL {label}: {type(exc).__name__}: {str(exc)[-900:]}", flush=True)
                continue
            print(f"ok {label}: cp.async {ptx.count('cp.async')} ld.local {ptx.count('ld.local')}"
                  f"{sass_report(asm['cubin']) if 'cubin' in asm else ''}", flush=True)
    print(f"kernels compiled: {len(seen)}, failures: {failures}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
