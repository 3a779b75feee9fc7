// Python entry points of the graph kernels (CSR build + gather-scatter). Schemas,
// validation and autograd live in gnnfuse/ops/.
#include <torch/extension.h>

#include <cstdlib>

namespace gnnfuse {
void register_csr(pybind11::module& m);
void register_gather_scatter(pybind11::module& m);
}  // namespace gnnfuse

namespace {
// getenv(name) -> str | None: the process environment's value now. os.environ writes go through
// putenv/unsetenv, so this sees them; it costs ~0.05 us where os.environ.get costs ~0.6 us for an
// unset variable (two KeyErrors inside), which gnnfuse.config pays on every op call otherwise.
PyObject* process_getenv(PyObject*, PyObject* name) {
  const char* key = PyUnicode_AsUTF8(name);
  if (key == nullptr) return nullptr;
  const char* value = std::getenv(key);
  if (value == nullptr) Py_RETURN_NONE;
  return PyUnicode_DecodeFSDefault(value);
}

PyMethodDef kGetenv = {"getenv", &process_getenv, METH_O, "getenv(name) -> str | None"};
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  gnnfuse::register_csr(m);
  gnnfuse::register_gather_scatter(m);
  m.add_object("getenv", pybind11::reinterpret_steal<pybind11::object>(PyCFunction_NewEx(&kGetenv, nullptr, nullptr)));
}
