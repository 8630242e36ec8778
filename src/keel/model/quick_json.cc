#include "keel/model/quick_json.h"

#include <algorithm>
#include <boost/json/parse.hpp>
#include <cmath>
#include <cstdint>

#include "keel/common/json_util.h"

namespace keel::model {
namespace {

bool HoldsInfinity(const boost::json::value& v) {
  if (v.is_double()) return !std::isfinite(v.get_double());
  if (v.is_array()) {
    for (const auto& e : v.get_array()) {
      if (HoldsInfinity(e)) return true;
    }
  }
  if (v.is_object()) {
    for (const auto& m : v.get_object()) {
      if (HoldsInfinity(m.value())) return true;
    }
  }
  return false;
}

}  // namespace

bool QuickParse(std::string_view text, boost::json::monotonic_resource& memory,
                boost::json::value& out) {
  boost::json::parse_options options;
  options.max_depth = kMaxJsonDepth;
  boost::json::error_code ec;
  out = boost::json::parse(text, ec, &memory, options);
  return !ec && !HoldsInfinity(out);
}

int64_t QuickCount(const boost::json::object& obj, std::string_view field) {
  const boost::json::value* v = obj.if_contains(field);
  if (v && v->is_int64()) return std::max<int64_t>(0, v->get_int64());
  if (v && v->is_uint64())
    return static_cast<int64_t>(std::min<uint64_t>(v->get_uint64(), INT64_MAX));
  return 0;
}

}  // namespace keel::model
