#include "keel/tools/schema.h"

#include <cmath>

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
    if (auto m = schema.find("minimum"); m != schema.end() && m->is_number() && x < m->get<double>()) {
      return InvalidArgument(path + ": must be at least " + m->dump());
    }
    if (auto m = schema.find("maximum"); m != schema.end() && m->is_number() && x > m->get<double>()) {
      return InvalidArgument(path + ": must be at most " + m->dump());
    }
  }
  if (v.is_string()) {
    size_t n = v.get_ref<const std::string&>().size();
    if (auto m = schema.find("minLength"); m != schema.end() && m->is_number_unsigned() &&
                                             n < m->get<size_t>()) {
      return InvalidArgument(path + ": shorter than " + m->dump() + " characters");
    }
    if (auto m = schema.find("maxLength"); m != schema.end() && m->is_number_unsigned() &&
                                             n > m->get<size_t>()) {
      return InvalidArgument(path + ": longer than " + m->dump() + " characters");
    }
  }
  if (v.is_array()) {
    if (auto m = schema.find("minItems"); m != schema.end() && m->is_number_unsigned() &&
                                            v.size() < m->get<size_t>()) {
      return InvalidArgument(path + ": fewer than " + m->dump() + " items");
    }
    if (auto m = schema.find("maxItems"); m != schema.end() && m->is_number_unsigned() &&
                                            v.size() > m->get<size_t>()) {
      return InvalidArgument(path + ": more than " + m->dump() + " items");
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

Status CheckArguments(const Json& schema, const Json& arguments) {
  return Check(schema, arguments, "arguments", 0);
}

}  // namespace keel::tools
