#include "keel/plugins/bus.h"

#include <algorithm>
#include <exception>

#include "keel/plugins/catalog.h"

namespace keel::plugins {

namespace {

boost::asio::awaitable<Result<Json>> Answered(Result<Json> result) { co_return result; }

}  // namespace

Json Unchanged() { return Json(Json::value_t::discarded); }

HookFn Immediate(std::function<Result<Json>(const Json& payload)> fn) {
  return [fn = std::move(fn)](const Json& payload) { return Answered(fn(payload)); };
}

Status EventBus::On(std::string_view event, HookFn fn, HookOptions options) {
  const EventType* type = FindEvent(event);
  if (!type) return InvalidArgument("unknown event '" + std::string(event) + "'");
  Hook hook{type->family, type->version, std::move(fn), std::move(options), hooks_.size()};
  auto at = std::upper_bound(hooks_.begin(), hooks_.end(), hook, [](const Hook& a, const Hook& b) {
    return a.options.priority != b.options.priority ? a.options.priority < b.options.priority
                                                    : a.seq < b.seq;
  });
  hooks_.insert(at, std::move(hook));
  return Status::Ok();
}

bool EventBus::Has(std::string_view family) const {
  return std::any_of(hooks_.begin(), hooks_.end(),
                     [&](const Hook& h) { return h.family == family; });
}

boost::asio::awaitable<Emitted> EventBus::Emit(std::string_view family, Json payload) const {
  Emitted out;
  out.payload = std::move(payload);
  const int newest = NewestVersion(family);
  if (newest == 0) co_return out;
  Shape shape = Shape::kListener;
  for (const auto& e : Catalog()) {
    if (e.family == family) shape = e.shape;
  }
  for (const auto& h : hooks_) {
    if (h.family != family) continue;
    Json converted;
    if (h.version != newest) converted = ConvertDown(family, h.version, out.payload);
    const Json& input = h.version == newest ? out.payload : converted;
    Result<Json> result = InvalidArgument("no result");
    try {
      result = co_await h.fn(input);
    } catch (const std::exception& e) {
      result = Internal(std::string("threw: ") + e.what());
    } catch (...) {
      result = Internal("threw a non-standard exception");
    }
    if (result.ok() && shape == Shape::kTransform && result->is_discarded()) continue;
    if (result.ok() && shape == Shape::kTransform && !result->is_object()) {
      result = InvalidArgument("a transform must return the payload (an object)");
    }
    if (result.ok() && shape == Shape::kVeto &&
        !(result->is_object() && result->contains("allow") && (*result)["allow"].is_boolean())) {
      result = InvalidArgument("a veto must return {allow: true|false, reason: text}");
    }
    if (!result.ok()) {
      PluginError error{h.options.plugin_id, h.family + "@v" + std::to_string(h.version),
                        result.status().message()};
      if (h.options.fail_turn) {
        out.abort = std::move(error);
        co_return out;
      }
      out.errors.push_back(std::move(error));
      continue;
    }
    if (shape == Shape::kTransform) {
      out.changed = true;
      if (h.version == newest) {
        out.payload = std::move(*result);
      } else {
        // An older version's result: its fields replace those of the newest payload.
        for (auto it = result->begin(); it != result->end(); ++it) out.payload[it.key()] = it.value();
      }
    } else if (shape == Shape::kVeto && !(*result)["allow"].get<bool>()) {
      out.denied = true;
      const Json& reason = (*result).contains("reason") ? (*result)["reason"] : Json();
      out.reason = reason.is_string() && !reason.get_ref<const std::string&>().empty()
                       ? reason.get<std::string>() : "no reason given";
      out.denied_by = h.options.plugin_id;
      co_return out;
    }
  }
  co_return out;
}

}  // namespace keel::plugins
