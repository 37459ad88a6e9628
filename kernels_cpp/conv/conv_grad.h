// ORT-free math of ConvGrad (ops/schema.py CONV_OPS, onnxruntime's com.microsoft ConvGrad): the
// gradients of an ONNX Conv with respect to X, W and B, N-D, any strides, pads, dilations and
// group, float and double. The adapter (ort/conv_ops.cc) has validated every shape and attribute
// and filled ConvDims; this layer only asserts. GEMMs go through common/blas.h, threads through
// the Executor (common/parallel.h).
//
// Memory layout (row-major, contiguous; G = group, Cg = C/G, Mg = M/G, K = prod(kernel), O = prod(out)):
//   X, grad_X   [N, C, in...]       channel c of group g is g*Cg + c
//   W, grad_W   [M, Cg, k...]       read per group as a [Mg, Cg*K] matrix (rows of group g from g*Mg)
//   grad_Y      [N, M, out...]      read per image and group as a [Mg, O] matrix
//   grad_B      [M]
//   columns     [Cg*K, O]           scratch: row c*K + j holds tap j of channel c at every output
//                                   position (im2col), zero where the tap falls into the padding
#pragma once

#include <cstdint>
#include <vector>

#include "common/bf16_gemm.h"
#include "common/parallel.h"
#include "common/scratch.h"

namespace ortlstm::conv {

// Sizes and geometry of one call, computed once by the adapter (pads resolved from auto_pad).
struct ConvDims {
  int64_t batch_size = 0;  // N
  int64_t channels = 0;    // C, X's second axis
  int64_t maps = 0;        // M, W's first axis and grad_Y's second
  int64_t group = 1;       // G, divides C and M
  std::vector<int64_t> input_spatial;   // in..., X's spatial dims
  std::vector<int64_t> output_spatial;  // out..., grad_Y's spatial dims
  std::vector<int64_t> kernel;          // k..., W's spatial dims
  std::vector<int64_t> strides;
  std::vector<int64_t> dilations;
  std::vector<int64_t> pads_begin;  // padding before each spatial axis (the end pads only shape out)

  int SpatialRank() const { return static_cast<int>(input_spatial.size()); }
  int64_t ChannelsPerGroup() const { return channels / group; }
  int64_t MapsPerGroup() const { return maps / group; }
  int64_t InputSize() const;   // prod(in)
  int64_t OutputSize() const;  // O = prod(out)
  int64_t KernelSize() const;  // K = prod(k)
  int64_t ColumnRows() const { return ChannelsPerGroup() * KernelSize(); }
};

// The gradients of Y = conv(X, W) + B; a null output pointer skips that gradient.
//   grad_X = col2im(W_g^T * grad_Y[n, g])            per image and group
//   grad_W = sum_n grad_Y[n, g] * im2col(X[n, g])^T   per group
//   grad_B[m] = sum_{n, o} grad_Y[n, m, o]
// Images are split into executor.Width() fixed parts, each summing its own grad_W in a fixed
// order, then the parts are added in order: results do not depend on scheduling.
// MatmulPrecision::kBfloat16 (T = float only) rounds both GEMMs' operands to bfloat16
// (common/bf16_gemm.h); grad_B's sum does not multiply and stays as it is.
template <typename T>
void ConvGrad(const ConvDims& dims, const T* grad_y, const T* x, const T* w, T* grad_x, T* grad_w, T* grad_b,
              const Executor& executor, const ScratchAllocator& allocator,
              MatmulPrecision precision = MatmulPrecision::kFloat32);

}  // namespace ortlstm::conv
