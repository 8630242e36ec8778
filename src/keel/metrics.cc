#include "keel/metrics.h"

namespace keel {
namespace {
void Line(std::string& out, const char* name, const char* type, const char* help, int64_t v) {
  out += "# HELP ";
  out += name;
  out += " ";
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += " ";
  out += type;
  out += "\n";
  out += name;
  out += " " + std::to_string(v) + "\n";
}
}  // namespace

std::string Metrics::Render(const std::string& extra) const {
  std::string out;
  Line(out, "keel_http_requests_total", "counter", "HTTP requests served.", http_requests);
  Line(out, "keel_http_responses_2xx_total", "counter", "2xx answers.", http_2xx);
  Line(out, "keel_http_responses_4xx_total", "counter", "4xx answers.", http_4xx);
  Line(out, "keel_http_responses_5xx_total", "counter", "5xx answers.", http_5xx);
  Line(out, "keel_runs_started_total", "counter", "Run executions started (incl. resumes).",
       runs_started);
  Line(out, "keel_runs_done_total", "counter", "Runs that ended done.", runs_done);
  Line(out, "keel_runs_failed_total", "counter", "Runs that ended failed.", runs_failed);
  Line(out, "keel_runs_cancelled_total", "counter", "Runs cancelled.", runs_cancelled);
  Line(out, "keel_model_calls_total", "counter", "Model calls made.", model_calls);
  Line(out, "keel_model_errors_total", "counter", "Model calls that failed.", model_errors);
  Line(out, "keel_tool_calls_total", "counter", "Tool calls through the gateway.", tool_calls);
  Line(out, "keel_input_tokens_total", "counter", "Model input tokens.", input_tokens);
  Line(out, "keel_output_tokens_total", "counter", "Model output tokens.", output_tokens);
  Line(out, "keel_model_cache_hits_total", "counter",
       "Model calls answered from the response cache.", model_cache_hits);
  Line(out, "keel_model_cache_misses_total", "counter",
       "Cacheable model calls the response cache could not answer.", model_cache_misses);
  Line(out, "keel_model_cache_errors_total", "counter",
       "Response cache reads or writes that failed (the call went to the provider).",
       model_cache_errors);
  Line(out, "keel_model_cache_stores_total", "counter",
       "Answers written to the response cache.", model_cache_stores);
  Line(out, "keel_model_fallbacks_total", "counter",
       "Model calls that went to the agent's fallback model.", model_fallbacks);
  Line(out, "keel_budget_stops_total", "counter",
       "Runs stopped before a model call that would have crossed a budget.", budget_stops);
  Line(out, "keel_runs_executing", "gauge", "Runs executing on this node.", runs_executing);
  Line(out, "keel_sse_clients", "gauge", "Connected event stream clients.", sse_clients);
  out += extra;
  return out;
}

}  // namespace keel
