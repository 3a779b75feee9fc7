// Structured density scatter (crystallographic / cryo-EM map building) on CPU:
//
//   out[wa[c,ix] + wbwc[c,iy,iz]] += cube[c,ix,iy,iz]        cube [C,nx,ny,nz], out [map_size]
//
// and its adjoint, the structured gather grad_cube[c,ix,iy,iz] = grad_out[wa[c,ix] + wbwc[c,iy,iz]].
//
// Forward, "partitioned" scheme: the output [0, map_size) is split into one contiguous range per
// thread (boundaries balanced by atom count + map size, aligned to 64 bytes). Every thread scans
// the atoms in order and
//   * skips an atom whose span [min wa + min wbwc, max wa + max wbwc] misses its range,
//   * adds an atom wholly inside its range with no per-element check (the common case when
//     atoms are sorted by their 1-D centre: only atoms straddling a boundary are split),
//   * for a straddling atom, skips / adds unchecked / adds checked one x-slab at a time.
// Each output element is written by exactly one thread, atoms in index order, so there is no
// synchronisation, no atomics, and the result is bitwise identical for every thread count (and
// to the plain serial loop). Threads come from at::parallel_for: OpenMP in torch builds that
// have it, torch's own thread pool (std::thread based) otherwise, e.g. Apple Clang builds, so
// no separate std::thread fallback is needed here.
//
// Bounds: the per-atom spans are computed anyway (for the skips), so checking them against
// [0, map_size) is free; with check_bounds=false an out-of-range element is dropped (the
// partition test keeps every write inside the map), never written out of bounds.
//
// Also here, for the benchmark only: the seed design (equal output ranges, atom-level skip,
// every element of every overlapping atom range-checked) and a plain serial loop.
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "checks.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <vector>

namespace gnnfuse {
namespace {

constexpr int64_t kNoAtom = std::numeric_limits<int64_t>::max();
constexpr int64_t kAlign = 16;              // partition boundaries: multiples of 16 elements (>= 64 bytes)
constexpr int64_t kMinWorkPerThread = 1 << 15;  // cube elements + map elements per thread, at least

// Per atom: the inclusive span of its flat indices, and the span of its wbwc row alone
// (the x-slab ix then spans [wa[ix] + bc_lo, wa[ix] + bc_hi]).
// runs[c]: every wbwc[c, iy, :] row is a run of consecutive indices (the box does not wrap
// around the map's z edge), so a box row is added with a contiguous, vectorised loop.
struct Spans {
  std::vector<int64_t> lo, hi, bc_lo, bc_hi;
  std::vector<uint8_t> runs;
};

template <typename index_t>
inline bool rows_are_runs(const index_t* bc, int64_t ny, int64_t nz) {
  bool ok = true;
  for (int64_t iy = 0; iy < ny; ++iy) {
    const index_t* r = bc + iy * nz;
    for (int64_t iz = 1; iz < nz; ++iz) ok &= (static_cast<int64_t>(r[iz]) == static_cast<int64_t>(r[0]) + iz);
  }
  return ok;
}

template <typename index_t>
inline void min_max(const index_t* p, int64_t n, int64_t& lo, int64_t& hi) {
  index_t l = p[0], h = p[0];
#pragma omp simd reduction(min : l) reduction(max : h)
  for (int64_t i = 1; i < n; ++i) {
    l = std::min(l, p[i]);
    h = std::max(h, p[i]);
  }
  lo = l;
  hi = h;
}

[[noreturn]] void throw_out_of_bounds(const char* op, int64_t atom, int64_t lo, int64_t hi, int64_t map_size) {
  TORCH_CHECK_VALUE(false, text(op, ": index out of range: atom ", atom, " has flat indices wa[", atom, ", :] + wbwc[",
                                atom, ", :, :] spanning [", lo, ", ", hi, "], outside [0, map_size=", map_size,
                                "). Fix wa/wbwc (or map_size); check_bounds=False drops such elements instead of "
                                "raising."));
}

// Spans of every atom, in parallel over atoms. With check_bounds, raises for the lowest-numbered
// out-of-range atom (the same one for every thread count).
template <typename index_t>
Spans atom_spans(const index_t* wa, const index_t* bc, int64_t C, int64_t nx, int64_t ny, int64_t nz,
                 int64_t map_size, bool check_bounds, const char* op) {
  const int64_t nyz = ny * nz;
  Spans s;
  s.runs.resize(C);
  s.lo.resize(C);
  s.hi.resize(C);
  s.bc_lo.resize(C);
  s.bc_hi.resize(C);
  std::atomic<int64_t> first_bad{kNoAtom};
  at::parallel_for(0, C, 2048, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      int64_t alo, ahi, blo, bhi;
      min_max(wa + c * nx, nx, alo, ahi);
      min_max(bc + c * nyz, nyz, blo, bhi);
      s.lo[c] = alo + blo;
      s.hi[c] = ahi + bhi;
      s.bc_lo[c] = blo;
      s.bc_hi[c] = bhi;
      s.runs[c] = rows_are_runs(bc + c * nyz, ny, nz);
      if (check_bounds && (s.lo[c] < 0 || s.hi[c] >= map_size)) {
        int64_t cur = first_bad.load();
        while (c < cur && !first_bad.compare_exchange_weak(cur, c)) {
        }
        break;  // atoms after c in this chunk cannot be the lowest bad one
      }
    }
  });
  const int64_t bad = first_bad.load();
  if (bad != kNoAtom) throw_out_of_bounds(op, bad, s.lo[bad], s.hi[bad], map_size);
  return s;
}

