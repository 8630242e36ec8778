#include "keel/tools/schema.h"

#include <cmath>
#include <cstdint>
#include <optional>

namespace keel::tools {
namespace {

constexpr int kMaxDepth = 32;

const char* TypeOf(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "null";
    case Json::value_t::boolean: return "boolean";
    case Json::value_t::string: return "string";
    case Json::value_t::array: return "array";
    case Json::value_t::object: return "object";
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: return "integer";
    case Json::value_t::number_float: return "number";
    default: return "unknown";
  }
}

bool IsType(const Json& v, const std::string& type) {
  if (type == "number") return v.is_number();
  if (type == "integer") {
    // std::trunc, not a cast to int64_t: a cast of 1e300 is undefined.
    return v.is_number_integer() || (v.is_number_float() && std::trunc(v.get<double>()) == v.get<double>());
  }
  return type == TypeOf(v);
}

// The keywords whose value is a count, and those whose value is a number.
constexpr const char* kCountKeywords[] = {"minLength", "maxLength", "minItems", "maxItems"};
constexpr const char* kNumberKeywords[] = {"minimum", "maximum"};

// A count keyword's value: a non-negative integer, which JSON may also spell 5.0. A count past
// 2^64 is taken as 2^64 - 1, which no string or array reaches; casting 1e300 to an integer would
// be undefined.
std::optional<uint64_t> CountOf(const Json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) {
    int64_t i = v.get<int64_t>();
    if (i < 0) return std::nullopt;
    return static_cast<uint64_t>(i);
  }
  if (!v.is_number_float()) return std::nullopt;
  double d = v.get<double>();
  if (!(d >= 0) || std::trunc(d) != d) return std::nullopt;  // NaN fails d >= 0
  if (d >= 18446744073709551616.0) return UINT64_MAX;
  return static_cast<uint64_t>(d);
}

// The count under `keyword`, or nullopt when the schema has none. REQUIRES: CheckSchema passed.
std::optional<uint64_t> Count(const Json& schema, const char* keyword) {
  auto m = schema.find(keyword);
  return m == schema.end() ? std::nullopt : CountOf(*m);
}

// Walks what Check walks, so that Check never meets a keyword it would have to ignore.
Status CheckSchemaAt(const Json& schema, const std::string& path, int depth) {
  if (depth > kMaxDepth || !schema.is_object()) return Status::Ok();
  for (const char* keyword : kCountKeywords) {
    if (auto m = schema.find(keyword); m != schema.end() && !CountOf(*m)) {
      return InvalidArgument(path + "." + keyword + ": must be a non-negative integer, got " +
                             m->dump());
    }
  }
  for (const char* keyword : kNumberKeywords) {
    if (auto m = schema.find(keyword); m != schema.end() && !m->is_number()) {
      return InvalidArgument(path + "." + keyword + ": must be a number, got " + m->dump());
    }
  }
  if (auto p = schema.find("properties"); p != schema.end() && p->is_object()) {
    for (auto it = p->begin(); it != p->end(); ++it) {
      KEEL_RETURN_IF_ERROR(CheckSchemaAt(it.value(), path + ".properties." + it.key(), depth + 1));
    }
  }
  if (auto extra = schema.find("additionalProperties"); extra != schema.end()) {
    KEEL_RETURN_IF_ERROR(CheckSchemaAt(*extra, path + ".additionalProperties", depth + 1));
  }
  if (auto items = schema.find("items"); items != schema.end()) {
    KEEL_RETURN_IF_ERROR(CheckSchemaAt(*items, path + ".items", depth + 1));
  }
  return Status::Ok();
}

Status Check(const Json& schema, const Json& v, const std::string& path, int depth) {
  if (depth > kMaxDepth) return InvalidArgument(path + ": nested too deeply");
  if (!schema.is_object()) return Status::Ok();
  if (auto t = schema.find("type"); t != schema.end()) {
    bool ok = false;
    std::string wanted;
    if (t->is_string()) {
      ok = IsType(v, t->get<std::string>());
      wanted = t->get<std::string>();
    } else if (t->is_array()) {
      for (const auto& one : *t) {
        if (!one.is_string()) continue;
        ok = ok || IsType(v, one.get<std::string>());
        wanted += (wanted.empty() ? "" : " or ") + one.get<std::string>();
      }
    } else {
      ok = true;
    }
    if (!ok) return InvalidArgument(path + ": expected " + wanted + ", got " + TypeOf(v));
  }
  if (auto e = schema.find("enum"); e != schema.end() && e->is_array()) {
    bool found = false;
    for (const auto& option : *e) found = found || option == v;
    if (!found) return InvalidArgument(path + ": must be one of " + DumpJson(*e));
  }
  if (v.is_number()) {
    double x = v.get<double>();
    if (auto m = schema.find("minimum"); m != schema.end() && x < m->get<double>()) {
      return InvalidArgument(path + ": must be at least " + m->dump());
    }
    if (auto m = schema.find("maximum"); m != schema.end() && x > m->get<double>()) {
      return InvalidArgument(path + ": must be at most " + m->dump());
    }
  }
  if (v.is_string()) {
    uint64_t n = v.get_ref<const std::string&>().size();
    if (auto m = Count(schema, "minLength"); m && n < *m) {
      return InvalidArgument(path + ": shorter than " + std::to_string(*m) + " characters");
    }
    if (auto m = Count(schema, "maxLength"); m && n > *m) {
      return InvalidArgument(path + ": longer than " + std::to_string(*m) + " characters");
    }
  }
  if (v.is_array()) {
    uint64_t n = v.size();
    if (auto m = Count(schema, "minItems"); m && n < *m) {
      return InvalidArgument(path + ": fewer than " + std::to_string(*m) + " items");
    }
    if (auto m = Count(schema, "maxItems"); m && n > *m) {
      return InvalidArgument(path + ": more than " + std::to_string(*m) + " items");
    }
    if (auto items = schema.find("items"); items != schema.end() && items->is_object()) {
      for (size_t i = 0; i < v.size(); ++i) {
        KEEL_RETURN_IF_ERROR(Check(*items, v[i], path + "[" + std::to_string(i) + "]", depth + 1));
      }
    }
  }
  if (v.is_object()) {
    const Json* props = nullptr;
    if (auto p = schema.find("properties"); p != schema.end() && p->is_object()) props = &*p;
    if (auto r = schema.find("required"); r != schema.end() && r->is_array()) {
      for (const auto& name : *r) {
        if (name.is_string() && !v.contains(name.get<std::string>())) {
          return InvalidArgument(path + ": missing required field '" + name.get<std::string>() + "'");
        }
      }
    }
    auto extra = schema.find("additionalProperties");
    for (auto it = v.begin(); it != v.end(); ++it) {
      const std::string field_path = path + "." + it.key();
      if (props && props->contains(it.key())) {
        KEEL_RETURN_IF_ERROR(Check((*props)[it.key()], it.value(), field_path, depth + 1));
      } else if (extra != schema.end()) {
        if (extra->is_boolean() && !extra->get<bool>()) {
          return InvalidArgument(field_path + ": unknown field");
        }
        KEEL_RETURN_IF_ERROR(Check(*extra, it.value(), field_path, depth + 1));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status CheckSchema(const Json& schema, const std::string& name) {
  return CheckSchemaAt(schema, name, 0);
}

Status CheckArguments(const Json& schema, const Json& arguments) {
  KEEL_RETURN_IF_ERROR(CheckSchema(schema, "schema"));
  return Check(schema, arguments, "arguments", 0);
}

}  // namespace keel::tools
