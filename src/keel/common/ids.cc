#include "keel/common/ids.h"

#include <openssl/rand.h>

#include <chrono>
#include <cstdint>
#include <mutex>

namespace keel {

std::string NewId() {
  // 48-bit millisecond timestamp, then a 74-bit counter seeded randomly each millisecond; the
  // counter keeps ids monotonic within one millisecond (RFC 9562, method 2).
  static std::mutex mu;
  static uint64_t last_ms = 0;
  static uint64_t counter_hi = 0;  // 12 bits (rand_a)
  static uint64_t counter_lo = 0;  // 62 bits (rand_b)
  uint64_t ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                    std::chrono::system_clock::now().time_since_epoch())
                    .count();
  uint64_t a, b;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (ms > last_ms) {
      last_ms = ms;
      unsigned char r[10];
      RAND_bytes(r, sizeof r);
      counter_hi = ((uint64_t(r[0]) << 8) | r[1]) & 0x3ff;  // leave headroom in rand_a
      counter_lo = 0;
      for (int i = 2; i < 10; ++i) counter_lo = (counter_lo << 8) | r[i];
      counter_lo &= (uint64_t(1) << 61) - 1;
    } else {
      ms = last_ms;  // clock went back or same ms: keep ordering
      if (++counter_lo >= (uint64_t(1) << 62)) {
        counter_lo = 0;
        ++counter_hi;
      }
    }
    a = counter_hi & 0xfff;
    b = counter_lo;
  }
  // 8-4-4-4-12 hex digits: the 48-bit time, version 7 with rand_a, variant with rand_b.
  // Formatted by hand: snprintf was a visible share of every write unit (several ids each).
  std::string out(36, '-');
  auto hex = [&out](size_t at, uint64_t v, int digits) {
    static constexpr char kDigits[] = "0123456789abcdef";
    for (int i = digits - 1; i >= 0; --i, v >>= 4) out[at + i] = kDigits[v & 0xf];
  };
  hex(0, ms >> 16, 8);
  hex(9, ms & 0xffff, 4);
  hex(14, 0x7000 | a, 4);
  hex(19, 0x8000 | ((b >> 48) & 0x3fff), 4);
  hex(24, b & 0xffffffffffffULL, 12);
  return out;
}

bool IsUuid(const std::string& s) {
  if (s.size() != 36) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
    } else if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

}  // namespace keel
