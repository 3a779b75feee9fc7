// Planarity restraint NLL on CPU (gnnfuse.planarity_nll).
//
// Per plane p with atoms a (one bucket per plane size n):
//   c_p = mean_a x_pa,  n_p = unit eigenvector of the smallest eigenvalue of the 3x3 covariance
//   (float64, cyclic Jacobi fused here; zero when the covariance is not finite),
//   d_pa = (x_pa - c_p) . n_p,  NLL_p = sum_a 0.5 (d_pa / s_p)^2 + n (log s_p + 0.5 log 2 pi).
// Backward: dNLL_p/dx_pc = [d_pc / s_p^2 - mean_a d_pa / s_p^2] n_p, and optionally
//   dNLL_p/ds_p = n / s_p - sum_a d_pa^2 / s_p^3.
//
// Everything is computed in float64. Parallelism: planes are cut into fixed blocks (the
// result never depends on the thread count). The forward sums per-block partial losses in
// block order and saves, per (plane, atom) entry, the backward coefficient
// (d_pa - mean_a d_pa) / s_p^2, so the backward is a pure scatter of g * coef * n_p: every
// thread owns a contiguous range of atoms and adds the entries of its atoms in entry order.
// No atomics; bit-identical from run to run and across thread counts.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "checks.h"

#include <cmath>
#include <vector>

namespace {

constexpr int64_t kPlaneBlock = 256;     // planes per parallel work item
constexpr int64_t kBlockGrain = 1;       // blocks per parallel work item
constexpr int64_t kAtomGrain = 4096;     // atoms per parallel work item in the scatter
constexpr int kMaxSweeps = 12;           // Jacobi sweeps (3 rotations each); 4-5 are typical
constexpr double kHalfLog2Pi = 0.91893853320467274178032973640562;

struct Bucket {
  const int32_t* i32 = nullptr;
  const int64_t* i64 = nullptr;
  const void* sigma = nullptr;
  int64_t planes = 0, n = 0;
  int64_t plane_offset = 0;  // first plane of this bucket in the concatenated plane order
  int64_t entry_offset = 0;  // first (plane, atom) entry of this bucket
  inline int64_t atom(int64_t k) const { return i32 ? static_cast<int64_t>(i32[k]) : i64[k]; }
};

struct Block {
  int64_t bucket, begin, end;
};

// One Jacobi rotation zeroing a[p][q] (Numerical Recipes' formulation); r is the third index.
inline void rotate(double a[3][3], double v[3][3], int p, int q, int r) {
  const double apq = a[p][q];
  if (apq == 0.0) return;
  // t = tan(angle) = sgn(h) 2apq / (|h| + sqrt(h^2 + 4apq^2)), h = aqq - app; both terms are
  // scaled by their maximum first (no overflow, no underflow, no 0/0). Same as Triton's.
  const double h = a[q][q] - a[p][p], p2 = 2.0 * apq;
  const double m = std::fmax(std::fabs(h), std::fabs(p2));
  const double hn = h / m, pn = p2 / m;
  double t = pn / (std::fabs(hn) + std::sqrt(hn * hn + pn * pn));
  if (h < 0.0) t = -t;
  const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c, tau = s / (1.0 + c);
  a[p][p] -= t * apq;
  a[q][q] += t * apq;
  a[p][q] = a[q][p] = 0.0;
  const double arp = a[r][p], arq = a[r][q];
  a[r][p] = a[p][r] = arp - s * (arq + tau * arp);
  a[r][q] = a[q][r] = arq + s * (arp - tau * arq);
  for (int k = 0; k < 3; ++k) {
    const double vp = v[k][p], vq = v[k][q];
    v[k][p] = vp - s * (vq + tau * vp);
    v[k][q] = vq + s * (vp - tau * vq);
  }
}

// Unit eigenvector of the smallest eigenvalue of the symmetric matrix
// [[c00 c01 c02] [c01 c11 c12] [c02 c12 c22]]; zero if any entry is not finite.
inline void smallest_eigenvector(double c00, double c01, double c02, double c11, double c12, double c22,
                                 double out[3]) {
  if (!(std::isfinite(c00) && std::isfinite(c01) && std::isfinite(c02) && std::isfinite(c11) &&
        std::isfinite(c12) && std::isfinite(c22))) {
    out[0] = out[1] = out[2] = 0.0;
    return;
  }
  double scale = std::fmax(std::fmax(std::fabs(c00), std::fabs(c11)), std::fabs(c22));
  scale = std::fmax(scale, std::fmax(std::fmax(std::fabs(c01), std::fabs(c02)), std::fabs(c12)));
  const double inv = scale > 0.0 ? 1.0 / scale : 1.0;  // entries in [-1, 1]: no overflow below
  double a[3][3] = {{c00 * inv, c01 * inv, c02 * inv}, {c01 * inv, c11 * inv, c12 * inv},
                    {c02 * inv, c12 * inv, c22 * inv}};
  double v[3][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}};
  for (int sweep = 0; sweep < kMaxSweeps; ++sweep) {
    const double off = a[0][1] * a[0][1] + a[0][2] * a[0][2] + a[1][2] * a[1][2];
    if (!(off > 1e-40)) break;  // converged far below double precision of the (unit-scaled) diagonal
    rotate(a, v, 0, 1, 2);
    rotate(a, v, 0, 2, 1);
    rotate(a, v, 1, 2, 0);
  }
  int k = 0;
  if (a[1][1] < a[k][k]) k = 1;
  if (a[2][2] < a[k][k]) k = 2;
  const double x = v[0][k], y = v[1][k], z = v[2][k];
  const double norm = std::sqrt(x * x + y * y + z * z);
  out[0] = x / norm;
  out[1] = y / norm;
  out[2] = z / norm;
}

