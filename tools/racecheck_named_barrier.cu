// Does compute-sanitizer's racecheck understand gemvz's go barrier? (session 14, FINDINGS.md)
// gemvz at NB >= 2: the streaming warps `bar.arrive 1` after their first trip, the exception warp `bar.sync 1`, then
// writes ecorr; everyone meets at __syncthreads (barrier 0) before ecorr is read. Racecheck reported hazards between
// those writes and reads. This reduces the pattern to two warps:
//   mode 0: no named barrier (control: racecheck should be silent)
//   mode 1: gemvz's pattern (correct by the PTX barrier rules: racecheck should be silent)
//   mode 2: the read before the barrier (a real race: racecheck must report it)
//   mode 3: mode 1 with the arrive as gemvz compiles it: a predicated BAR.ARV inside the trip loop, executed (with its
//           predicate false) on every trip after the first
//   mode 4: mode 1 with the arrive 20 us late, so the syncing warp waits first (in gemvz the exception warp reaches
//           its sync right after the wait, the streaming warps arrive after their first trip)
// usage: nvcc -arch=sm_90 -o rnb tools/racecheck_named_barrier.cu && for m in 0 1 2 3 4; do
//          compute-sanitizer --tool racecheck ./rnb $m; done
#include <cstdio>
#include <cstdlib>

__global__ void pattern(float* out, int mode) {
  __shared__ float s[32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float v = 0.f;
  if (warp == 1) {
    if (mode == 1 || mode == 3 || mode == 4) asm volatile("bar.sync 1, 64;" ::: "memory");
    s[lane] = 2.f * lane;  // the exception warp's ecorr
  } else {
    if (mode == 1) asm volatile("bar.arrive 1, 64;" ::: "memory");
    if (mode == 4) {
      for (int i = 0; i < 20; i++) __nanosleep(1000);
      asm volatile("bar.arrive 1, 64;" ::: "memory");
    }
    if (mode == 3)
#pragma unroll 1
      for (int i = 0; i < 4; i++) {
        v += __shfl_xor_sync(0xffffffffu, v + i, 1);  // a trip's work
        asm volatile("{\n.reg .pred q;\nsetp.eq.s32 q, %0, 0;\n@q bar.arrive 1, 64;\n}" ::"r"(i) : "memory");
      }
    if (mode == 2) v = s[lane];  // read with no barrier in between
  }
  __syncthreads();
  if (warp == 0 && mode != 2) v = s[lane];
  if (warp == 0) out[lane] = v;
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 1;
  float* d;
  cudaMalloc(&d, 32 * sizeof(float));
  pattern<<<1, 64>>>(d, mode);
  float h[32];
  cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  printf("mode %d: out[5] = %g (%s)\n", mode, h[5], cudaGetErrorString(cudaGetLastError()));
  cudaFree(d);
  return 0;
}
