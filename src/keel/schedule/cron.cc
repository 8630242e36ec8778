#include "keel/schedule/cron.h"

#include <date/tz.h>

#include <array>
#include <cctype>
#include <chrono>
#include <vector>

namespace keel::schedule {

namespace {

constexpr size_t kMaxExpressionBytes = 200;
constexpr size_t kMaxZoneNameBytes = 64;

struct Field {
  const char* name;
  unsigned min;
  unsigned max;
  const char* const* names;  // names[i] is value min + i; nullptr when the field has none
  unsigned name_count;
};

constexpr const char* kMonthNames[] = {"JAN", "FEB", "MAR", "APR", "MAY", "JUN",
                                       "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"};
constexpr const char* kWeekdayNames[] = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"};

constexpr std::array<Field, 5> kFields = {{{"minute", 0, 59, nullptr, 0},
                                           {"hour", 0, 23, nullptr, 0},
                                           {"day-of-month", 1, 31, nullptr, 0},
                                           {"month", 1, 12, kMonthNames, 12},
                                           {"day-of-week", 0, 7, kWeekdayNames, 7}}};

struct Macro {
  const char* name;
  const char* expansion;
};
constexpr Macro kMacros[] = {{"@yearly", "0 0 1 1 *"},  {"@annually", "0 0 1 1 *"},
                             {"@monthly", "0 0 1 * *"}, {"@weekly", "0 0 * * 0"},
                             {"@daily", "0 0 * * *"},   {"@midnight", "0 0 * * *"},
                             {"@hourly", "0 * * * *"}};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Printable for an error message: control bytes and non-ASCII as '?', at most 40 bytes.
std::string Shown(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 40)) {
    unsigned char u = static_cast<unsigned char>(c);
    out += (u < 0x20 || u >= 0x7f) ? '?' : c;
  }
  if (s.size() > 40) out += "...";
  return out;
}

class FieldParser {
 public:
  FieldParser(const Field& f, std::string_view expr) : f_(f), expr_(expr) {}

