#pragma once
/// \file
/// `enter_user_code`: leaves the x86 vector state clean before nerve calls code it did
/// not compile (a user's layer, hook, loss or callback).
///
/// nerve's libraries are built with `-march=${NERVE_ARCH}` (native by default: AVX2 or
/// AVX-512), while a user's code may be built with the compiler's defaults (SSE only).
/// When the upper halves of the vector registers are left in use, every legacy SSE
/// instruction in the callee pays a transition (a merge with the dirty upper state on
/// recent Intel parts, a save and restore of it on older ones), and a pointwise loop runs
/// several times slower. `vzeroupper` clears that state in about a cycle, so the call
/// sites where control passes into user code issue it; nerve's own code, compiled with
/// the same flags throughout, needs none. Internal: included by nerve's `.cpp` files only.

#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX__)
#include <immintrin.h>
#endif

namespace nerve::layers::detail {

/// Clears the upper vector state (`vzeroupper`) when nerve is built with AVX on x86;
/// nothing otherwise. Any thread. Internal linkage and always inlined: a translation
/// unit built without AVX (which may include this header) never lends the library an
/// empty copy.
[[gnu::always_inline]] static inline void enter_user_code() noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__AVX__)
  _mm256_zeroupper();
#endif
}

}  // namespace nerve::layers::detail
