// ConvGrad's math: im2col / col2im over N-D grids and one GEMM per image and group for each of
// grad_W and grad_X (layouts: conv/conv_grad.h). Threads: images split into executor.Width()
// parts; BLAS runs single-threaded inside each part's task.
#include "conv/conv_grad.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

#include "common/blas.h"

namespace ortlstm::conv {
namespace {

int64_t Product(const std::vector<int64_t>& values) {
  int64_t product = 1;
  for (const int64_t value : values) product *= value;
  return product;
}

// Where tap j of the kernel reads X, per spatial axis: input coordinate = out * stride + offset,
// offset = tap * dilation - pad_begin. For the last axis, the outputs [first, end) read inside X.
struct Tap {
  std::vector<int64_t> offsets;  // [spatial rank]
  int64_t first = 0;
  int64_t end = 0;
};

Tap TapOf(const ConvDims& dims, int64_t j) {
  const int rank = dims.SpatialRank();
  Tap tap;
  tap.offsets.resize(static_cast<size_t>(rank));
  for (int axis = rank - 1; axis >= 0; --axis) {
    const size_t a = static_cast<size_t>(axis);
    const int64_t index = j % dims.kernel[a];
    j /= dims.kernel[a];
    tap.offsets[a] = index * dims.dilations[a] - dims.pads_begin[a];
  }
  const size_t last = static_cast<size_t>(rank - 1);
  const int64_t offset = tap.offsets[last];
  const int64_t stride = dims.strides[last];
  const int64_t out_w = dims.output_spatial[last];
  const int64_t in_w = dims.input_spatial[last];
  // first: the smallest o with o*s + offset >= 0; end: one past the largest with o*s + offset < in_w.
  const int64_t first = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t end = in_w - 1 - offset < 0 ? 0 : (in_w - 1 - offset) / stride + 1;
  tap.end = std::clamp<int64_t>(end, 0, out_w);
  tap.first = std::clamp<int64_t>(first, 0, tap.end);
  return tap;
}

// Calls visit(out_line, in_line) for every line of the output grid along the last spatial axis:
// out_line is the line's first output position, in_line the offset in X (one channel) of the input
// line tap `tap` reads for it, at input coordinate 0 of the last axis; -1 when an outer axis
// reads the padding (the whole line is zero).
template <typename Visit>
void ForEachLine(const ConvDims& dims, const Tap& tap, Visit&& visit) {
  const int rank = dims.SpatialRank();
  const int64_t out_w = dims.output_spatial[static_cast<size_t>(rank - 1)];
  const int64_t in_w = dims.input_spatial[static_cast<size_t>(rank - 1)];
  const int64_t lines = dims.OutputSize() / out_w;
  std::vector<int64_t> position(static_cast<size_t>(rank > 1 ? rank - 1 : 0), 0);  // outer output coordinates
  for (int64_t line = 0; line < lines; ++line) {
    int64_t in_line = 0;
    bool inside = true;
    for (int axis = 0; axis + 1 < rank; ++axis) {
      const size_t a = static_cast<size_t>(axis);
      const int64_t coordinate = position[a] * dims.strides[a] + tap.offsets[a];
      if (coordinate < 0 || coordinate >= dims.input_spatial[a]) {
        inside = false;
        break;
      }
      in_line = in_line * dims.input_spatial[a] + coordinate;
    }
    visit(line * out_w, inside ? in_line * in_w : -1);
    for (int axis = rank - 2; axis >= 0; --axis) {
      const size_t a = static_cast<size_t>(axis);
      if (++position[a] < dims.output_spatial[a]) break;
      position[a] = 0;
    }
  }
}

// columns [Cg*K, O] = im2col(x [Cg, in...]).
template <typename T>
void Im2Col(const ConvDims& dims, const T* x, T* columns) {
  const int64_t taps = dims.KernelSize();
  const int64_t out_size = dims.OutputSize();
  const int64_t in_size = dims.InputSize();
  const size_t last = static_cast<size_t>(dims.SpatialRank() - 1);
  const int64_t out_w = dims.output_spatial[last];
  const int64_t stride = dims.strides[last];
  for (int64_t j = 0; j < taps; ++j) {
    const Tap tap = TapOf(dims, j);
    const int64_t offset = tap.offsets[last];
    for (int64_t c = 0; c < dims.ChannelsPerGroup(); ++c) {
      const T* channel = x + c * in_size;
      T* row = columns + (c * taps + j) * out_size;
      ForEachLine(dims, tap, [&](int64_t out_line, int64_t in_line) {
        T* out = row + out_line;
        if (in_line < 0) {
          std::fill(out, out + out_w, T(0));
          return;
        }
        std::fill(out, out + tap.first, T(0));
        const int64_t base = in_line + offset;  // output o reads channel[base + o * stride], o in [first, end)
        if (stride == 1) {
          std::copy(channel + base + tap.first, channel + base + tap.end, out + tap.first);
        } else {
          for (int64_t o = tap.first; o < tap.end; ++o) out[o] = channel[base + o * stride];
        }
        std::fill(out + tap.end, out + out_w, T(0));
      });
    }
  }
}

// grad_x [Cg, in...] = col2im(columns [Cg*K, O]): each column entry added to the input element
// its tap read; grad_x is overwritten. Channels, then taps, then positions, in order.
template <typename T>
void Col2Im(const ConvDims& dims, const T* columns, T* grad_x) {
  const int64_t taps = dims.KernelSize();
  const int64_t out_size = dims.OutputSize();
  const int64_t in_size = dims.InputSize();
  const size_t last = static_cast<size_t>(dims.SpatialRank() - 1);
  const int64_t stride = dims.strides[last];
  std::vector<Tap> tap_of(static_cast<size_t>(taps));
  for (int64_t j = 0; j < taps; ++j) tap_of[static_cast<size_t>(j)] = TapOf(dims, j);
  std::fill(grad_x, grad_x + dims.ChannelsPerGroup() * in_size, T(0));
  for (int64_t c = 0; c < dims.ChannelsPerGroup(); ++c) {
    T* channel = grad_x + c * in_size;
    for (int64_t j = 0; j < taps; ++j) {
      const Tap& tap = tap_of[static_cast<size_t>(j)];
      const int64_t offset = tap.offsets[last];
      const T* row = columns + (c * taps + j) * out_size;
      ForEachLine(dims, tap, [&](int64_t out_line, int64_t in_line) {
        if (in_line < 0) return;
        const T* out = row + out_line;
        const int64_t base = in_line + offset;  // output o came from channel[base + o * stride], o in [first, end)
        if (stride == 1) {
          T* in = channel + base + tap.first;
          for (int64_t o = tap.first; o < tap.end; ++o) in[o - tap.first] += out[o];
        } else {
          for (int64_t o = tap.first; o < tap.end; ++o) channel[base + o * stride] += out[o];
        }
      });
    }
  }
}

}  // namespace

int64_t ConvDims::InputSize() const { return Product(input_spatial); }
int64_t ConvDims::OutputSize() const { return Product(output_spatial); }
int64_t ConvDims::KernelSize() const { return Product(kernel); }

// Gemm of common/blas.h, or with matmul_precision="bfloat16" (float only: the adapter refuses
// double) the same GEMM on operands rounded to bfloat16, accumulated in float32.
template <typename T>
void ConvGemm(MatmulPrecision precision, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const T* a,
              int64_t lda, const T* b, int64_t ldb, T beta, T* c, int64_t ldc) {
  if constexpr (std::is_same_v<T, float>) {
    if (precision == MatmulPrecision::kBfloat16) {
      GemmRoundedBf16(trans_a, trans_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
      return;
    }
  }
  Gemm(trans_a, trans_b, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
}

template <typename T>
void ConvGrad(const ConvDims& dims, const T* grad_y, const T* x, const T* w, T* grad_x, T* grad_w, T* grad_b,
              const Executor& executor, const ScratchAllocator& allocator, MatmulPrecision precision) {
  const int64_t group = dims.group;
  const int64_t per_group = dims.ChannelsPerGroup();  // Cg
  const int64_t maps_per_group = dims.MapsPerGroup();  // Mg
  const int64_t rows = dims.ColumnRows();             // Cg*K
  const int64_t out_size = dims.OutputSize();         // O
  const int64_t in_size = dims.InputSize();
  const int64_t w_size = dims.maps * rows;            // [M, Cg*K]

  if (grad_b != nullptr) {
    // grad_B[m] = sum_n sum_o grad_Y[n, m, o], accumulated in double in a fixed order: kLanes
    // running sums (position o goes to lane o % kLanes, which the compiler keeps in vector
    // registers), added up at the end.
    constexpr int64_t kLanes = 8;
    const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(dims.maps, executor.Width()));
    executor.For(static_cast<size_t>(parts), [&](size_t part) {
      const Range range = SplitRange(dims.maps, parts, static_cast<int64_t>(part));
      for (int64_t m = range.begin; m < range.end; ++m) {
        double lanes[kLanes] = {};
        for (int64_t n = 0; n < dims.batch_size; ++n) {
          const T* map = grad_y + (n * dims.maps + m) * out_size;
          const int64_t whole = out_size - out_size % kLanes;
          for (int64_t o = 0; o < whole; o += kLanes) {
            for (int64_t lane = 0; lane < kLanes; ++lane) lanes[lane] += static_cast<double>(map[o + lane]);
          }
          for (int64_t o = whole; o < out_size; ++o) lanes[o - whole] += static_cast<double>(map[o]);
        }
        double sum = 0.0;
        for (const double lane : lanes) sum += lane;
        grad_b[m] = static_cast<T>(sum);
      }
    });
  }
  if (grad_x == nullptr && grad_w == nullptr) return;
  if (dims.batch_size == 0 || out_size == 0 || rows == 0 || maps_per_group == 0) {
    // No product to form: every gradient element is an empty sum.
    if (grad_w != nullptr) std::fill(grad_w, grad_w + w_size, T(0));
    if (grad_x != nullptr) std::fill(grad_x, grad_x + dims.batch_size * dims.channels * in_size, T(0));
    return;
  }

  const int64_t parts = std::min<int64_t>(dims.batch_size, std::max(1, executor.Width()));
  Scratch<T> columns(allocator, parts * rows * out_size);  // [parts][Cg*K, O]
  // [parts][G][Cg*K, Mg]: grad_W transposed, summed over each part's images. The GEMM of this
  // shape ran a quarter faster than the one of grad_W's own [Mg, Cg*K] (oneMKL, M=64, K=1024).
  Scratch<T> partial_w(allocator, grad_w != nullptr ? parts * w_size : 0);
  executor.For(static_cast<size_t>(parts), [&](size_t part_index) {
    const int64_t part = static_cast<int64_t>(part_index);
    const Range images = SplitRange(dims.batch_size, parts, part);
    T* cols = columns.get() + part * rows * out_size;
    T* part_w = grad_w == nullptr ? nullptr : partial_w.get() + part * w_size;
    for (int64_t n = images.begin; n < images.end; ++n) {
      for (int64_t g = 0; g < group; ++g) {
        const T* dy = grad_y + (n * dims.maps + g * maps_per_group) * out_size;  // [Mg, O]
        const T* x_g = x + (n * dims.channels + g * per_group) * in_size;          // [Cg, in...]
        if (part_w != nullptr) {
          // grad_W_g^T [Cg*K, Mg] (+)= columns [Cg*K, O] * grad_Y[n, g]^T [O, Mg]: M=Cg*K, N=Mg, K=O, B transposed.
          Im2Col(dims, x_g, cols);
          const T beta = n == images.begin ? T(0) : T(1);
          ConvGemm(precision, false, true, rows, maps_per_group, out_size, cols, out_size, dy, out_size, beta,
                   part_w + g * rows * maps_per_group, maps_per_group);
        }
        if (grad_x != nullptr) {
          // columns [Cg*K, O] = W_g^T [Cg*K, Mg] * grad_Y[n, g] [Mg, O]: M=Cg*K, N=O, K=Mg, A transposed.
          ConvGemm(precision, true, false, rows, out_size, maps_per_group, w + g * maps_per_group * rows, rows, dy,
                   out_size, T(0), cols, out_size);
          Col2Im(dims, cols, grad_x + (n * dims.channels + g * per_group) * in_size);
        }
      }
    }
  });
  if (grad_w != nullptr) {
    // grad_W[g, m, r] = sum over parts, in part order, of partial_w[part, g, r, m]; rows of grad_W split into chunks.
    const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(dims.maps, executor.Width()));
    executor.For(static_cast<size_t>(chunks), [&](size_t chunk) {
      const Range range = SplitRange(dims.maps, chunks, static_cast<int64_t>(chunk));
      for (int64_t map = range.begin; map < range.end; ++map) {
        const int64_t g = map / maps_per_group;
        const int64_t m = map % maps_per_group;
        T* out = grad_w + map * rows;
        const T* first = partial_w.get() + g * rows * maps_per_group + m;  // part 0; element r at [r * Mg]
        for (int64_t r = 0; r < rows; ++r) out[r] = first[r * maps_per_group];
        for (int64_t part = 1; part < parts; ++part) {
          const T* source = first + part * w_size;
          for (int64_t r = 0; r < rows; ++r) out[r] += source[r * maps_per_group];
        }
      }
    });
  }
}

template void ConvGrad<float>(const ConvDims&, const float*, const float*, const float*, float*, float*, float*,
                              const Executor&, const ScratchAllocator&, MatmulPrecision);
template void ConvGrad<double>(const ConvDims&, const double*, const double*, const double*, double*, double*, double*,
                               const Executor&, const ScratchAllocator&, MatmulPrecision);

}  // namespace ortlstm::conv
