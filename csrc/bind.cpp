// bind.cpp: the Python glue, compiled by the host compiler. Plain pybind11 over raw pointers and the raw stream:
// submission.py checks dtypes, shapes, devices and alignment before it calls, so no torch header is needed here (the
// torch headers cost the first import most of its compile time). It knows no kernel family: a Launch carries the
// family's index, its template arguments and the name the errors use (muse/families.py instance_label).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "args.h"

int muse_launch(int family, const int* t, int n, const GemvArgs& a, bool pdl, cudaStream_t st);
int muse_attrs(int family, const int* t, int n, int* res);
int unpackz_launch(const void* w, const void* zbase, void* out, int N, int K, cudaStream_t st);

namespace py = pybind11;

static void check_rc(int rc, const std::string& what) {
  if (rc == -1) throw std::runtime_error(what + " is not compiled in (add its table row and run build.py)");
  if (rc) throw std::runtime_error(what + ": CUDA error " + cudaGetErrorString((cudaError_t)rc));
}

// One planned launch of a layer at one m: the kernel (family + template arguments), the layer's weights and split-K
// buffers, the config's runtime fields. prepare builds it once; a call supplies x, out, the tokens and the stream.
struct Launch {
  int family;
  std::vector<int> t;
  std::string what;
  GemvArgs a;

  void call(uintptr_t x, uintptr_t out, int M, uintptr_t stream, bool pdl) const {
    GemvArgs b = a;
    b.x = reinterpret_cast<const void*>(x);
    b.out = reinterpret_cast<void*>(out);
    b.M = M;
    const int rc = muse_launch(family, t.data(), (int)t.size(), b, pdl, reinterpret_cast<cudaStream_t>(stream));
    if (rc) check_rc(rc, what);
  }
};

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // module_local: every variant build (tools, tests) defines its own Launch; pybind11 would refuse a second global one
  py::class_<Launch>(m, "Launch", py::module_local(), "one planned launch: Launch(...)(x_ptr, out_ptr, M, stream, pdl)")
      .def(py::init([](int family, std::vector<int> t, std::string what, uintptr_t w, uintptr_t w2, uintptr_t eptr,
                       uintptr_t esc, uintptr_t zbase, uintptr_t ws, uintptr_t sem, int N, int K, std::vector<int> rt) {
             if (t.size() > 8) throw std::invalid_argument("Launch: " + what + ": more than 8 template arguments");
             if ((int)rt.size() != kRuntimeFields)
               throw std::invalid_argument("Launch: " + what + ": " + std::to_string(rt.size()) + " runtime fields, " +
                                           "this build has " + std::to_string(kRuntimeFields));
             GemvArgs a{};
             a.w = reinterpret_cast<const void*>(w);
             a.w2 = reinterpret_cast<const void*>(w2);
             a.eptr = reinterpret_cast<const void*>(eptr);
             a.esc = reinterpret_cast<const void*>(esc);
             a.zbase = reinterpret_cast<const void*>(zbase);
             a.ws = reinterpret_cast<void*>(ws);
             a.sem = reinterpret_cast<void*>(sem);
             a.N = N, a.K = K;
             set_runtime(a, rt.data());
             return Launch{family, std::move(t), std::move(what), a};
           }),
           py::arg("family"), py::arg("t"), py::arg("what"), py::arg("w"), py::arg("w2"), py::arg("eptr"),
           py::arg("esc"), py::arg("zbase"), py::arg("ws"), py::arg("sem"), py::arg("N"), py::arg("K"), py::arg("rt"))
      .def("__call__", &Launch::call, py::arg("x"), py::arg("out"), py::arg("M"), py::arg("stream"), py::arg("pdl"))
      .def_readonly("family", &Launch::family)
      .def_readonly("t", &Launch::t);
  m.def("attrs", [](int family, std::vector<int> t) -> std::vector<int> {
    int res[4] = {0, 0, 0, 0};
    const int rc = muse_attrs(family, t.data(), (int)t.size(), res);
    if (rc == -1) return {};
    check_rc(rc, "attrs of family " + std::to_string(family));
    return {res[0], res[1], res[2], res[3]};
  }, "registers / spill bytes / static smem / max threads of a compiled instantiation; [] if it is not compiled in");
  m.def("unpackz", [](uintptr_t w, uintptr_t zbase, uintptr_t out, int N, int K, uintptr_t stream) {
    const int rc = unpackz_launch(reinterpret_cast<const void*>(w), reinterpret_cast<const void*>(zbase),
                                  reinterpret_cast<void*>(out), N, K, reinterpret_cast<cudaStream_t>(stream));
    if (rc) check_rc(rc, "unpackz");
  }, "decode a 12-bit stream to bf16 [N, K] (prepare's check)");
}
