// Cron expressions, time zones and the schedule decisions built on them (keel/schedule): the
// parser's syntax and errors, next slots across DST transitions in America/New_York and
// Europe/Berlin, leap years, the day-of-month/day-of-week rule, and the missed-slot policies.

#include "keel/schedule/cron.h"

#include <gtest/gtest.h>

#include "keel/schedule/schedule.h"

namespace keel::schedule {
namespace {

Millis T(const std::string& rfc3339) {
  auto t = ParseRfc3339(rfc3339);
  EXPECT_TRUE(t.has_value()) << rfc3339;
  return t.value_or(0);
}

std::string Next(const std::string& expr, const std::string& zone, const std::string& after) {
  auto cron = CronExpr::Parse(expr);
  EXPECT_TRUE(cron.ok()) << expr << ": " << cron.status().ToString();
  auto tz = TimeZone::Find(zone);
  EXPECT_TRUE(tz.ok()) << tz.status().ToString();
  if (!cron.ok() || !tz.ok()) return "";
  auto slot = NextSlot(*cron, *tz, T(after));
  return slot ? FormatRfc3339(*slot) : "never";
}

// The next `n` slots after `after`.
std::vector<std::string> Slots(const std::string& expr, const std::string& zone,
                               const std::string& after, int n) {
  std::vector<std::string> out;
  std::string t = after;
  for (int i = 0; i < n; ++i) {
    t = Next(expr, zone, t);
    out.push_back(t);
    if (t == "never" || t.empty()) break;
  }
  return out;
}

std::string ParseError(const std::string& expr) {
  auto cron = CronExpr::Parse(expr);
  if (cron.ok()) return "parsed";
  EXPECT_EQ(cron.status().code(), Code::kInvalidArgument);
  return cron.status().message();
}

TEST(CronParse, AcceptsListsRangesStepsNamesAndMacros) {
  for (const char* ok :
       {"* * * * *", "0 9 * * 1-5", "*/15 * * * *",
        "5,10,15-20/2 3-5 1,15 "
        "JAN-MAR,dec mon-fri",
        "0 12 * * 7", "3/20 * * * *", "@yearly", "@annually", "@monthly", "@weekly", "@daily",
        "@midnight", "@hourly", "@DAILY", "  0\t0  * * *  "}) {
    EXPECT_EQ(ParseError(ok), "parsed") << ok;
  }
}

// SUN is 0 and 7: ending a range it is 7, so MON-SUN was refused as running backwards.
TEST(CronParse, SundayEndsAWeekdayRangeAsSeven) {
  EXPECT_EQ(ParseError("* * * * MON-SUN"), "parsed");
  // 2024-05-04 is a Saturday.
  EXPECT_EQ(Next("0 9 * * MON-SUN", "UTC", "2024-05-04T09:00:00.000Z"), "2024-05-05T09:00:00.000Z");
  EXPECT_EQ(Next("0 9 * * SAT-SUN", "UTC", "2024-05-05T09:00:00.000Z"), "2024-05-11T09:00:00.000Z");
  EXPECT_EQ(Next("0 9 * * sun-sat", "UTC", "2024-05-04T09:00:00.000Z"), "2024-05-05T09:00:00.000Z");
  EXPECT_EQ(Next("0 9 * * SUN-SUN", "UTC", "2024-05-05T09:00:00.000Z"), "2024-05-12T09:00:00.000Z");
  EXPECT_NE(ParseError("* * * * 1-0").find("range '1-0' runs backwards"), std::string::npos);
  EXPECT_NE(ParseError("* * * * FRI-MON").find("range 'FRI-MON' runs backwards"),
            std::string::npos);
}

TEST(CronParse, RejectsWithTheFieldAndValue) {
  EXPECT_NE(ParseError("0 24 * * *").find("field 'hour' value '24' is out of range 0-23"),
            std::string::npos);
  EXPECT_NE(ParseError("60 * * * *").find("field 'minute' value '60'"), std::string::npos);
  EXPECT_NE(ParseError("0 0 0 * *").find("field 'day-of-month' value '0'"), std::string::npos);
  EXPECT_NE(ParseError("0 0 1 FOO *").find("field 'month' has an unknown name 'FOO'"),
            std::string::npos);
  EXPECT_NE(ParseError("0 0 * * 8").find("field 'day-of-week' value '8'"), std::string::npos);
  EXPECT_NE(ParseError("*/0 * * * *").find("field 'minute' step '0'"), std::string::npos);
  EXPECT_NE(ParseError("5-1 * * * *").find("range '5-1' runs backwards"), std::string::npos);
  EXPECT_NE(ParseError("1,,2 * * * *").find("empty list item"), std::string::npos);
  EXPECT_NE(ParseError("0 0 L * *").find("field 'day-of-month' has an invalid value 'L'"),
            std::string::npos);
  EXPECT_NE(ParseError("* * * *").find("it has 4 fields"), std::string::npos);
  EXPECT_NE(ParseError("* * * * * *").find("it has 6 fields"), std::string::npos);
  EXPECT_NE(ParseError("").find("it has 0 fields"), std::string::npos);
  EXPECT_NE(ParseError("@reboot").find("unknown macro"), std::string::npos);
  EXPECT_NE(ParseError(std::string(300, '*')).find("longer than 200"), std::string::npos);
}

TEST(CronParse, RejectsAnExpressionThatNeverFires) {
  EXPECT_NE(ParseError("0 0 30 2 *").find("never fires"), std::string::npos);
  EXPECT_NE(ParseError("0 0 31 4,6,9,11 *").find("never fires"), std::string::npos);
  EXPECT_NE(ParseError("0 0 31 4 */2").find("never fires"), std::string::npos);
  // Restricted weekdays make it fire on those days (the OR rule).
  EXPECT_EQ(ParseError("0 0 31 4 1"), "parsed");
  EXPECT_EQ(ParseError("0 0 29 2 *"), "parsed");
}

TEST(TimeZoneTest, FindsIanaZonesAndRejectsOthers) {
  EXPECT_TRUE(TimeZone::Find("UTC").ok());
  EXPECT_TRUE(TimeZone::Find("Europe/Berlin").ok());
  for (const char* bad : {"Mars/Olympus", "", "../../etc/passwd", "europe/berlin"}) {
    auto z = TimeZone::Find(bad);
    ASSERT_FALSE(z.ok()) << bad;
    EXPECT_EQ(z.status().code(), Code::kInvalidArgument);
    EXPECT_NE(z.status().message().find("unknown time zone"), std::string::npos);
  }
}

TEST(NextSlotTest, EveryMinuteHourAndWeekdayInUtc) {
  EXPECT_EQ(Next("* * * * *", "UTC", "2024-05-01T10:00:00.000Z"), "2024-05-01T10:01:00.000Z");
  EXPECT_EQ(Next("* * * * *", "UTC", "2024-05-01T10:00:30.500Z"), "2024-05-01T10:01:00.000Z");
  EXPECT_EQ(Next("@hourly", "UTC", "2024-12-31T23:00:00.000Z"), "2025-01-01T00:00:00.000Z");
  // 2024-05-03 is a Friday: the next weekday 09:00 is Monday.
  EXPECT_EQ(Next("0 9 * * MON-FRI", "UTC", "2024-05-03T09:00:00.000Z"), "2024-05-06T09:00:00.000Z");
  EXPECT_EQ(Next("*/20 * * * *", "UTC", "2024-05-01T10:41:00.000Z"), "2024-05-01T11:00:00.000Z");
  EXPECT_EQ(Next("3/20 * * * *", "UTC", "2024-05-01T10:44:00.000Z"), "2024-05-01T11:03:00.000Z");
}

TEST(NextSlotTest, LocalTimeInAZoneIsConvertedToUtc) {
  // 09:00 in Berlin is 07:00Z in summer (CEST) and 08:00Z in winter (CET).
  EXPECT_EQ(Next("0 9 * * *", "Europe/Berlin", "2024-07-01T12:00:00.000Z"),
            "2024-07-02T07:00:00.000Z");
  EXPECT_EQ(Next("0 9 * * *", "Europe/Berlin", "2024-01-01T12:00:00.000Z"),
            "2024-01-02T08:00:00.000Z");
  // Midnight in New York is already the next day in UTC.
  EXPECT_EQ(Next("@daily", "America/New_York", "2024-01-10T12:00:00.000Z"),
            "2024-01-11T05:00:00.000Z");
}

TEST(NextSlotTest, NewYorkSpringForwardFiresAtTheEndOfTheGap) {
  // 2024-03-10: 02:00 EST jumps to 03:00 EDT (07:00Z); 02:30 does not exist that day.
  EXPECT_EQ(Slots("30 2 * * *", "America/New_York", "2024-03-09T12:00:00.000Z", 3),
            (std::vector<std::string>{"2024-03-10T07:00:00.000Z", "2024-03-11T06:30:00.000Z",
                                      "2024-03-12T06:30:00.000Z"}));
  // Every quarter hour: the gap's four local times are one slot, at 03:00 EDT.
  EXPECT_EQ(Slots("*/15 * * * *", "America/New_York", "2024-03-10T06:30:00.000Z", 4),
            (std::vector<std::string>{"2024-03-10T06:45:00.000Z", "2024-03-10T07:00:00.000Z",
                                      "2024-03-10T07:15:00.000Z", "2024-03-10T07:30:00.000Z"}));
}

TEST(NextSlotTest, NewYorkFallBackFiresOnceAtTheFirstOccurrence) {
  // 2024-11-03: 02:00 EDT falls back to 01:00 EST; 01:30 happens at 05:30Z and 06:30Z.
  EXPECT_EQ(Slots("30 1 * * *", "America/New_York", "2024-11-02T12:00:00.000Z", 2),
            (std::vector<std::string>{"2024-11-03T05:30:00.000Z", "2024-11-04T06:30:00.000Z"}));
  // Every half hour: the repeated hour is not fired again.
  EXPECT_EQ(Slots("*/30 * * * *", "America/New_York", "2024-11-03T04:45:00.000Z", 4),
            (std::vector<std::string>{"2024-11-03T05:00:00.000Z", "2024-11-03T05:30:00.000Z",
                                      "2024-11-03T07:00:00.000Z", "2024-11-03T07:30:00.000Z"}));
}

TEST(NextSlotTest, BerlinTransitions) {
  // 2024-03-31: 02:00 CET jumps to 03:00 CEST (01:00Z).
  EXPECT_EQ(Next("30 2 * * *", "Europe/Berlin", "2024-03-30T12:00:00.000Z"),
            "2024-03-31T01:00:00.000Z");
  // 2024-10-27: 03:00 CEST falls back to 02:00 CET; 02:30 fires at its first occurrence.
  EXPECT_EQ(Slots("30 2 * * *", "Europe/Berlin", "2024-10-26T12:00:00.000Z", 2),
            (std::vector<std::string>{"2024-10-27T00:30:00.000Z", "2024-10-28T01:30:00.000Z"}));
  // An hourly schedule runs through the fall-back hour once.
  EXPECT_EQ(Slots("0 * * * *", "Europe/Berlin", "2024-10-26T23:30:00.000Z", 4),
            (std::vector<std::string>{"2024-10-27T00:00:00.000Z", "2024-10-27T02:00:00.000Z",
                                      "2024-10-27T03:00:00.000Z", "2024-10-27T04:00:00.000Z"}));
}

TEST(NextSlotTest, LeapYears) {
  EXPECT_EQ(Next("0 0 29 2 *", "UTC", "2024-03-01T00:00:00.000Z"), "2028-02-29T00:00:00.000Z");
  // 2100 is not a leap year.
  EXPECT_EQ(Next("0 0 29 2 *", "UTC", "2096-03-01T00:00:00.000Z"), "2104-02-29T00:00:00.000Z");
  EXPECT_EQ(Next("0 0 31 * *", "UTC", "2024-01-31T00:00:00.000Z"), "2024-03-31T00:00:00.000Z");
  // February 29th that is a Sunday: 2032.
  EXPECT_EQ(Next("0 0 29 2 */7", "UTC", "2024-03-01T00:00:00.000Z"), "2032-02-29T00:00:00.000Z");
}

TEST(NextSlotTest, DayOfMonthOrDayOfWeekWhenBothAreRestricted) {
  // The 13th or a Friday: 2024-09-06 (Fri), 2024-09-13 (Fri the 13th), 2024-09-20 (Fri).
  EXPECT_EQ(Slots("0 0 13 * 5", "UTC", "2024-09-01T00:00:00.000Z", 3),
            (std::vector<std::string>{"2024-09-06T00:00:00.000Z", "2024-09-13T00:00:00.000Z",
                                      "2024-09-20T00:00:00.000Z"}));
  // The 1st or a Monday.
  EXPECT_EQ(Slots("0 9 1 * MON", "UTC", "2024-06-28T00:00:00.000Z", 2),
            (std::vector<std::string>{"2024-07-01T09:00:00.000Z", "2024-07-08T09:00:00.000Z"}));
  // A field that begins with '*' leaves the days to both: odd days that are Fridays.
  EXPECT_EQ(Slots("0 0 */2 * 5", "UTC", "2024-09-01T00:00:00.000Z", 2),
            (std::vector<std::string>{"2024-09-13T00:00:00.000Z", "2024-09-27T00:00:00.000Z"}));
  // Day-of-week '*': only the day of the month counts.
  EXPECT_EQ(Next("0 0 13 * *", "UTC", "2024-09-01T00:00:00.000Z"), "2024-09-13T00:00:00.000Z");
}

TEST(LatestSlotTest, FindsTheLastSlotInAnInterval) {
  auto cron = *CronExpr::Parse("*/10 * * * *");
  TimeZone utc = TimeZone::Utc();
  auto latest = LatestSlot(cron, utc, T("2024-05-01T12:34:56.000Z"), T("2024-04-01T00:00:00.000Z"));
  ASSERT_TRUE(latest);
  EXPECT_EQ(FormatRfc3339(*latest), "2024-05-01T12:30:00.000Z");
  auto yearly = *CronExpr::Parse("@yearly");
  latest = LatestSlot(yearly, utc, T("2030-06-01T00:00:00.000Z"), T("2024-06-01T00:00:00.000Z"));
  ASSERT_TRUE(latest);
  EXPECT_EQ(FormatRfc3339(*latest), "2030-01-01T00:00:00.000Z");
  EXPECT_FALSE(
      LatestSlot(yearly, utc, T("2024-12-31T00:00:00.000Z"), T("2024-06-01T00:00:00.000Z")));
}

// ---------------------------------------------------------------- schedules

store::Schedule Active(const std::string& cron, const std::string& zone, const std::string& missed,
                       Millis next, Millis updated_at) {
  store::Schedule s;
  s.kind = "cron";
  s.cron = cron;
  s.timezone = zone;
  s.missed = missed;
  s.next_fire_at = next;
  s.updated_at = updated_at;
  return s;
}

TEST(MakeScheduleTest, ChecksFieldsAndSetsTheFirstSlot) {
  ScheduleRequest r;
  r.agent_id = "a";
  r.prompt = "hi";
  r.cron = "0 9 * * *";
  r.timezone = "Europe/Berlin";
  auto s = MakeSchedule(r, "t", "tok", "user", T("2024-07-01T12:00:00.000Z"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->kind, "cron");
  EXPECT_EQ(s->status, "active");
  EXPECT_EQ(s->name, "0 9 * * *");
  EXPECT_EQ(FormatRfc3339(*s->next_fire_at), "2024-07-02T07:00:00.000Z");
  EXPECT_EQ(s->caller_role, "user");

  auto bad = [&](ScheduleRequest req, const std::string& expect) {
    auto made = MakeSchedule(req, "t", "tok", "owner", 0);
    ASSERT_FALSE(made.ok()) << expect;
    EXPECT_EQ(made.status().code(), Code::kInvalidArgument);
    EXPECT_NE(made.status().message().find(expect), std::string::npos) << made.status().message();
  };
  ScheduleRequest x = r;
  x.timezone = "Mars/Olympus";
  bad(x, "field 'timezone': unknown time zone: \"Mars/Olympus\"");
  x = r;
  x.cron = "0 0 30 2 *";
  bad(x, "field 'cron'");
  x = r;
  x.at = 5;
  bad(x, "not both");
  x = r;
  x.cron.clear();
  bad(x, "one of 'cron' and 'at' is required");
  x = r;
  x.prompt.clear();
  bad(x, "'prompt'");
  x = r;
  x.missed = "always";
  bad(x, "'missed'");

  ScheduleRequest once = r;
  once.cron.clear();
  once.at = T("2024-07-01T12:00:05.000Z");
  auto o = MakeSchedule(once, "t", "tok", "owner", T("2024-07-01T12:00:00.000Z"));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->kind, "once");
  EXPECT_EQ(o->next_fire_at, once.at);
}

TEST(PlanFiringTest, ALateSlotFiresAndTheNextFollowsIt) {
  // The node has been firing since 10:00; the 12:00 slot is handled at 12:00:02.
  auto s = Active("0 * * * *", "UTC", "skip", T("2024-05-01T12:00:00.000Z"),
                  T("2024-05-01T11:00:00.000Z"));
  auto f = PlanFiring(s, T("2024-05-01T12:00:02.000Z"), T("2024-05-01T10:00:00.000Z"));
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->missed);
  EXPECT_EQ(FormatRfc3339(*f->slot), "2024-05-01T12:00:00.000Z");
  EXPECT_EQ(FormatRfc3339(*f->next), "2024-05-01T13:00:00.000Z");
  // A busy node two slots behind fires them one by one.
  f = PlanFiring(s, T("2024-05-01T13:30:00.000Z"), T("2024-05-01T10:00:00.000Z"));
  EXPECT_EQ(FormatRfc3339(*f->slot), "2024-05-01T12:00:00.000Z");
  EXPECT_EQ(FormatRfc3339(*f->next), "2024-05-01T13:00:00.000Z");
}

TEST(PlanFiringTest, SkipJumpsOverSlotsMissedDuringDowntime) {
  // Down from 11:10 to 14:20 (the node started firing again at 14:20).
  auto s = Active("0 * * * *", "UTC", "skip", T("2024-05-01T12:00:00.000Z"),
                  T("2024-05-01T11:00:00.000Z"));
  auto f = PlanFiring(s, T("2024-05-01T14:20:01.000Z"), T("2024-05-01T14:20:00.000Z"));
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->missed);
  EXPECT_FALSE(f->slot);
  EXPECT_EQ(FormatRfc3339(*f->next), "2024-05-01T15:00:00.000Z");
}

