#include "keel/common/json_util.h"

#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace keel {

namespace {

// nlohmann's parser itself is iterative, but every later walk of a value (dump, copy, compare,
// destroy, schema checks, the Lua conversion) recurses once per level. A bound at the one entry
// point keeps all of them bounded; no JSON document Keel reads needs more than a few levels.
constexpr int kMaxDepth = kMaxJsonDepth;

// Builds the value as nlohmann's own DOM parser does and stops at the first thing Keel refuses
// although JSON allows it: nesting deeper than kMaxDepth, a key twice in one object (which copy
// wins differs between readers), and, for request bodies, a NUL character in a key or string (C
// APIs and libpq end text at it). Returning false from a callback ends the parse at once, so a
// refused text costs one linear scan at most. A key is looked up in the object being built
// before it is moved in, and strings are moved from the lexer, so nothing is copied twice.
class StrictSax {
 public:
  StrictSax(Json& root, bool refuse_nul) : root_(root), refuse_nul_(refuse_nul) {}

  bool null() { return Put(nullptr) != nullptr; }
  bool boolean(bool v) { return Put(v) != nullptr; }
  bool number_integer(Json::number_integer_t v) { return Put(v) != nullptr; }
  bool number_unsigned(Json::number_unsigned_t v) { return Put(v) != nullptr; }
  bool number_float(Json::number_float_t v, const std::string& /*text*/) {
    return Put(v) != nullptr;
  }
  bool string(std::string& v) {
    if (refuse_nul_ && v.find('\0') != std::string::npos) {
      return Fail("a JSON string holds a NUL character (\\u0000), which is not accepted");
    }
    return Put(std::move(v)) != nullptr;
  }
  bool binary(Json::binary_t& v) { return Put(Json::binary(std::move(v))) != nullptr; }
  bool start_object(std::size_t /*n*/) {
    if (!Enter()) return false;
    stack_.push_back(Put(Json::object()));
    return true;
  }
  bool key(std::string& k) {
    if (refuse_nul_ && k.find('\0') != std::string::npos) {
      return Fail("a JSON key holds a NUL character (\\u0000), which is not accepted");
    }
    auto& members = stack_.back()->get_ref<Json::object_t&>();
    // try_emplace leaves `k` as it was when the key is there already.
    auto [at, inserted] = members.try_emplace(std::move(k));
    if (!inserted) return Fail("the key '" + Printable(k) + "' appears twice in one JSON object");
    member_ = &at->second;
    return true;
  }
  bool end_object() {
    --depth_;
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*n*/) {
    if (!Enter()) return false;
    stack_.push_back(Put(Json::array()));
    return true;
  }
  bool end_array() {
    --depth_;
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) {
    // "[json.exception.parse_error.101] parse error at line 1, ..." -> "parse error at line 1, ..."
    std::string why = ex.what();
    if (size_t at = why.find("] "); why.rfind("[json.exception.", 0) == 0 && at != std::string::npos) {
      why = why.substr(at + 2);
    }
    if (why.size() > 300) why = why.substr(0, 300) + "...";  // the last token may be a long string
    syntax_ = std::move(why);
    return false;
  }

  // Set when the text broke one of Keel's rules; otherwise syntax() says what was wrong.
  const std::string& refusal() const { return refusal_; }
  const std::string& syntax() const { return syntax_; }

 private:
  // Places a value: the root, the next element of the open array, or the member whose key came
  // last. The pointer stays valid while the value is open: an array grows only after its open
  // element is closed, and map nodes do not move.
  template <typename V>
  Json* Put(V&& v) {
    if (stack_.empty()) {
      root_ = Json(std::forward<V>(v));
      return &root_;
    }
    Json* open = stack_.back();
    if (open->is_array()) {
      auto& elements = open->get_ref<Json::array_t&>();
      elements.emplace_back(std::forward<V>(v));
      return &elements.back();
    }
    *member_ = Json(std::forward<V>(v));
    return member_;
  }
  bool Enter() {
    if (++depth_ > kMaxDepth) {
      return Fail("JSON is nested deeper than " + std::to_string(kMaxDepth) +
                  " levels of arrays and objects, the limit");
    }
    return true;
  }
  bool Fail(std::string why) {
    refusal_ = std::move(why);
    return false;
  }
  // A key quoted in a message: bounded, and valid UTF-8 is already guaranteed by the lexer.
  static std::string Printable(const std::string& k) {
    return k.size() <= 64 ? k : k.substr(0, 64) + "...";
  }