// Partition boundaries [b_0 = 0, ..., b_P = map_size], non-decreasing, multiples of kAlign inside.
// The cost of a range is estimated as (atoms centred in it) x (voxels per atom) + (its length)/4
// (zero-filling the map is cheap per element but not free for 320^3 maps).
std::vector<int64_t> partition_bounds(const Spans& s, int64_t C, int64_t nxyz, int64_t map_size, int64_t parts) {
  std::vector<int64_t> bounds(parts + 1, map_size);
  bounds[0] = 0;
  if (parts == 1) return bounds;
  const int64_t bins = std::min<int64_t>(map_size, 256 * parts);
  const int64_t width = (map_size + bins - 1) / bins;
  std::vector<double> cost(bins, 0.25 * static_cast<double>(width));
  for (int64_t c = 0; c < C; ++c) {
    const int64_t centre = std::clamp<int64_t>(s.lo[c] + (s.hi[c] - s.lo[c]) / 2, 0, map_size - 1);
    cost[centre / width] += static_cast<double>(nxyz);
  }
  double total = 0;
  for (double v : cost) total += v;
  double cum = 0;
  int64_t b = 0;
  for (int64_t p = 1; p < parts; ++p) {
    const double target = total * static_cast<double>(p) / static_cast<double>(parts);
    while (b < bins && cum + cost[b] <= target) cum += cost[b++];
    const int64_t edge = std::min(map_size, (b * width) / kAlign * kAlign);
    bounds[p] = std::max(bounds[p - 1], edge);
  }
  return bounds;
}

int64_t num_parts(int64_t work, int64_t map_size) {
  int64_t parts = std::min<int64_t>(at::get_num_threads(), std::max<int64_t>(1, work / kMinWorkPerThread));
  return std::max<int64_t>(1, std::min(parts, map_size / kAlign));
}

// out[base + bc[j]] += src[j], j < n: the unchecked inner loop.
template <typename scalar_t, typename acc_t, typename index_t>
inline void add_slab(acc_t* __restrict out_base, const index_t* __restrict bc, const scalar_t* __restrict src,
                     int64_t n) {
  for (int64_t j = 0; j < n; ++j) out_base[bc[j]] += static_cast<acc_t>(src[j]);
}

// The same when every row bc[iy, :] is a run of consecutive indices: a contiguous add per row.
// Element order (and so the rounding) is the same as add_slab's.
template <typename scalar_t, typename acc_t, typename index_t>
inline void add_slab_runs(acc_t* __restrict out_base, const index_t* __restrict bc, const scalar_t* __restrict src,
                          int64_t ny, int64_t nz) {
  for (int64_t iy = 0; iy < ny; ++iy) {
    acc_t* __restrict d = out_base + static_cast<int64_t>(bc[iy * nz]);
    const scalar_t* __restrict v = src + iy * nz;
#pragma omp simd
    for (int64_t iz = 0; iz < nz; ++iz) d[iz] += static_cast<acc_t>(v[iz]);
  }
}

template <typename scalar_t, typename acc_t, typename index_t>
inline void add_slab_any(bool runs, acc_t* out_base, const index_t* bc, const scalar_t* src, int64_t ny, int64_t nz) {
  if (runs) {
    add_slab_runs(out_base, bc, src, ny, nz);
  } else {
    add_slab(out_base, bc, src, ny * nz);
  }
}