[[noreturn]] void bad_atom(int64_t bucket, int64_t atom, int64_t num_atoms) {
  TORCH_CHECK_INDEX(false, gnnfuse::text("planarity_nll: plane_groups[", bucket, "] indices contain atom id ", atom,
                                ", outside [0, ", num_atoms, ") (xyz has ", num_atoms, " atoms)"));
}

std::vector<Bucket> make_buckets(const torch::Tensor& xyz, const std::vector<torch::Tensor>& indices,
                                 const std::vector<torch::Tensor>& sigmas) {
  TORCH_CHECK(xyz.dim() == 2 && xyz.size(1) == 3 && xyz.is_contiguous() && xyz.device().is_cpu(),
              gnnfuse::text("planarity_nll: xyz must be a contiguous CPU tensor of shape [A, 3]; got ", xyz.sizes()));
  TORCH_CHECK(xyz.scalar_type() == at::kFloat || xyz.scalar_type() == at::kDouble,
              gnnfuse::text("planarity_nll: xyz must be float32 or float64; got ", xyz.scalar_type()));
  TORCH_CHECK(indices.size() == sigmas.size(),
              gnnfuse::text("planarity_nll: ", indices.size(), " index tensors but ", sigmas.size(), " sigma tensors"));
  std::vector<Bucket> buckets;
  int64_t plane_offset = 0, entry_offset = 0;
  for (size_t b = 0; b < indices.size(); ++b) {
    const auto& idx = indices[b];
    const auto& sig = sigmas[b];
    TORCH_CHECK(idx.dim() == 2 && idx.is_contiguous() && idx.device().is_cpu() &&
                    (idx.scalar_type() == at::kInt || idx.scalar_type() == at::kLong),
                gnnfuse::text("planarity_nll: plane_groups[", b, "] indices must be a contiguous CPU int32/int64 tensor [P, n]"));
    TORCH_CHECK(idx.size(1) >= 1 || idx.size(0) == 0,
                gnnfuse::text("planarity_nll: plane_groups[", b, "] indices has planes of 0 atoms"));
    TORCH_CHECK(sig.dim() == 1 && sig.size(0) == idx.size(0) && sig.is_contiguous() &&
                    sig.scalar_type() == xyz.scalar_type(),
                gnnfuse::text("planarity_nll: plane_groups[", b, "] sigmas must be a contiguous [P] tensor with xyz's dtype"));
    Bucket bk;
    if (idx.scalar_type() == at::kInt) bk.i32 = idx.data_ptr<int32_t>();
    else bk.i64 = idx.data_ptr<int64_t>();
    bk.sigma = sig.data_ptr();
    bk.planes = idx.size(0);
    bk.n = idx.size(1);
    bk.plane_offset = plane_offset;
    bk.entry_offset = entry_offset;
    plane_offset += bk.planes;
    entry_offset += bk.planes * bk.n;
    buckets.push_back(bk);
  }
  return buckets;
}

std::vector<Block> make_blocks(const std::vector<Bucket>& buckets) {
  std::vector<Block> blocks;
  for (size_t b = 0; b < buckets.size(); ++b) {
    for (int64_t p = 0; p < buckets[b].planes; p += kPlaneBlock) {
      blocks.push_back({static_cast<int64_t>(b), p, std::min(p + kPlaneBlock, buckets[b].planes)});
    }
  }
  return blocks;
}

