// What the work splits of lstm/lstm_math.h need to know of the CPU, read at run time: one core's
// L2 cache size and the vector width. Knows nothing of the LSTM; reads the system's description
// of the CPU only (no vendor or model tables).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

namespace ortlstm {

// Bytes of L2 cache per core: sysconf(_SC_LEVEL2_CACHE_SIZE) where the C library knows it, else
// Linux's /sys/devices/system/cpu/cpu0/cache/index*/ (the level-2 data or unified cache), else
// 2 MiB, the size the splits were first tuned for (an Intel Xeon VM). Read once per process.
inline int64_t L2CacheBytes() {
  static const int64_t bytes = [] {
    constexpr int64_t kDefault = int64_t{2} << 20;
#if defined(_SC_LEVEL2_CACHE_SIZE)
    const long from_libc = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (from_libc > 0) return static_cast<int64_t>(from_libc);
#endif
    for (int index = 0; index < 8; ++index) {
      const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
      std::ifstream level_file(dir + "level");
      std::ifstream type_file(dir + "type");
      std::ifstream size_file(dir + "size");
      int level = 0;
      std::string type;
      std::string size;
      if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size)) continue;
      if (level != 2 || type == "Instruction") continue;
      // "512K", "2048K", "1M"
      std::size_t digits = 0;
      while (digits < size.size() && size[digits] >= '0' && size[digits] <= '9') ++digits;
      if (digits == 0) continue;
      int64_t value = std::stoll(size.substr(0, digits));
      const char unit = digits < size.size() ? size[digits] : 'B';
      if (unit == 'K') value <<= 10;
      if (unit == 'M') value <<= 20;
      if (value > 0) return value;
    }
    return kDefault;
  }();
  return bytes;
}

// Bytes of the widest float vectors the CPU runs: 64 with AVX-512F, 32 with AVX2, else 16.
inline int VectorBytes() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int bytes = __builtin_cpu_supports("avx512f") ? 64 : __builtin_cpu_supports("avx2") ? 32 : 16;
  return bytes;
#else
  return 16;
#endif
}

}  // namespace ortlstm
