// Activation loops over float arrays, compiled for AVX-512, AVX2 and baseline x86-64 and picked at
// load time (GCC function multi-versioning), so one wheel runs everywhere and uses the widest
// vectors the CPU has. Each element goes through the same operations as the scalar
// FastSigmoid/FastTanh, so results are bit-identical across the versions and the scalar path.
//
// The short loops of the recurrent cells' steps and of the backward driver run here too, for float
// and double: GCC builds the kernels for baseline x86-64, where a cell's loops over a block of 64
// units were SSE (4 floats at a time); with blocks of units, GRU B1's backward pass (the cell and
// the dB sums) took about 0.5 us of a 1.5 us step per task on the AMD Zen 4. Plain additions and
// products, compiled without contraction like the rest: every version gives the same bits.
#pragma once

#include <cstdint>

// target_clones needs an ELF platform with ifunc (glibc); elsewhere the loops are built once for
// the baseline: on aarch64 that has NEON (armv8-a), which the compiler vectorises them for
// (scripts/build_wheels.sh checks the disassembly).
#if defined(__x86_64__) && defined(__GNUC__) && defined(__ELF__) && !defined(__clang__)
#define ORTLSTM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define ORTLSTM_VECTOR_CLONES
#endif

namespace ortlstm {

void SigmoidInPlace(float* x, int64_t n);
void TanhInPlace(float* x, int64_t n);
// out[i] = 1 - tanh(x[i])^2
void TanhDerivatives(const float* x, float* out, int64_t n);

// to[i] += from[i]
void AddInto(const float* from, float* to, int64_t n);
void AddInto(const double* from, double* to, int64_t n);
// The derivatives from the outputs y: sigmoid' = y (1 - y), tanh' = 1 - y^2.
void SigmoidDerivativesFromOutputs(const float* y, float* out, int64_t n);
void SigmoidDerivativesFromOutputs(const double* y, double* out, int64_t n);
void TanhDerivativesFromOutputs(const float* y, float* out, int64_t n);
void TanhDerivativesFromOutputs(const double* y, double* out, int64_t n);

}  // namespace ortlstm