TEST(PlanFiringTest, CatchUpOneFiresTheLatestMissedSlotOnly) {
  auto s = Active("0 * * * *", "UTC", "catch_up_one", T("2024-05-01T12:00:00.000Z"),
                  T("2024-05-01T11:00:00.000Z"));
  auto f = PlanFiring(s, T("2024-05-01T14:20:01.000Z"), T("2024-05-01T14:20:00.000Z"));
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->missed);
  EXPECT_EQ(FormatRfc3339(*f->slot), "2024-05-01T14:00:00.000Z");
  EXPECT_EQ(FormatRfc3339(*f->next), "2024-05-01T15:00:00.000Z");
}

TEST(PlanFiringTest, OneShots) {
  store::Schedule s;
  s.kind = "once";
  s.at = T("2024-05-01T12:00:00.000Z");
  s.next_fire_at = s.at;
  s.updated_at = T("2024-05-01T11:00:00.000Z");
  // On time: fires, then done.
  auto f = PlanFiring(s, T("2024-05-01T12:00:00.300Z"), T("2024-05-01T10:00:00.000Z"));
  EXPECT_EQ(f->slot, s.at);
  EXPECT_FALSE(f->next);
  // Missed with skip: done without firing; with catch_up_one: fires.
  f = PlanFiring(s, T("2024-05-01T13:00:00.000Z"), T("2024-05-01T13:00:00.000Z"));
  EXPECT_TRUE(f->missed);
  EXPECT_FALSE(f->slot);
  EXPECT_FALSE(f->next);
  s.missed = "catch_up_one";
  f = PlanFiring(s, T("2024-05-01T13:00:00.000Z"), T("2024-05-01T13:00:00.000Z"));
  EXPECT_EQ(f->slot, s.at);
  EXPECT_FALSE(f->next);
  // Created after the node began firing, with a time already past: not missed, it fires.
  s.missed = "skip";
  s.updated_at = T("2024-05-01T13:00:00.500Z");
  f = PlanFiring(s, T("2024-05-01T13:00:01.000Z"), T("2024-05-01T13:00:00.000Z"));
  EXPECT_FALSE(f->missed);
  EXPECT_EQ(f->slot, s.at);
}