// Centroid and covariance-based normal of one plane; fills c[3], normal[3]. Checks atom ids.
template <typename scalar_t>
inline void plane_frame(const scalar_t* xyz, int64_t num_atoms, const Bucket& bk, int64_t bucket, int64_t p,
                        double c[3], double normal[3]) {
  const int64_t n = bk.n, base = p * n;
  double sx = 0, sy = 0, sz = 0;
  for (int64_t a = 0; a < n; ++a) {
    const int64_t i = bk.atom(base + a);
    if (i < 0 || i >= num_atoms) bad_atom(bucket, i, num_atoms);
    const scalar_t* r = xyz + 3 * i;
    sx += double(r[0]);
    sy += double(r[1]);
    sz += double(r[2]);
  }
  const double inv_n = 1.0 / double(n);
  c[0] = sx * inv_n;
  c[1] = sy * inv_n;
  c[2] = sz * inv_n;
  double c00 = 0, c01 = 0, c02 = 0, c11 = 0, c12 = 0, c22 = 0;
  for (int64_t a = 0; a < n; ++a) {
    const scalar_t* r = xyz + 3 * bk.atom(base + a);
    const double x = double(r[0]) - c[0], y = double(r[1]) - c[1], z = double(r[2]) - c[2];
    c00 += x * x;
    c01 += x * y;
    c02 += x * z;
    c11 += y * y;
    c12 += y * z;
    c22 += z * z;
  }
  smallest_eigenvector(c00 * inv_n, c01 * inv_n, c02 * inv_n, c11 * inv_n, c12 * inv_n, c22 * inv_n, normal);
}

template <typename scalar_t>
void forward_impl(const scalar_t* xyz, int64_t num_atoms, const std::vector<Bucket>& buckets,
                  const std::vector<Block>& blocks, double* planes, double* coef, double* block_loss) {
  at::parallel_for(0, static_cast<int64_t>(blocks.size()), kBlockGrain, [&](int64_t b0, int64_t b1) {
    for (int64_t blk = b0; blk < b1; ++blk) {
      const Block& block = blocks[blk];
      const Bucket& bk = buckets[block.bucket];
      const scalar_t* sigma = static_cast<const scalar_t*>(bk.sigma);
      const int64_t n = bk.n;
      const double log_const = double(n) * kHalfLog2Pi, inv_n = 1.0 / double(n);
      double loss = 0;
      for (int64_t p = block.begin; p < block.end; ++p) {
        double c[3];
        double* plane = planes + 4 * (bk.plane_offset + p);
        plane_frame(xyz, num_atoms, bk, block.bucket, p, c, plane);
        double* f = coef + bk.entry_offset + p * n;
        double sum_d = 0, sum_sq = 0;
        for (int64_t a = 0; a < n; ++a) {
          const scalar_t* r = xyz + 3 * bk.atom(p * n + a);
          const double d = (double(r[0]) - c[0]) * plane[0] + (double(r[1]) - c[1]) * plane[1] +
                           (double(r[2]) - c[2]) * plane[2];
          f[a] = d;
          sum_d += d;
          sum_sq += d * d;
        }
        const double s = double(sigma[p]), inv_s2 = 1.0 / (s * s), mean_d = sum_d * inv_n;
        // backward coefficient: dNLL_p/dx_pa = coef_pa * n_p (upstream gradient applied later)
        for (int64_t a = 0; a < n; ++a) f[a] = (f[a] - mean_d) * inv_s2;
        plane[3] = sum_sq;
        loss += 0.5 * sum_sq * inv_s2 + double(n) * std::log(s) + log_const;
      }
      block_loss[blk] = loss;
    }
  });
}

// Returns (loss [] in xyz's dtype, planes [P, 4] float64 = (normal, sum_a d_pa^2),
// coef [sum_b P_b n_b] float64 = (d_pa - mean_a d_pa) / s_p^2, in bucket/plane/atom order).
std::vector<torch::Tensor> planarity_forward(const torch::Tensor& xyz, const std::vector<torch::Tensor>& indices,
                                             const std::vector<torch::Tensor>& sigmas) {
  const auto buckets = make_buckets(xyz, indices, sigmas);
  const auto blocks = make_blocks(buckets);
  int64_t total_planes = 0, total_entries = 0;
  for (const auto& bk : buckets) {
    total_planes += bk.planes;
    total_entries += bk.planes * bk.n;
  }
  auto planes = torch::empty({total_planes, 4}, xyz.options().dtype(at::kDouble));
  auto coef = torch::empty({total_entries}, xyz.options().dtype(at::kDouble));
  std::vector<double> block_loss(blocks.size(), 0.0);
  AT_DISPATCH_FLOATING_TYPES(xyz.scalar_type(), "planarity_forward", [&] {
    forward_impl<scalar_t>(xyz.data_ptr<scalar_t>(), xyz.size(0), buckets, blocks, planes.data_ptr<double>(),
                           coef.data_ptr<double>(), block_loss.data());
  });
  double total = 0;
  for (double v : block_loss) total += v;  // fixed order: independent of the thread count
  auto loss = torch::full({}, total, xyz.options().dtype(at::kDouble)).to(xyz.scalar_type());
  return {loss, planes, coef};
}