template <typename scalar_t, typename acc_t, typename index_t>
void scatter_partitioned(const scalar_t* cube, const index_t* wa, const index_t* bc, acc_t* out, int64_t C,
                         int64_t nx, int64_t ny, int64_t nz, const Spans& s, const std::vector<int64_t>& bounds) {
  const int64_t nyz = ny * nz;
  const int64_t parts = static_cast<int64_t>(bounds.size()) - 1;
  at::parallel_for(0, parts, 1, [&](int64_t pb, int64_t pe) {
    for (int64_t p = pb; p < pe; ++p) {
      const int64_t plo = bounds[p], phi = bounds[p + 1];  // this thread owns out[plo, phi)
      if (plo >= phi) continue;
      std::fill(out + plo, out + phi, acc_t(0));
      for (int64_t c = 0; c < C; ++c) {
        const int64_t lo = s.lo[c], hi = s.hi[c];
        if (hi < plo || lo >= phi) continue;  // atom misses this range
        const index_t* war = wa + c * nx;
        const index_t* bcr = bc + c * nyz;
        const scalar_t* src = cube + c * nx * nyz;
        if (lo >= plo && hi < phi) {  // wholly inside: no per-element check
          const bool runs = s.runs[c];
          for (int64_t ix = 0; ix < nx; ++ix) {
            add_slab_any(runs, out + static_cast<int64_t>(war[ix]), bcr, src + ix * nyz, ny, nz);
          }
          continue;
        }
        const int64_t blo = s.bc_lo[c], bhi = s.bc_hi[c];
        for (int64_t ix = 0; ix < nx; ++ix) {
          const int64_t base = war[ix];
          if (base + bhi < plo || base + blo >= phi) continue;  // x-slab misses
          const scalar_t* slab = src + ix * nyz;
          if (base + blo >= plo && base + bhi < phi) {
            add_slab_any(static_cast<bool>(s.runs[c]), out + base, bcr, slab, ny, nz);
          } else {
            for (int64_t j = 0; j < nyz; ++j) {
              const int64_t idx = base + static_cast<int64_t>(bcr[j]);
              if (idx >= plo && idx < phi) out[idx] += static_cast<acc_t>(slab[j]);
            }
          }
        }
      }
    }
  });
}

template <typename scalar_t, typename index_t>
void gather_kernel(const scalar_t* grad_out, const index_t* wa, const index_t* bc, scalar_t* grad_cube, int64_t C,
                   int64_t nx, int64_t ny, int64_t nz, int64_t map_size, bool check_bounds) {
  const int64_t nyz = ny * nz;
  std::atomic<int64_t> first_bad{kNoAtom};
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, nx * nyz));
  at::parallel_for(0, C, grain, [&](int64_t cb, int64_t ce) {
    for (int64_t c = cb; c < ce; ++c) {
      const index_t* war = wa + c * nx;
      const index_t* bcr = bc + c * nyz;
      scalar_t* dst = grad_cube + c * nx * nyz;
      int64_t alo, ahi, blo, bhi;
      min_max(war, nx, alo, ahi);
      min_max(bcr, nyz, blo, bhi);
      if (alo + blo >= 0 && ahi + bhi < map_size && rows_are_runs(bcr, ny, nz)) {
        for (int64_t ix = 0; ix < nx; ++ix) {
          const scalar_t* g = grad_out + static_cast<int64_t>(war[ix]);
          for (int64_t iy = 0; iy < ny; ++iy) {
            const scalar_t* __restrict from = g + static_cast<int64_t>(bcr[iy * nz]);
            scalar_t* __restrict to = dst + ix * nyz + iy * nz;
#pragma omp simd
            for (int64_t iz = 0; iz < nz; ++iz) to[iz] = from[iz];
          }
        }
      } else if (alo + blo >= 0 && ahi + bhi < map_size) {
        for (int64_t ix = 0; ix < nx; ++ix) {
          const scalar_t* g = grad_out + static_cast<int64_t>(war[ix]);
          scalar_t* d = dst + ix * nyz;
          for (int64_t j = 0; j < nyz; ++j) d[j] = g[bcr[j]];
        }
      } else if (check_bounds) {
        int64_t cur = first_bad.load();
        while (c < cur && !first_bad.compare_exchange_weak(cur, c)) {
        }
        break;
      } else {  // out-of-range elements read as 0
        for (int64_t ix = 0; ix < nx; ++ix) {
          const int64_t base = war[ix];
          for (int64_t j = 0; j < nyz; ++j) {
            const int64_t idx = base + static_cast<int64_t>(bcr[j]);
            dst[ix * nyz + j] = (idx >= 0 && idx < map_size) ? grad_out[idx] : scalar_t(0);
          }
        }
      }
    }
  });
  const int64_t bad = first_bad.load();
  if (bad != kNoAtom) {
    int64_t alo, ahi, blo, bhi;
    min_max(wa + bad * nx, nx, alo, ahi);
    min_max(bc + bad * nyz, nyz, blo, bhi);
    throw_out_of_bounds("structured_gather", bad, alo + blo, ahi + bhi, map_size);
  }
}

