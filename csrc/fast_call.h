// A Python binding of a C++ kernel without pybind11's per-call machinery, for the kernels the op
// layer's eager route calls on every op call (gnnfuse/ops/_opdef.py, CppKernel).
//
// Why: pybind11 resolves overloads and converts every argument through its type casters; for the
// gather-scatter forward's eight arguments that costs about 0.25 us a call (CI VM, 1 thread), a
// visible share of a Cora-sized call (the kernel takes 25 us). This binding is a METH_FASTCALL
// function that converts the few parameter types the ops' schemas use, and nothing else:
//   const at::Tensor&, const c10::optional<at::Tensor>& (None or a tensor), c10::string_view
//   (str), bool (a Python bool), int64_t (int), double (float or int);
// and returns an at::Tensor or a std::tuple of them. Trailing arguments may be left out; they are
// None then, which an optional tensor takes (a schema's trailing ``Tensor? name=None``, added to an
// op later, so older callers keep working) and any other type refuses with a TypeError.
// A wrong argument raises TypeError naming the
// function and the argument's position; the kernel's own errors map to Python exceptions as under
// pybind11 (torch's HANDLE_TH_ERRORS: c10::ValueError -> ValueError, other c10::Error ->
// RuntimeError). The GIL is held, as under pybind11.
//
// Usage: m.add_object("name", fast_function<&kernel>("name"));
#pragma once

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/extension.h>

#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

namespace gnnfuse {
namespace fast_call_detail {

[[noreturn]] inline void bad_argument(PyObject* name, size_t position, const char* expected, PyObject* got) {
  throw torch::TypeError(std::string(PyUnicode_AsUTF8(name)) + "(): argument " + std::to_string(position) +
                         " must be " + expected + ", not " + Py_TYPE(got)->tp_name);
}

// PyObject* -> the parameter (by the parameter's type without const and reference)
template <typename T>
struct Arg;

template <>
struct Arg<at::Tensor> {
  static const at::Tensor& get(PyObject* o, PyObject* name, size_t i) {
    if (!THPVariable_Check(o)) bad_argument(name, i, "a Tensor", o);
    return THPVariable_Unpack(o);
  }
};

template <>
struct Arg<c10::optional<at::Tensor>> {
  static c10::optional<at::Tensor> get(PyObject* o, PyObject* name, size_t i) {
    if (o == Py_None) return c10::nullopt;
    if (!THPVariable_Check(o)) bad_argument(name, i, "a Tensor or None", o);
    return THPVariable_Unpack(o);
  }
};

template <>
struct Arg<c10::string_view> {
  static c10::string_view get(PyObject* o, PyObject* name, size_t i) {
    if (!PyUnicode_Check(o)) bad_argument(name, i, "a str", o);
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(o, &size);
    if (data == nullptr) throw python_error();
    return c10::string_view(data, size_t(size));
  }
};

template <>
struct Arg<bool> {
  static bool get(PyObject* o, PyObject* name, size_t i) {
    if (!PyBool_Check(o)) bad_argument(name, i, "a bool", o);
    return o == Py_True;
  }
};

template <>
struct Arg<int64_t> {
  static int64_t get(PyObject* o, PyObject* name, size_t i) {
    if (!PyLong_Check(o)) bad_argument(name, i, "an int", o);
    const long long v = PyLong_AsLongLong(o);
    if (v == -1 && PyErr_Occurred()) throw python_error();
    return int64_t(v);
  }
};

template <>
struct Arg<double> {
  static double get(PyObject* o, PyObject* name, size_t i) {
    if (!PyFloat_Check(o) && !PyLong_Check(o)) bad_argument(name, i, "a float", o);
    const double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) throw python_error();
    return v;
  }
};

// the result -> a new reference
inline PyObject* to_python(const at::Tensor& t) { return THPVariable_Wrap(t); }

template <typename... T>
PyObject* to_python(const std::tuple<T...>& results) {
  PyObject* out = PyTuple_New(sizeof...(T));
  if (out == nullptr) throw python_error();
  size_t k = 0;
  std::apply([&](const auto&... r) { ((PyTuple_SET_ITEM(out, Py_ssize_t(k++), to_python(r))), ...); }, results);
  for (Py_ssize_t i = 0; i < Py_ssize_t(sizeof...(T)); ++i) {
    if (PyTuple_GET_ITEM(out, i) == nullptr) {
      Py_DECREF(out);
      throw python_error();
    }
  }
  return out;
}

template <typename F, F Fn>
struct Binding;

template <typename R, typename... A, R (*Fn)(A...)>
struct Binding<R (*)(A...), Fn> {
  // self: the function's name (a str), for error messages
  static PyObject* call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
    HANDLE_TH_ERRORS
    if (nargs > Py_ssize_t(sizeof...(A))) {
      throw torch::TypeError(std::string(PyUnicode_AsUTF8(self)) + "() takes at most " +
                             std::to_string(sizeof...(A)) + " positional arguments (" + std::to_string(nargs) +
                             " given)");
    }
    return run(self, args, nargs, std::index_sequence_for<A...>{});
    END_HANDLE_TH_ERRORS
  }

  template <size_t... I>
  static PyObject* run(PyObject* self, PyObject* const* args, Py_ssize_t nargs, std::index_sequence<I...>) {
    // (braced initialisation: the arguments convert left to right; one left out is None)
    return to_python(invoke{Arg<std::decay_t<A>>::get(Py_ssize_t(I) < nargs ? args[I] : Py_None, self, I)...}.result);
  }

  struct invoke {
    R result;
    template <typename... V>
    explicit invoke(V&&... v) : result(Fn(std::forward<V>(v)...)) {}
  };
};

}  // namespace fast_call_detail

// A Python function named `name` calling `Fn` with its positional arguments (see the top of this file).
template <auto Fn>
pybind11::object fast_function(const char* name) {
  static PyMethodDef def{name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(
                                   &fast_call_detail::Binding<decltype(Fn), Fn>::call)),
                         METH_FASTCALL, "a C++ kernel called with its op's positional arguments"};
  PyObject* self = PyUnicode_FromString(name);
  if (self == nullptr) throw pybind11::error_already_set();
  PyObject* fn = PyCFunction_NewEx(&def, self, nullptr);
  Py_DECREF(self);
  if (fn == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::object>(fn);
}

}  // namespace gnnfuse
