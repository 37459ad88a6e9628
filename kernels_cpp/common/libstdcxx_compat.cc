// The library's one use of a libstdc++ newer than GCC 8's, defined here so that the binary wheels run
// on the systems manylinux_2_28..2_33 describe (Debian 11, Ubuntu 20.04 on Jetson boards, Amazon Linux 2023).
// GCC 11 and later emit calls to std::__throw_bad_array_new_length for the size check of new[] and
// std::allocator; libstdc++ exports it only from GLIBCXX_3.4.29 (GCC 11) on, and with it alone the
// wheel asked for a GCC 11 libstdc++ (auditwheel: manylinux_2_34). This copy does what libstdc++'s
// does (throws std::bad_array_new_length); the version script (cmake/ortlstm_ops.map) makes it local,
// so the library's calls bind here at link time and the process's libstdc++ is never asked for it.
// (Linking libstdc++ statically instead drags in Debian's libstdc++.a and its glibc 2.36 symbols.)
#include <new>

#if defined(__GLIBCXX__) && defined(__GNUC__) && __GNUC__ >= 11
#include <bits/functexcept.h>  // libstdc++'s own declaration (noreturn, default visibility)

namespace std {
void __throw_bad_array_new_length() { throw bad_array_new_length(); }
}  // namespace std
#endif
