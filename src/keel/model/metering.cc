#include "keel/model/metering.h"

#include <cmath>
#include <ctime>

namespace keel::model {

config::ModelPrice PriceOf(const PriceTable& prices, const std::string& model) {
  auto it = prices.find(model);
  return it == prices.end() ? config::ModelPrice{} : it->second;
}

int64_t CostMicros(const config::ModelPrice& price, const Usage& usage) {
  // tokens up to ~1e9 times prices up to 1e12 overflow int64: multiply in 128 bits.
  __int128 product = static_cast<__int128>(usage.input_tokens) * price.input_microusd_per_mtok +
                     static_cast<__int128>(usage.output_tokens) * price.output_microusd_per_mtok;
  if (product <= 0) return 0;
  return static_cast<int64_t>((product + 500000) / 1000000);
}

int64_t EstimateInputTokens(size_t request_bytes) {
  return static_cast<int64_t>((request_bytes + 3) / 4);
}

double MicrosToUsd(int64_t micros) { return static_cast<double>(micros) / 1e6; }

bool UsdToMicros(double usd, int64_t* micros) {
  if (!std::isfinite(usd) || usd < 0 || usd > 1e9) return false;
  *micros = std::llround(usd * 1e6);
  return true;
}

bool IsPeriod(const std::string& period) { return period == kPeriodDay || period == kPeriodMonth; }

Millis PeriodStart(const std::string& period, Millis at) {
  constexpr Millis kDay = 86400000;
  Millis day = at >= 0 ? at / kDay * kDay : (at - kDay + 1) / kDay * kDay;
  if (period == kPeriodDay) return day;
  std::time_t seconds = static_cast<std::time_t>(day / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  tm.tm_mday = 1;
  tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
  return static_cast<Millis>(timegm(&tm)) * 1000;
}

}  // namespace keel::model
