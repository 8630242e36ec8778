#pragma once
// Cron expressions, IANA time zones, and the slots an expression names in a zone.
//
// A CronExpr has five fields: minute (0-59) hour (0-23) day-of-month (1-31) month (1-12 or
// JAN-DEC) day-of-week (0-7 or SUN-SAT; 0 and 7 are Sunday). Each field is a comma-separated
// list of `*`, a value, a range `a-b`, or a step `*/n`, `a-b/n`, `a/n` (a to the field's
// maximum). Names are case-insensitive and may end ranges (`MON-FRI`). Instead of five fields
// an expression may be a macro: @yearly (@annually) `0 0 1 1 *`, @monthly `0 0 1 * *`, @weekly
// `0 0 * * 0`, @daily (@midnight) `0 0 * * *`, @hourly `0 * * * *`.
//
// Days follow Vixie cron: when both day fields are restricted (neither begins with `*`), a day
// matches when either field matches it (`0 9 1 * MON`: the 1st and every Monday); otherwise
// both must (so a `*` field leaves the other one to decide).
//
// Slots are the expression's civil times in the zone, converted to UTC. DST rule: a local time
// that does not exist (the clocks spring forward over it) fires at the first instant after the
// gap; a local time that happens twice (the clocks fall back) fires once, at its first
// occurrence. Several local times that map to one instant are one slot.
//
// Everything here is a pure value: safe to copy and to share across threads. The zone database
// is the operating system's (tzdata, /usr/share/zoneinfo), read through Howard Hinnant's date
// library (libdate-tz).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "keel/common/status.h"
#include "keel/common/time.h"

namespace date {
class time_zone;
}

namespace keel::schedule {

// A civil (wall-clock) time, as a cron expression sees it.
struct CivilTime {
  int year = 1970;
  unsigned month = 1;    // 1-12
  unsigned day = 1;      // 1-31
  unsigned weekday = 4;  // 0 (Sunday) - 6
  unsigned hour = 0;
  unsigned minute = 0;
};

class CronExpr {
 public:
  // Parses `text`. kInvalidArgument naming the field and the offending value for a malformed
  // expression, and for one that can never fire (`0 0 30 2 *`: there is no February 30th).
  static Result<CronExpr> Parse(std::string_view text);

  bool Matches(const CivilTime& t) const;
  bool MatchesMonth(unsigned month) const { return (months_ >> month) & 1; }
  bool MatchesDay(unsigned day, unsigned weekday) const;
  // The hours and minutes of a matching day, as bit sets (bit n: hour or minute n).
  uint32_t hours() const { return hours_; }
  uint64_t minutes() const { return minutes_; }
  // The expression as given (a macro stays a macro).
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  uint64_t minutes_ = 0;        // bits 0-59
  uint32_t hours_ = 0;          // bits 0-23
  uint32_t days_ = 0;           // bits 1-31
  uint16_t months_ = 0;         // bits 1-12
  uint8_t weekdays_ = 0;        // bits 0-6 (7 folds into 0)
  bool days_star_ = false;      // the day-of-month field begins with `*`
  bool weekdays_star_ = false;  // the day-of-week field begins with `*`
};

// An IANA time zone ("Europe/Berlin", "America/New_York", "UTC").
class TimeZone {
 public:
  // kInvalidArgument "unknown time zone: NAME" when the database has no such zone.
  static Result<TimeZone> Find(std::string_view name);
  static TimeZone Utc();

  const std::string& name() const { return name_; }
  // The UTC instant of a civil time in this zone, by the DST rule above.
  Millis ToUtc(int year, unsigned month, unsigned day, unsigned hour, unsigned minute) const;
  // The civil time in this zone at a UTC instant (seconds are dropped).
  CivilTime ToCivil(Millis t) const;

 private:
  friend std::optional<Millis> NextSlot(const CronExpr& cron, const TimeZone& zone, Millis after);

  TimeZone(const date::time_zone* zone, std::string name) : zone_(zone), name_(std::move(name)) {}
  const date::time_zone* zone_;  // owned by the date library's database, lives forever
  std::string name_;
};

// The first slot of `cron` in `zone` strictly after `after`. nullopt only when there is none in
// the next 400 years, which a parsed expression never lacks.
std::optional<Millis> NextSlot(const CronExpr& cron, const TimeZone& zone, Millis after);

// The last slot of `cron` in `zone` at or before `at` and strictly after `not_before`; nullopt
// when there is none in that interval.
std::optional<Millis> LatestSlot(const CronExpr& cron, const TimeZone& zone, Millis at,
                                 Millis not_before);

}  // namespace keel::schedule
