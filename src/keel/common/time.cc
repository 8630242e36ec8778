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
  // The civil calendar by arithmetic (std::chrono's days to year/month/day): a few of these go
  // into every API answer and event, and gmtime_r with snprintf cost about 4,000 instructions.
  using namespace std::chrono;
  const sys_time<milliseconds> t{milliseconds(ms)};
  const sys_days day = floor<days>(t);
  const year_month_day ymd{day};
  const int y = static_cast<int>(ymd.year());
  if (y < 0 || y > 9999) {  // not four digits: as printf spells it
    std::time_t secs = static_cast<std::time_t>(floor<seconds>(t).time_since_epoch().count());
    std::tm tm{};
    gmtime_r(&secs, &tm);
    char buf[80];
    std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                  tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                  static_cast<int>((t - floor<seconds>(t)).count()));
    return buf;
  }
  const int64_t in_day = (t - day).count();  // milliseconds, 0 to 86,399,999
  std::string out = "0000-00-00T00:00:00.000Z";
  auto put = [&out](size_t at, int64_t v, int width) {
    for (int i = width - 1; i >= 0; --i, v /= 10) out[at + i] = static_cast<char>('0' + v % 10);
  };
  put(0, y, 4);
  put(5, static_cast<unsigned>(ymd.month()), 2);
  put(8, static_cast<unsigned>(ymd.day()), 2);
  put(11, in_day / 3600000, 2);
  put(14, in_day / 60000 % 60, 2);
  put(17, in_day / 1000 % 60, 2);
  put(20, in_day % 1000, 3);
  return out;
}

std::optional<Millis> ParseRfc3339(const std::string& s) {
  // Exactly YYYY-MM-DDTHH:MM:SS of digits (sscanf's %d would take signs and spaces), a day
  // that its month has (mktime would roll 2026-02-31 into March) and a leap second at most.
  auto digits = [&](size_t at, size_t count) -> int {
    int v = 0;
    for (size_t k = at; k < at + count; ++k) {
      if (k >= s.size() || s[k] < '0' || s[k] > '9') return -1;
      v = v * 10 + (s[k] - '0');
    }
    return v;
  };
  const int y = digits(0, 4), mo = digits(5, 2), d = digits(8, 2), h = digits(11, 2),
            mi = digits(14, 2), sec = digits(17, 2);
  if (y < 0 || mo < 0 || d < 0 || h < 0 || mi < 0 || sec < 0 || s[4] != '-' || s[7] != '-' ||
      (s[10] != 'T' && s[10] != 't') || s[13] != ':' || s[16] != ':') {
    return std::nullopt;
  }
  static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
  if (mo < 1 || mo > 12 || d < 1 || d > kDays[mo - 1] + (mo == 2 && leap ? 1 : 0) || h > 23 ||
      mi > 59 || sec > 60) {
    return std::nullopt;
  }
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