struct Dims {
  int64_t C, nx, ny, nz, nyz;
};

Dims check_args(const char* op, const at::Tensor& wa, const at::Tensor& wbwc, int64_t C, int64_t nx, int64_t ny,
                int64_t nz) {
  TORCH_CHECK(wa.is_contiguous() && wbwc.is_contiguous(), op, ": wa and wbwc must be contiguous");
  TORCH_CHECK(wa.scalar_type() == wbwc.scalar_type(), op, ": wa and wbwc must have the same dtype");
  TORCH_CHECK(wa.dim() == 2 && wa.size(0) == C && wa.size(1) == nx, op, ": wa must be [C, nx]");
  TORCH_CHECK(wbwc.dim() == 3 && wbwc.size(0) == C && wbwc.size(1) == ny && wbwc.size(2) == nz, op,
              ": wbwc must be [C, ny, nz]");
  return {C, nx, ny, nz, ny * nz};
}

Dims check_scatter_args(const char* op, const at::Tensor& cube, const at::Tensor& wa, const at::Tensor& wbwc,
                        int64_t map_size) {
  TORCH_CHECK(cube.dim() == 4 && cube.is_contiguous(), op, ": density_cube must be a contiguous [C, nx, ny, nz]");
  TORCH_CHECK_VALUE(map_size >= 0, op, ": map_size must be >= 0");
  TORCH_CHECK_VALUE(wa.scalar_type() != at::kInt || map_size <= std::numeric_limits<int32_t>::max(),
                    text(op, ": map_size=", map_size, " does not fit int32 indices; pass wa and wbwc as int64"));
  return check_args(op, wa, wbwc, cube.size(0), cube.size(1), cube.size(2), cube.size(3));
}

at::Tensor structured_scatter_forward(const at::Tensor& cube, const at::Tensor& wa, const at::Tensor& wbwc,
                                      int64_t map_size, bool check_bounds) {
  const char* op = "structured_scatter_add";
  const Dims d = check_scatter_args(op, cube, wa, wbwc, map_size);
  const int64_t nxyz = d.nx * d.nyz;
  if (d.C * nxyz == 0) return at::zeros({map_size}, cube.options());
  at::Tensor out = at::empty({map_size}, cube.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, cube.scalar_type(), "structured_scatter_forward", [&] {
    using acc_t = at::opmath_type<scalar_t>;  // float for half types, else the type itself
    AT_DISPATCH_INDEX_TYPES(wa.scalar_type(), "structured_scatter_forward_index", [&] {
      const index_t* wap = wa.data_ptr<index_t>();
      const index_t* bcp = wbwc.data_ptr<index_t>();
      const Spans s = atom_spans(wap, bcp, d.C, d.nx, d.ny, d.nz, map_size, check_bounds, op);
      if (map_size == 0) {  // only reachable with check_bounds=false: every element is dropped
        return;
      }
      const auto bounds = partition_bounds(s, d.C, nxyz, map_size, num_parts(d.C * nxyz + map_size, map_size));
      if constexpr (std::is_same_v<acc_t, scalar_t>) {
        scatter_partitioned(cube.data_ptr<scalar_t>(), wap, bcp, out.data_ptr<scalar_t>(), d.C, d.nx, d.ny, d.nz, s,
                            bounds);
      } else {
        at::Tensor acc = at::empty({map_size}, cube.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
        scatter_partitioned(cube.data_ptr<scalar_t>(), wap, bcp, acc.data_ptr<acc_t>(), d.C, d.nx, d.ny, d.nz, s,
                            bounds);
        out.copy_(acc);
      }
    });
  });
  return out;
}

at::Tensor structured_gather_forward(const at::Tensor& grad_out, const at::Tensor& wa, const at::Tensor& wbwc,
                                     int64_t ny, int64_t nz, bool check_bounds) {
  TORCH_CHECK(grad_out.dim() == 1 && grad_out.is_contiguous(), "structured_gather: grad_out must be contiguous 1-D");
  const Dims d = check_args("structured_gather", wa, wbwc, wa.size(0), wa.size(1), ny, nz);
  at::Tensor grad_cube = at::empty({d.C, d.nx, ny, nz}, grad_out.options());
  if (grad_cube.numel() == 0) return grad_cube;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, grad_out.scalar_type(), "structured_gather", [&] {
    AT_DISPATCH_INDEX_TYPES(wa.scalar_type(), "structured_gather_index", [&] {
      gather_kernel(grad_out.data_ptr<scalar_t>(), wa.data_ptr<index_t>(), wbwc.data_ptr<index_t>(),
                    grad_cube.data_ptr<scalar_t>(), d.C, d.nx, d.ny, d.nz, grad_out.size(0), check_bounds);
    });
  });
  return grad_cube;
}