TEST(PlanFiringTest, MissedSlotsAcrossASpringForwardInNewYork) {
  // Every day at 02:30 New York time, down over 2024-03-10 (whose 02:30 fired at 03:00 EDT).
  auto s = Active("30 2 * * *", "America/New_York", "catch_up_one", T("2024-03-09T07:30:00.000Z"),
                  T("2024-03-08T08:00:00.000Z"));
  auto f = PlanFiring(s, T("2024-03-10T12:00:00.000Z"), T("2024-03-10T12:00:00.000Z"));
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(FormatRfc3339(*f->slot), "2024-03-10T07:00:00.000Z");
  EXPECT_EQ(FormatRfc3339(*f->next), "2024-03-11T06:30:00.000Z");
}

TEST(ResumeAtTest, FollowsTheMissedPolicy) {
  // Paused at 11:30 with 12:00 pending; resumed at 14:20.
  auto s = Active("0 * * * *", "UTC", "skip", T("2024-05-01T12:00:00.000Z"),
                  T("2024-05-01T11:30:00.000Z"));
  auto at = ResumeAt(s, T("2024-05-01T14:20:00.000Z"));
  ASSERT_TRUE(at.ok());
  EXPECT_EQ(FormatRfc3339(**at), "2024-05-01T15:00:00.000Z");
  s.missed = "catch_up_one";
  at = ResumeAt(s, T("2024-05-01T14:20:00.000Z"));
  EXPECT_EQ(FormatRfc3339(**at), "2024-05-01T14:00:00.000Z");
  // Nothing missed: the pending slot stays.
  at = ResumeAt(s, T("2024-05-01T11:45:00.000Z"));
  EXPECT_EQ(FormatRfc3339(**at), "2024-05-01T12:00:00.000Z");
}

}  // namespace
}  // namespace keel::schedule
