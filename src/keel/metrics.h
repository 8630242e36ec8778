#pragma once
// Process-wide counters and gauges rendered as Prometheus text at /metrics. Owned by the server
// instance; counters are atomics, safe from any thread.

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

namespace keel {

struct Metrics {
  std::atomic<int64_t> http_requests{0};
  std::atomic<int64_t> http_2xx{0};
  std::atomic<int64_t> http_4xx{0};
  std::atomic<int64_t> http_5xx{0};
  std::atomic<int64_t> runs_started{0};
  std::atomic<int64_t> runs_done{0};
  std::atomic<int64_t> runs_failed{0};
  std::atomic<int64_t> runs_cancelled{0};
  std::atomic<int64_t> model_calls{0};
  std::atomic<int64_t> model_errors{0};
  std::atomic<int64_t> tool_calls{0};
  std::atomic<int64_t> input_tokens{0};
  std::atomic<int64_t> output_tokens{0};
  std::atomic<int64_t> model_cache_hits{0};
  std::atomic<int64_t> model_cache_misses{0};
  std::atomic<int64_t> model_cache_errors{0};
  std::atomic<int64_t> model_cache_stores{0};
  std::atomic<int64_t> model_fallbacks{0};
  std::atomic<int64_t> budget_stops{0};
  std::atomic<int64_t> runs_executing{0};
  std::atomic<int64_t> sse_clients{0};

  // Renders every metric plus `extra` (lines appended as-is, e.g. store statistics).
  std::string Render(const std::string& extra) const;
};

}  // namespace keel
