#pragma once
// Metering: what a model call costs, what a call about to be made will roughly cost, and the
// UTC periods budgets and usage totals are kept in. Pure functions, no I/O.
//
// Money is integer micro-dollars (1 USD = 1,000,000) everywhere inside Keel; prices are
// micro-dollars per million tokens (config::ModelPrice). A model without a price costs 0.

#include <cstdint>
#include <map>
#include <string>

#include "keel/common/time.h"
#include "keel/config/config.h"
#include "keel/model/provider.h"

namespace keel::model {

using PriceTable = std::map<std::string, config::ModelPrice>;

// The price of `model` (as agents name it: "openai/gpt-4o-mini", "local"); zero when unpriced.
config::ModelPrice PriceOf(const PriceTable& prices, const std::string& model);

// The cost in micro-dollars of `usage` at `price`, rounded to the nearest micro-dollar.
int64_t CostMicros(const config::ModelPrice& price, const Usage& usage);

// Input tokens of a request `request_bytes` long, at about four bytes a token (rounded up).
int64_t EstimateInputTokens(size_t request_bytes);

// Micro-dollars as a JSON number of USD (exact to the micro-dollar: 1500 -> 0.0015).
double MicrosToUsd(int64_t micros);
// USD (a JSON number) as micro-dollars, rounded; false when negative, not finite, or more than
// a billion dollars.
bool UsdToMicros(double usd, int64_t* micros);

// Budget and usage periods, in UTC.
inline constexpr const char* kPeriodDay = "day";
inline constexpr const char* kPeriodMonth = "month";
bool IsPeriod(const std::string& period);
// The start of the UTC day or month that contains `at`. REQUIRES: IsPeriod(period).
Millis PeriodStart(const std::string& period, Millis at);

}  // namespace keel::model
