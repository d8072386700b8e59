// bind.cpp: the Python glue, compiled by the host compiler. Plain pybind11 over raw pointers and the raw stream:
// submission.py checks dtypes, shapes, devices and alignment before it calls, so no torch header is needed here (the
// torch headers cost the first import most of its compile time). Errors name the config.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "args.h"

int muse_launch(int kind, const int* t, const GemvArgs& a, int co, bool pdl, cudaStream_t st);
int muse_attrs(int kind, const int* t, int* res);
int unpackz_launch(const void* w, const void* zbase, void* out, int N, int K, cudaStream_t st);

namespace py = pybind11;

// The config line a (kind, template parameters) stands for, as configs.cuh writes it.
static std::string config_name(int kind, const std::vector<int>& t) {
  static const char* const head[] = {"gemv C3(NW, U, NB, R, DUAL, PIPE) = (", "gemvz Z3(NW, UG, NB, R, PIPE) = (",
                                     "gemvt T3(NW, ST, NB, KA) = ("};
  std::string s = kind >= 0 && kind <= 2 ? head[kind] : "kind " + std::to_string(kind) + " (";
  for (size_t i = 0; i < t.size(); i++) s += (i ? ", " : "") + std::to_string(t[i]);
  return s + ")";
}

static void check_rc(int rc, const std::string& what) {
  if (rc == -1) throw std::runtime_error("unsupported " + what + ": not compiled in (add its table row and run build.py)");
  if (rc) throw std::runtime_error(what + ": CUDA error " + cudaGetErrorString((cudaError_t)rc));
}

static std::vector<int> checked_template(int kind, std::vector<int> t) {
  const size_t want = kind == 0 ? 6 : kind == 1 ? 5 : kind == 2 ? 4 : 0;
  if (!want || t.size() != want)
    throw std::invalid_argument("Launch: kind " + std::to_string(kind) + " takes " + std::to_string(want) +
                                " template parameters, got " + std::to_string(t.size()));
  return t;
}

// One planned launch of a layer at one m: the kernel (kind + template parameters), the layer's weight, side table and
// split-K buffers, the config's runtime fields. prepare builds it once; a call supplies x, out, the tokens and the
// stream.
struct Launch {
  int kind;
  std::vector<int> t;
  GemvArgs a;
  int co;

  void call(uintptr_t x, uintptr_t out, int M, uintptr_t stream, bool pdl) const {
    GemvArgs b = a;
    b.x = reinterpret_cast<const void*>(x);
    b.out = reinterpret_cast<void*>(out);
    b.M = M;
    const int rc = muse_launch(kind, t.data(), b, co, pdl, reinterpret_cast<cudaStream_t>(stream));
    if (rc) check_rc(rc, config_name(kind, t));
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // module_local: every variant build (tools, tests) defines its own Launch; pybind11 would refuse a second global one
  py::class_<Launch>(m, "Launch", py::module_local(), "one planned launch: Launch(...)(x_ptr, out_ptr, M, stream, pdl)")
      .def(py::init([](int kind, std::vector<int> t, uintptr_t w, uintptr_t w2, uintptr_t eptr, uintptr_t esc,
                       uintptr_t ws, uintptr_t sem, int N, int K, int S, int pf, int cl, uintptr_t zbase,
                       int co) {
             GemvArgs a{};
             a.w = reinterpret_cast<const void*>(w);
             a.w2 = reinterpret_cast<const void*>(w2);
             a.eptr = reinterpret_cast<const void*>(eptr);
             a.esc = reinterpret_cast<const void*>(esc);
             a.ws = reinterpret_cast<void*>(ws);
             a.sem = reinterpret_cast<void*>(sem);
             a.N = N, a.K = K, a.S = S, a.pf = pf, a.cl = cl;
             a.zbase = reinterpret_cast<const void*>(zbase);
             return Launch{kind, checked_template(kind, std::move(t)), a, co};
           }),
           py::arg("kind"), py::arg("t"), py::arg("w"), py::arg("w2"), py::arg("eptr"), py::arg("esc"), py::arg("ws"),
           py::arg("sem"), py::arg("N"), py::arg("K"), py::arg("S"), py::arg("pf"), py::arg("cl"), py::arg("zbase"),
           py::arg("co"))
      .def("__call__", &Launch::call, py::arg("x"), py::arg("out"), py::arg("M"), py::arg("stream"), py::arg("pdl"))
      .def_readonly("kind", &Launch::kind)
      .def_readonly("t", &Launch::t);
  m.def("attrs", [](int kind, std::vector<int> t) -> std::vector<int> {
    int res[4] = {0, 0, 0, 0};
    const int rc = muse_attrs(kind, checked_template(kind, t).data(), res);
    if (rc == -1) return {};
    check_rc(rc, config_name(kind, t));
    return {res[0], res[1], res[2], res[3]};
  }, "registers / spill bytes / static smem / max threads of a compiled config; [] if it is not compiled in");
  m.def("unpackz", [](uintptr_t w, uintptr_t zbase, uintptr_t out, int N, int K, uintptr_t stream) {
    const int rc = unpackz_launch(reinterpret_cast<const void*>(w), reinterpret_cast<const void*>(zbase),
                                  reinterpret_cast<void*>(out), N, K, reinterpret_cast<cudaStream_t>(stream));
    if (rc) check_rc(rc, "unpackz");
  }, "decode a 12-bit stream to bf16 [N, K] (prepare's check)");
}
