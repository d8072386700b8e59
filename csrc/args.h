// args.h: what one launch hands its kernel besides the template parameters: one struct for the three kernel families,
// shared by the device source and the Python glue (bind.cpp), so a new field is written here and filled in bind.cpp.
// Plain C++ (pointers as void*): the glue is compiled by the host compiler without CUDA's headers.
#pragma once
#include <stdint.h>

struct GemvArgs {
  const void* x;     // bf16 [M, K] row-major, 16-byte aligned (gemvt: the pointer of its TMA descriptor)
  const void* w;     // the layer's weight as the kernel reads it: pack_plain (gemv), pack_z's stream (gemvz), pack_tma's
                     // tiles (gemvt)
  const void* w2;    // gemv with DUAL: the router's lo half, packed like w; else unused
  void* out;         // [M, N]: bf16, fp32 for DUAL
  void* ws;          // float4 split-K partials (cl = 0 and S > 1)
  void* sem;         // int32 split-K tickets (cl = 0 and S > 1), zero between calls: every call leaves them so
  int M, N, K;       // tokens, rows, columns
  int S;             // CTAs per row group (split-K)
  int pf;            // gemv / gemvz: 1 = L2 prefetch of each warp's slice before griddepcontrol.wait
  int cl;            // split-K reduction: 0 global ticket, 1 cluster barrier, 2 cluster mbarrier (st.async)
  const void* eptr;  // gemvz: the side table's row offsets, int32 [N + 1]; else unused
  const void* esc;   // gemvz: the side table's entries, int2 {k, fp32 bits of the correction}; else unused
  const void* zbase; // gemvz: each row's window, uint8 [N]: row r's 8 classes are zbase[r] .. zbase[r] + 7
};
// The order is gemv_kernel's parameter list before the struct (x .. cl). The kernels take it as a __grid_constant__
// parameter: read in place from the parameter space. Taken by plain value, the router's m = 32 kernel (gemv 8, 1, 4,
// 1, DUAL, PIPE 4) went from 120 to 136 registers, one CTA an SM instead of two, and 5.3 -> 7.5 us with its clusters
// of 8 in two waves (device call 1 of session 16, FINDINGS.md "House"); with __grid_constant__ its code is
// byte-identical to the positional parameters' again, and no kernel changed its register allocation granule.
