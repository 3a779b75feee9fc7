// Python entry points of the CPU kernels. Each kernel file registers its own functions;
// the schemas, validation and autograd live in gnnfuse/ops/.
#include <torch/extension.h>

namespace gnnfuse {
void register_csr(pybind11::module& m);
void register_gather_scatter(pybind11::module& m);
}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  gnnfuse::register_csr(m);
  gnnfuse::register_gather_scatter(m);
  m.def("openmp_threads", [] { return at::get_num_threads(); });
}
