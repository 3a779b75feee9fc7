// Python entry points of the graph kernels (CSR build + gather-scatter). Schemas,
// validation and autograd live in gnnfuse/ops/.
#include <torch/extension.h>

namespace gnnfuse {
void register_csr(pybind11::module& m);
void register_gather_scatter(pybind11::module& m);
}  // namespace gnnfuse

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  gnnfuse::register_csr(m);
  gnnfuse::register_gather_scatter(m);
}