  Json& root_;
  bool refuse_nul_;
  int depth_ = 0;
  std::vector<Json*> stack_;  // the open arrays and objects, innermost last
  Json* member_ = nullptr;    // in the innermost open object, the member whose key came last
  std::string refusal_;
  std::string syntax_;
};

// `what` names the text in a syntax error ("request body").
Result<Json> Parse(std::string_view text, bool refuse_nul, std::string_view what) {
  Json j;
  StrictSax sax(j, refuse_nul);
  if (!Json::sax_parse(text, &sax, Json::input_format_t::json, /*strict=*/true)) {
    if (!sax.refusal().empty()) return InvalidArgument(sax.refusal());
    std::string message = std::string(what) + (what.empty() ? "" : " is ") + "not valid JSON";
    if (!sax.syntax().empty()) message += ": " + sax.syntax();
    return InvalidArgument(std::move(message));
  }
  return j;
}

}  // namespace

// The one entry point for JSON text from outside the process (request bodies, model provider
// answers and stream chunks, MCP messages, archive rows, plugin payloads, stored columns).
Result<Json> ParseJson(std::string_view text) { return Parse(text, /*refuse_nul=*/false, ""); }

// A request body: also refuses NUL characters, since every string of a body may become a column
// (text a NUL would cut short on one backend and not on the other). Values produced inside the
// process, such as a tool's output, may hold one and are read back through ParseJson.
Result<Json> ParseJsonObject(std::string_view text) {
  if (text.empty()) return Json::object();
  KEEL_ASSIGN_OR_RETURN(Json j, Parse(text, /*refuse_nul=*/true, "request body"));
  if (!j.is_object()) return InvalidArgument("request body must be a JSON object");
  return j;
}

Result<std::string> OptString(const Json& obj, const char* field, std::string fallback) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) return InvalidArgument(std::string("field '") + field + "' must be a string");
  return it->get<std::string>();
}

Result<std::string> ReqString(const Json& obj, const char* field) {
  auto it = obj.find(field);
  if (it == obj.end() || it->is_null()) {
    return InvalidArgument(std::string("field '") + field + "' is required");
  }
  if (!it->is_string()) return InvalidArgument(std::string("field '") + field + "' must be a string");
  std::string v = it->get<std::string>();
  if (v.empty()) return InvalidArgument(std::string("field '") + field + "' must not be empty");
  return v;
}

namespace {

// Writes `j` as nlohmann's dump(-1) with invalid UTF-8 replaced writes it, a third of the
// instructions: strings go through AppendJsonString (plain runs at once, not byte by byte through
// a UTF-8 decoder), integers through to_chars. Floating-point numbers (rare here) and the types
// JSON text cannot hold are left to nlohmann, so that every digit stays the same.
void AppendJson(std::string& out, const Json& j) {
  switch (j.type()) {
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : j.get_ref<const Json::object_t&>()) {
        if (!first) out += ',';
        first = false;
        AppendJsonString(out, key);
        out += ':';
        AppendJson(out, value);
      }
      out += '}';
      return;
    }
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const Json& value : j.get_ref<const Json::array_t&>()) {
        if (!first) out += ',';
        first = false;
        AppendJson(out, value);
      }
      out += ']';
      return;
    }
    case Json::value_t::string:
      AppendJsonString(out, j.get_ref<const std::string&>());
      return;
    case Json::value_t::boolean:
      out += j.get<bool>() ? "true" : "false";
      return;
    case Json::value_t::null:
      out += "null";
      return;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned: {
      char buf[24];
      const char* end = j.is_number_unsigned()
                            ? std::to_chars(buf, buf + sizeof buf, j.get<uint64_t>()).ptr
                            : std::to_chars(buf, buf + sizeof buf, j.get<int64_t>()).ptr;
      out.append(buf, static_cast<size_t>(end - buf));
      return;
    }
    default:
      out += j.dump(-1, ' ', false, Json::error_handler_t::replace);
      return;
  }
}

}  // namespace

std::string DumpJson(const Json& j) {
  std::string out;
  AppendJson(out, j);
  return out;
}