  Result<uint64_t> Parse(std::string_view text) {
    uint64_t bits = 0;
    size_t start = 0;
    while (true) {
      size_t comma = text.find(',', start);
      std::string_view item = text.substr(
          start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
      if (item.empty()) return Error("has an empty list item in '" + Shown(text) + "'");
      KEEL_ASSIGN_OR_RETURN(uint64_t more, Item(item));
      bits |= more;
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    return bits;
  }

 private:
  Status Error(const std::string& what) const {
    return InvalidArgument("invalid cron expression \"" + Shown(expr_) + "\": field '" + f_.name +
                           "' " + what);
  }

  Result<uint64_t> Item(std::string_view item) {
    std::string_view base = item;
    std::optional<unsigned> step;
    if (size_t slash = item.find('/'); slash != std::string_view::npos) {
      base = item.substr(0, slash);
      std::string_view s = item.substr(slash + 1);
      KEEL_ASSIGN_OR_RETURN(unsigned n, Number(s, "step"));
      const unsigned span = f_.max - f_.min + 1;
      if (n < 1 || n > span) {
        return Error("step '" + Shown(s) + "' is out of range 1-" + std::to_string(span));
      }
      step = n;
      if (base.empty()) return Error("has a step without a range in '" + Shown(item) + "'");
    }
    unsigned lo = f_.min;
    unsigned hi = f_.max;
    if (base != "*") {
      size_t dash = base.find('-');
      KEEL_ASSIGN_OR_RETURN(lo, Value(base.substr(0, dash)));
      if (dash != std::string_view::npos) {
        std::string_view end = base.substr(dash + 1);
        KEEL_ASSIGN_OR_RETURN(hi, Value(end));
        // SUN is day 0 and day 7: the name ending a range is 7, so MON-SUN is every day and
        // SAT-SUN the weekend. A number is taken as written (1-0 runs backwards).
        if (f_.names == kWeekdayNames && hi == 0 && lo > hi &&
            std::isalpha(static_cast<unsigned char>(end[0]))) {
          hi = 7;
        }
        if (lo > hi) return Error("range '" + Shown(base) + "' runs backwards");
      } else if (!step) {
        hi = lo;
      }
    }
    uint64_t bits = 0;
    for (unsigned v = lo; v <= hi; v += step.value_or(1)) bits |= uint64_t{1} << v;
    return bits;
  }

  Result<unsigned> Value(std::string_view v) {
    if (v.empty()) return Error("has an empty value");
    if (f_.names != nullptr && std::isalpha(static_cast<unsigned char>(v[0]))) {
      std::string upper(v);
      for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      for (unsigned i = 0; i < f_.name_count; ++i) {
        if (upper == f_.names[i]) return f_.min + i;
      }
      return Error("has an unknown name '" + Shown(v) + "'");
    }
    KEEL_ASSIGN_OR_RETURN(unsigned n, Number(v, "value"));
    if (n < f_.min || n > f_.max) {
      return Error("value '" + Shown(v) + "' is out of range " + std::to_string(f_.min) + "-" +
                   std::to_string(f_.max));
    }
    return n;
  }

  Result<unsigned> Number(std::string_view v, const char* what) {
    auto invalid = [&] {
      return Error("has an invalid " + std::string(what) + " '" + Shown(v) + "'");
    };
    if (v.empty() || v.size() > 4) return invalid();
    unsigned n = 0;
    for (char c : v) {
      if (c < '0' || c > '9') return invalid();
      n = n * 10 + static_cast<unsigned>(c - '0');
    }
    return n;
  }

  const Field& f_;
  std::string_view expr_;
};

unsigned DaysInMonth(unsigned month) {  // the most a month ever has (February: 29)
  static constexpr unsigned kDays[] = {0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  return kDays[month];
}

using LocalSeconds = date::local_seconds;

Millis ToMillis(date::sys_seconds t) {
  return static_cast<Millis>(t.time_since_epoch().count()) * 1000;
}

// The DST rule: a local time in a gap fires at the gap's end, an ambiguous one at its first
// occurrence. Monotonic: a later local time never maps to an earlier instant.
Millis LocalToUtc(const date::time_zone& zone, LocalSeconds lt) {
  date::local_info info = zone.get_info(lt);
  if (info.result == date::local_info::nonexistent) return ToMillis(info.second.begin);
  // unique, or ambiguous (first: the offset in force before the clocks fell back)
  return ToMillis(date::sys_seconds{(lt - info.first.offset).time_since_epoch()});
}

const date::time_zone& UtcZone() {
  static const date::time_zone* utc = date::locate_zone("UTC");
  return *utc;
}

}  // namespace

Result<CronExpr> CronExpr::Parse(std::string_view text) {
  if (text.size() > kMaxExpressionBytes) {
    return InvalidArgument("cron expression is longer than " + std::to_string(kMaxExpressionBytes) +
                           " characters");
  }
  std::string_view trimmed = text;
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.front()))) {
    trimmed.remove_prefix(1);
  }
  while (!trimmed.empty() && std::isspace(static_cast<unsigned char>(trimmed.back()))) {
    trimmed.remove_suffix(1);
  }
  std::string_view fields_text = trimmed;
  if (!trimmed.empty() && trimmed.front() == '@') {
    std::string name = Lower(trimmed);
    const Macro* found = nullptr;
    for (const auto& m : kMacros) {
      if (name == m.name) found = &m;
    }
    if (!found) {
      return InvalidArgument("invalid cron expression \"" + Shown(text) +
                             "\": unknown macro (expected @yearly, @annually, @monthly, "
                             "@weekly, @daily, @midnight or @hourly)");
    }
    fields_text = found->expansion;
  }
  std::vector<std::string_view> parts;
  size_t i = 0;
  while (i < fields_text.size()) {
    while (i < fields_text.size() && (fields_text[i] == ' ' || fields_text[i] == '\t')) ++i;
    size_t start = i;
    while (i < fields_text.size() && fields_text[i] != ' ' && fields_text[i] != '\t') ++i;
    if (i > start) parts.push_back(fields_text.substr(start, i - start));
  }
  if (parts.size() != kFields.size()) {
    return InvalidArgument("invalid cron expression \"" + Shown(text) + "\": it has " +
                           std::to_string(parts.size()) +
                           " fields; a cron expression has 5 (minute hour day-of-month month "
                           "day-of-week) or is a macro such as @daily");
  }
  uint64_t bits[5];
  for (size_t f = 0; f < kFields.size(); ++f) {
    FieldParser parser(kFields[f], text);
    KEEL_ASSIGN_OR_RETURN(bits[f], parser.Parse(parts[f]));
  }
  CronExpr c;
  c.text_ = std::string(trimmed);
  c.minutes_ = bits[0];
  c.hours_ = static_cast<uint32_t>(bits[1]);
  c.days_ = static_cast<uint32_t>(bits[2]);
  c.months_ = static_cast<uint16_t>(bits[3]);
  c.weekdays_ = static_cast<uint8_t>((bits[4] | (bits[4] >> 7)) & 0x7f);  // 7 is Sunday too
  c.days_star_ = parts[2].front() == '*';
  c.weekdays_star_ = parts[4].front() == '*';
  if (c.days_star_ || c.weekdays_star_) {
    // Both day fields must match, so some month must have one of the days: every (month, day)
    // falls on every weekday within 400 years.
    bool possible = false;
    for (unsigned m = 1; m <= 12 && !possible; ++m) {
      if (!c.MatchesMonth(m)) continue;
      for (unsigned d = 1; d <= DaysInMonth(m) && !possible; ++d) possible = (c.days_ >> d) & 1;
    }
    if (!possible) {
      return InvalidArgument("invalid cron expression \"" + Shown(text) +
                             "\": it never fires (no month of field 'month' has a day of field "
                             "'day-of-month')");
    }
  }
  return c;
}

bool CronExpr::MatchesDay(unsigned day, unsigned weekday) const {
  bool dom = (days_ >> day) & 1;
  bool dow = (weekdays_ >> weekday) & 1;
  return (days_star_ || weekdays_star_) ? dom && dow : dom || dow;
}

