// Products of sizes that cannot wrap: the adapters form every product of dims through this before
// any of them reaches the math. Knows nothing about LSTMs.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

namespace ortlstm {

// The product of `factors` (non-negative), or nullopt when it would exceed `limit` or a factor is
// negative. Each partial product is checked before it is formed. A zero factor makes the product
// 0 whatever the others; otherwise the partial products only grow, so the answer does not depend
// on the order of the factors. A caller that needs each factor bounded too must check it on its own.
template <typename Factors>
std::optional<int64_t> CheckedProduct(const Factors& factors, int64_t limit = std::numeric_limits<int64_t>::max()) {
  for (const int64_t factor : factors) {
    if (factor < 0) return std::nullopt;
    if (factor == 0) return 0;
  }
  int64_t product = 1;
  for (const int64_t factor : factors) {
    if (__builtin_mul_overflow(product, factor, &product) || product > limit) return std::nullopt;
  }
  return product;
}

}  // namespace ortlstm