namespace {

// The length of the valid UTF-8 sequence at s[i] (1 to 4), or 0 when it is not one.
size_t Utf8Length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
  if (n == 0 || c > 0xF4 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
  }
  // Overlong forms, surrogates and code points above U+10FFFF.
  if (c == 0xE0 && b(i + 1) < 0xA0) return 0;
  if (c == 0xED && b(i + 1) > 0x9F) return 0;
  if (c == 0xF0 && b(i + 1) < 0x90) return 0;
  if (c == 0xF4 && b(i + 1) > 0x8F) return 0;
  return n;
}

// Where the run of bytes from s[i] that go into a JSON string as they are (printable ASCII but
// '"' and '\\') ends: sixteen bytes at a time where SSE2 is there (every x86-64).
size_t PlainRunEnd(std::string_view s, size_t i) {
#if defined(__SSE2__)
  const __m128i space = _mm_set1_epi8(0x20);
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  while (i + 16 <= s.size()) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s.data() + i));
    // A signed compare: bytes from 0x80 are negative, so "below 0x20" also finds them.
    const __m128i stop =
        _mm_or_si128(_mm_cmplt_epi8(v, space),
                     _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
    if (const int mask = _mm_movemask_epi8(stop); mask != 0) return i + __builtin_ctz(mask);
    i += 16;
  }
#endif
  for (; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x20 || b >= 0x80 || b == '"' || b == '\\') break;
  }
  return i;
}

}  // namespace

void AppendJsonString(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  const size_t start = out.size();
  out.reserve(start + s.size() + 2);
  out += '"';
  for (size_t i = 0; i < s.size();) {
    // A run of printable ASCII that needs no escape goes in at once.
    const size_t plain = PlainRunEnd(s, i);
    if (plain > i) {
      out.append(s.data() + i, plain - i);
      i = plain;
      if (i == s.size()) break;
    }
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && c != '"' && c != '\\') {
      const size_t n = u < 0x80 ? 1 : Utf8Length(s, i);
      if (n == 0) {  // invalid UTF-8: as DumpJson replaces it
        out.resize(start);
        out += Json(std::string(s)).dump(-1, ' ', false, Json::error_handler_t::replace);
        return;
      }
      out.append(s.data() + i, n);
      i += n;
      continue;
    }
    out += '\\';
    switch (c) {
      case '"':
        out += '"';
        break;
      case '\\':
        out += '\\';
        break;
      case '\b':
        out += 'b';
        break;
      case '\f':
        out += 'f';
        break;
      case '\n':
        out += 'n';
        break;
      case '\r':
        out += 'r';
        break;
      case '\t':
        out += 't';
        break;
      default:
        out += "u00";
        out += kHex[u >> 4];
        out += kHex[u & 0xF];
    }
    ++i;
  }
  out += '"';
}

std::string TruncateUtf8(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return std::string(s);
  size_t end = max_bytes;
  // Back off continuation bytes (10xxxxxx) to the start of the sequence cut in two.
  while (end > 0 && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) --end;
  return std::string(s.substr(0, end));
}

std::string ErrorBody(const Status& status) {
  Json body = {{"error", {{"code", std::string(CodeName(status.code()))}, {"message", status.message()}}}};
  return DumpJson(body);
}

std::string_view CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid_argument";
    case Code::kUnauthenticated: return "unauthenticated";
    case Code::kPermissionDenied: return "permission_denied";
    case Code::kNotFound: return "not_found";
    case Code::kConflict: return "conflict";
    case Code::kPayloadTooLarge: return "payload_too_large";
    case Code::kRateLimited: return "rate_limited";
    case Code::kUnavailable: return "unavailable";
    case Code::kInternal: return "internal";
  }
  return "internal";
}

int HttpStatusOf(Code code) {
  switch (code) {
    case Code::kOk: return 200;
    case Code::kInvalidArgument: return 400;
    case Code::kUnauthenticated: return 401;
    case Code::kPermissionDenied: return 403;
    case Code::kNotFound: return 404;
    case Code::kConflict: return 409;
    case Code::kPayloadTooLarge: return 413;
    case Code::kRateLimited: return 429;
    case Code::kUnavailable: return 503;
    case Code::kInternal: return 500;
  }
  return 500;
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(CodeName(code_)) + ": " + message_;
}

}  // namespace keel