// Deterministic scatter: every thread owns a contiguous range of atoms and adds, in entry order,
// g * coef_e * n_p of the entries that hit its atoms (accumulating in float64).
template <typename scalar_t>
void backward_impl(double g, int64_t num_atoms, const std::vector<Bucket>& buckets, const double* planes,
                   const double* coef, scalar_t* grad_xyz) {
  at::parallel_for(0, num_atoms, kAtomGrain, [&](int64_t a0, int64_t a1) {
    std::vector<double> acc(3 * (a1 - a0), 0.0);
    for (size_t b = 0; b < buckets.size(); ++b) {
      const Bucket& bk = buckets[b];
      const int64_t entries = bk.planes * bk.n;
      const double* f = coef + bk.entry_offset;
      const double* pl = planes + 4 * bk.plane_offset;
      for (int64_t e = 0; e < entries; ++e) {
        const int64_t i = bk.atom(e);
        if (i >= a0 && i < a1) {
          const double* nrm = pl + 4 * (e / bk.n);
          const double w = g * f[e];
          double* dst = acc.data() + 3 * (i - a0);
          dst[0] += w * nrm[0];
          dst[1] += w * nrm[1];
          dst[2] += w * nrm[2];
        } else if (i < 0 || i >= num_atoms) {
          bad_atom(static_cast<int64_t>(b), i, num_atoms);
        }
      }
    }
    scalar_t* out = grad_xyz + 3 * a0;
    for (int64_t k = 0; k < 3 * (a1 - a0); ++k) out[k] = scalar_t(acc[k]);
  });
}

std::vector<torch::Tensor> planarity_backward(const torch::Tensor& grad, const torch::Tensor& xyz,
                                              const std::vector<torch::Tensor>& indices,
                                              const std::vector<torch::Tensor>& sigmas,
                                              const torch::Tensor& planes, const torch::Tensor& coef,
                                              bool need_sigma_grad) {
  const auto buckets = make_buckets(xyz, indices, sigmas);
  int64_t total_planes = 0, total_entries = 0;
  for (const auto& bk : buckets) {
    total_planes += bk.planes;
    total_entries += bk.planes * bk.n;
  }
  TORCH_CHECK(planes.scalar_type() == at::kDouble && planes.is_contiguous() && planes.dim() == 2 &&
                  planes.size(0) == total_planes && planes.size(1) == 4,
              gnnfuse::text("planarity_nll backward: planes must be a contiguous float64 [", total_planes, ", 4] tensor"));
  TORCH_CHECK(coef.scalar_type() == at::kDouble && coef.is_contiguous() && coef.numel() == total_entries,
              gnnfuse::text("planarity_nll backward: coef must be a contiguous float64 [", total_entries, "] tensor"));
  TORCH_CHECK(grad.numel() == 1, "planarity_nll backward: the upstream gradient must be a scalar");
  const double g = grad.to(at::kDouble).reshape({}).data_ptr<double>()[0];  // CPU memory read, no device sync
  auto grad_xyz = torch::empty({xyz.size(0), 3}, xyz.options());
  auto grad_sigma = need_sigma_grad ? torch::empty({total_planes}, xyz.options()) : torch::empty({0}, xyz.options());
  AT_DISPATCH_FLOATING_TYPES(xyz.scalar_type(), "planarity_backward", [&] {
    backward_impl<scalar_t>(g, xyz.size(0), buckets, planes.data_ptr<double>(), coef.data_ptr<double>(),
                            grad_xyz.data_ptr<scalar_t>());
    if (need_sigma_grad) {
      scalar_t* gs = grad_sigma.data_ptr<scalar_t>();
      const double* pl = planes.data_ptr<double>();
      for (const auto& bk : buckets) {
        const scalar_t* sigma = static_cast<const scalar_t*>(bk.sigma);
        at::parallel_for(0, bk.planes, 4096, [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            const double s = double(sigma[p]), sum_sq = pl[4 * (bk.plane_offset + p) + 3];
            gs[bk.plane_offset + p] = scalar_t(g * (double(bk.n) / s - sum_sq / (s * s * s)));
          }
        });
      }
    }
  });
  return {grad_xyz, grad_sigma};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("planarity_forward", &planarity_forward, "planarity NLL forward: (loss, planes [P, 4] float64, coef [P*n] float64)");
  m.def("planarity_backward", &planarity_backward,
        "planarity NLL backward: (grad_xyz [A, 3], grad_sigma [P] or [0])");
}
