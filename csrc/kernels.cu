// MUSE BF16 GEMV kernels for sm_90a (an H100 / H200: wgmma is arch-specific). This file and the headers it includes
// are the whole device source: tests compile it with nvcc directly; build.py inlines it (this order, each header
// once) into submission.py's KERNEL_SRC, the string the upload compiles with load_inline.
//   ptx.cuh     one wrapper per PTX instruction
//   common.cuh  x loads, the warps' reduction, split-K combine (ticket / cluster), store, the (empty) instrument hooks
//   gemv.cuh    gemv_kernel: plain BF16 (and the router's fp32 as hi + lo), LOOP 0..2
//   gemvz.cuh   the 12-bit format (decz), gemvz_kernel with its exception warp, unpackz_kernel
//   gemvt.cuh   gemvt_kernel: TMA ring + warpgroup MMA (GemvtConfig)
//   gemvtz.cuh  gemvtz_kernel: the 12-bit stream in a TMA ring, decoded into registers, warpgroup MMA (GemvtzConfig)
//   launch.cuh  launch_pdl, opt-ins, TMA descriptors, launchers, the kernel table (configs.cuh, generated) inside
// csrc/instruments.cuh (trace and timing-only hooks) is not part of it: tools and tests put it in front of a variant.
#include "launch.cuh"
