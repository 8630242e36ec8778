#include "keel/common/time.h"

#include <chrono>
#include <cstdio>
#include <ctime>

namespace keel {

Millis NowMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string FormatRfc3339(Millis ms) {
  time_t secs = static_cast<time_t>(ms / 1000);
  int frac = static_cast<int>(ms % 1000);
  if (frac < 0) {
    frac += 1000;
    --secs;
  }
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[80];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, frac);
  return buf;
}

std::optional<Millis> ParseRfc3339(const std::string& s) {
  int y, mo, d, h, mi, sec;
  int n = 0;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d%n", &y, &mo, &d, &h, &mi, &sec, &n) != 6 ||
      n != 19) {
    return std::nullopt;
  }
  if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60) return std::nullopt;
  size_t i = 19;
  int ms = 0;
  if (i < s.size() && s[i] == '.') {
    ++i;
    int digits = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (digits < 3) ms = ms * 10 + (s[i] - '0');
      ++digits;
      ++i;
    }
    if (digits == 0) return std::nullopt;
    for (; digits < 3; ++digits) ms *= 10;
  }
  int offset_min = 0;
  if (i < s.size() && (s[i] == 'Z' || s[i] == 'z')) {
    ++i;
  } else if (i < s.size() && (s[i] == '+' || s[i] == '-')) {
    // Exactly HH:MM of digits (sscanf's %2d would take "-5" or " 5"), within -23:59..+23:59.
    auto digit = [&](size_t at) { return at < s.size() && s[at] >= '0' && s[at] <= '9'; };
    if (!digit(i + 1) || !digit(i + 2) || i + 3 >= s.size() || s[i + 3] != ':' || !digit(i + 4) ||
        !digit(i + 5)) {
      return std::nullopt;
    }
    int oh = (s[i + 1] - '0') * 10 + (s[i + 2] - '0');
    int om = (s[i + 4] - '0') * 10 + (s[i + 5] - '0');
    if (oh > 23 || om > 59) return std::nullopt;
    offset_min = (oh * 60 + om) * (s[i] == '-' ? -1 : 1);
    i += 6;
  } else {
    return std::nullopt;
  }
  if (i != s.size()) return std::nullopt;
  std::tm tm{};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  Millis secs = static_cast<Millis>(timegm(&tm));
  return (secs - offset_min * 60) * 1000 + ms;
}

}  // namespace keel
