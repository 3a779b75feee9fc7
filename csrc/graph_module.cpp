// Python entry points of the graph kernels (CSR build + gather-scatter), and two helpers of the
// per-call Python path (an environment read, the eager route's argument scan). Schemas,
// validation and autograd live in gnnfuse/ops/.
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <cstdlib>
#include <vector>

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

// scan_args(args) -> tuple | None: the argument scan of the ops' eager route (gnnfuse/ops/_opdef.py,
// _scan, which falls back to the same loop in Python): None when an argument is a tensor subclass or a
// tensor on a device other than CPU and CUDA (the registered op must run), else the positions of the
// tensors that require grad. About 0.1 us for eight arguments; the Python loop costs 0.5.
PyObject* scan_args(PyObject*, PyObject* args) {
  PyObject* seq = PySequence_Fast(args, "scan_args: expected a tuple or list");
  if (seq == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  std::vector<Py_ssize_t> grad;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = items[i];
    if (item == Py_None) continue;
    if (THPVariable_CheckExact(item)) {
      const at::Tensor& t = THPVariable_Unpack(item);
      const auto type = t.device().type();
      if (type != c10::kCPU && type != c10::kCUDA) {
        Py_DECREF(seq);
        Py_RETURN_NONE;
      }
      if (t.requires_grad()) grad.push_back(i);
    } else if (THPVariable_Check(item)) {  // a subclass
      Py_DECREF(seq);
      Py_RETURN_NONE;
    }
  }
  Py_DECREF(seq);
  PyObject* out = PyTuple_New(Py_ssize_t(grad.size()));
  if (out == nullptr) return nullptr;
  for (size_t k = 0; k < grad.size(); ++k) {
    PyObject* index = PyLong_FromSsize_t(grad[k]);
    if (index == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, Py_ssize_t(k), index);
  }
  return out;
}

PyMethodDef kFunctions[] = {
    {"getenv", &process_getenv, METH_O, "getenv(name) -> str | None"},
    {"scan_args", &scan_args, METH_O, "scan_args(args) -> tuple | None"},
};
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  gnnfuse::register_csr(m);
  gnnfuse::register_gather_scatter(m);
  for (PyMethodDef& def : kFunctions) {
    m.add_object(def.ml_name, pybind11::reinterpret_steal<pybind11::object>(PyCFunction_NewEx(&def, nullptr, nullptr)));
  }
}
