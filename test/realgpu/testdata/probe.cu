// probe reports what a CUDA program sees of its GPU: the SM count, the free
// and total memory, and whether an allocation of argv[1] bytes succeeds. It
// keeps that allocation for argv[2] milliseconds, so several probes can hold
// memory at once. One JSON object on stdout. With argv[3] "fault" it instead
// runs a kernel that writes to an unmapped address: an application fault
// (an XID the driver reports, which must not make the GPU unhealthy).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__global__ void fault(int* p) { *p = 1; }

int main(int argc, char** argv) {
  if (argc > 3 && strcmp(argv[3], "fault") == 0) {
    fault<<<1, 1>>>((int*)0x10);
    cudaError_t e = cudaDeviceSynchronize();
    printf("{\"fault\":\"%s\"}\n", cudaGetErrorString(e));
    return 0;
  }
  size_t want = argc > 1 ? strtoull(argv[1], 0, 10) : 0;
  long holdMs = argc > 2 ? atol(argv[2]) : 0;
  cudaDeviceProp p;
  cudaError_t e = cudaGetDeviceProperties(&p, 0);
  if (e != cudaSuccess) {
    printf("{\"error\":\"%s\"}\n", cudaGetErrorString(e));
    return 1;
  }
  size_t freeB = 0, totalB = 0;
  cudaMemGetInfo(&freeB, &totalB);
  void* ptr = 0;
  cudaError_t ae = want ? cudaMalloc(&ptr, want) : cudaSuccess;
  printf("{\"sms\":%d,\"free\":%zu,\"total\":%zu,\"alloc\":\"%s\"}\n", p.multiProcessorCount, freeB,
         totalB, cudaGetErrorString(ae));
  fflush(stdout);
  if (holdMs > 0) usleep(holdMs * 1000);
  return 0;
}