bool CronExpr::Matches(const CivilTime& t) const {
  return MatchesMonth(t.month) && MatchesDay(t.day, t.weekday) && ((hours_ >> t.hour) & 1) &&
         ((minutes_ >> t.minute) & 1);
}

Result<TimeZone> TimeZone::Find(std::string_view name) {
  if (name.empty() || name.size() > kMaxZoneNameBytes) {
    return InvalidArgument("unknown time zone: \"" + Shown(name) +
                           "\" (an IANA name such as Europe/Berlin or UTC)");
  }
  try {
    const date::time_zone* zone = date::locate_zone(name);
    return TimeZone(zone, std::string(name));
  } catch (const std::exception&) {
    return InvalidArgument("unknown time zone: \"" + Shown(name) +
                           "\" (an IANA name such as Europe/Berlin or UTC)");
  }
}

TimeZone TimeZone::Utc() { return TimeZone(&UtcZone(), "UTC"); }

Millis TimeZone::ToUtc(int year, unsigned month, unsigned day, unsigned hour,
                       unsigned minute) const {
  LocalSeconds lt = date::local_days{date::year{year} / date::month{month} / date::day{day}} +
                    std::chrono::hours{hour} + std::chrono::minutes{minute};
  return LocalToUtc(*zone_, lt);
}

CivilTime TimeZone::ToCivil(Millis t) const {
  Millis secs = t >= 0 ? t / 1000 : -((-t + 999) / 1000);
  date::sys_seconds s{std::chrono::seconds{secs}};
  LocalSeconds lt = zone_->to_local(s);
  date::local_days day = date::floor<date::days>(lt);
  date::year_month_day ymd{day};
  auto minutes = std::chrono::duration_cast<std::chrono::minutes>(lt - day).count();
  CivilTime c;
  c.year = static_cast<int>(ymd.year());
  c.month = static_cast<unsigned>(ymd.month());
  c.day = static_cast<unsigned>(ymd.day());
  c.weekday = date::weekday{day}.c_encoding();
  c.hour = static_cast<unsigned>(minutes / 60);
  c.minute = static_cast<unsigned>(minutes % 60);
  return c;
}

std::optional<Millis> NextSlot(const CronExpr& cron, const TimeZone& tz, Millis after) {
  const date::time_zone& zone = *tz.zone_;
  using std::chrono::hours;
  using std::chrono::minutes;
  const CivilTime start = tz.ToCivil(after);
  // Two days early: a local day can begin up to a day and more (a zone that skipped a date)
  // before the UTC instant it is compared with. Days, then hours, whose last minute maps to
  // `after` or before are skipped whole: the mapping is monotonic.
  date::local_days day =
      date::local_days{date::year{start.year} / date::month{start.month} / date::day{start.day}} -
      date::days{2};
  const date::local_days end = day + date::days{146100};  // 400 years: every date's weekdays
  while (day < end) {
    date::year_month_day ymd{day};
    unsigned month = static_cast<unsigned>(ymd.month());
    if (!cron.MatchesMonth(month)) {
      day = date::local_days{(ymd.year() / ymd.month() / 1) + date::months{1}};
      continue;
    }
    unsigned weekday = date::weekday{day}.c_encoding();
    if (!cron.MatchesDay(static_cast<unsigned>(ymd.day()), weekday) ||
        LocalToUtc(zone, day + hours{23} + minutes{59}) <= after) {
      day += date::days{1};
      continue;
    }
    for (unsigned h = 0; h < 24; ++h) {
      if (!((cron.hours() >> h) & 1)) continue;
      if (LocalToUtc(zone, day + hours{h} + minutes{59}) <= after) continue;
      for (unsigned m = 0; m < 60; ++m) {
        if (!((cron.minutes() >> m) & 1)) continue;
        Millis t = LocalToUtc(zone, day + hours{h} + minutes{m});
        if (t > after) return t;
      }
    }
    day += date::days{1};
  }
  return std::nullopt;
}

std::optional<Millis> LatestSlot(const CronExpr& cron, const TimeZone& zone, Millis at,
                                 Millis not_before) {
  // Look back over growing windows, so that a frequent expression costs a few steps and a
  // rare one a few more, never a walk over every slot since `not_before`.
  constexpr Millis kHour = 3600 * 1000;
  for (Millis window : {kHour, 24 * kHour, 32 * 24 * kHour, 400 * 24 * kHour, 30 * 366 * 24 * kHour,
                        400 * 366 * 24 * kHour}) {
    Millis from = std::max(not_before, at - window);
    std::optional<Millis> slot = NextSlot(cron, zone, from);
    if (slot && *slot <= at) {
      Millis last = *slot;
      while (true) {
        std::optional<Millis> next = NextSlot(cron, zone, last);
        if (!next || *next > at) return last;
        last = *next;
      }
    }
    if (from == not_before) return std::nullopt;
  }
  return std::nullopt;
}

}  // namespace keel::schedule