// ---- benchmark baselines (float32/float64 only, no bounds checks: callers pass valid indices) ----

// The seed design: equal output ranges, one per thread; each thread skips atoms whose span misses
// its range and range-checks every element of every other atom.
at::Tensor structured_scatter_seed_baseline(const at::Tensor& cube, const at::Tensor& wa, const at::Tensor& wbwc,
                                            int64_t map_size) {
  const Dims d = check_scatter_args("seed_baseline", cube, wa, wbwc, map_size);
  at::Tensor out = at::zeros({map_size}, cube.options());
  if (d.C * d.nx * d.nyz == 0) return out;
  AT_DISPATCH_FLOATING_TYPES(cube.scalar_type(), "seed_baseline", [&] {
    AT_DISPATCH_INDEX_TYPES(wa.scalar_type(), "seed_baseline_index", [&] {
      const index_t* wap = wa.data_ptr<index_t>();
      const index_t* bcp = wbwc.data_ptr<index_t>();
      const scalar_t* src = cube.data_ptr<scalar_t>();
      scalar_t* o = out.data_ptr<scalar_t>();
      const Spans s = atom_spans(wap, bcp, d.C, d.nx, d.ny, d.nz, map_size, false, "seed_baseline");
      const int64_t T = at::get_num_threads();
      at::parallel_for(0, T, 1, [&](int64_t tb, int64_t te) {
        for (int64_t t = tb; t < te; ++t) {
          const int64_t plo = map_size * t / T, phi = map_size * (t + 1) / T;
          for (int64_t c = 0; c < d.C; ++c) {
            if (s.hi[c] < plo || s.lo[c] >= phi) continue;
            for (int64_t ix = 0; ix < d.nx; ++ix) {
              const int64_t base = wap[c * d.nx + ix];
              const index_t* bcr = bcp + c * d.nyz;
              const scalar_t* slab = src + (c * d.nx + ix) * d.nyz;
              for (int64_t j = 0; j < d.nyz; ++j) {
                const int64_t idx = base + static_cast<int64_t>(bcr[j]);
                if (idx >= plo && idx < phi) o[idx] += slab[j];
              }
            }
          }
        }
      });
    });
  });
  return out;
}

// A plain serial loop, no checks, no threads.
at::Tensor structured_scatter_serial_baseline(const at::Tensor& cube, const at::Tensor& wa, const at::Tensor& wbwc,
                                              int64_t map_size) {
  const Dims d = check_scatter_args("serial_baseline", cube, wa, wbwc, map_size);
  at::Tensor out = at::zeros({map_size}, cube.options());
  AT_DISPATCH_FLOATING_TYPES(cube.scalar_type(), "serial_baseline", [&] {
    AT_DISPATCH_INDEX_TYPES(wa.scalar_type(), "serial_baseline_index", [&] {
      const index_t* wap = wa.data_ptr<index_t>();
      const index_t* bcp = wbwc.data_ptr<index_t>();
      const scalar_t* src = cube.data_ptr<scalar_t>();
      scalar_t* o = out.data_ptr<scalar_t>();
      for (int64_t c = 0; c < d.C; ++c) {
        for (int64_t ix = 0; ix < d.nx; ++ix) {
          add_slab(o + static_cast<int64_t>(wap[c * d.nx + ix]), bcp + c * d.nyz, src + (c * d.nx + ix) * d.nyz,
                   d.nyz);
        }
      }
    });
  });
  return out;
}

}  // namespace
}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("structured_scatter_forward", &gnnfuse::structured_scatter_forward);
  m.def("structured_gather_forward", &gnnfuse::structured_gather_forward);
  m.def("structured_scatter_seed_baseline", &gnnfuse::structured_scatter_seed_baseline);
  m.def("structured_scatter_serial_baseline", &gnnfuse::structured_scatter_serial_baseline);
}
