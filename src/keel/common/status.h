#pragma once
// Status and Result<T>: expected failures as values. Each code maps one-to-one to an API error
// code (see HttpStatusOf and CodeName), so a failure deep in the store surfaces as the right
// HTTP answer without translation tables elsewhere.

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace keel {

enum class Code {
  kOk,
  kInvalidArgument,
  kUnauthenticated,
  kPermissionDenied,
  kNotFound,
  kConflict,
  kPayloadTooLarge,
  kRateLimited,
  kUnavailable,
  kInternal,
};

// The API's name for a code ("not_found", ...).
std::string_view CodeName(Code code);
int HttpStatusOf(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return {}; }
  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
inline Status Conflict(std::string m) { return {Code::kConflict, std::move(m)}; }
inline Status Unauthenticated(std::string m) { return {Code::kUnauthenticated, std::move(m)}; }
inline Status PermissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
inline Status Unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
inline Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }

// A value or the Status explaining why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  // Asio's completion machinery needs a default; it holds an internal error, never a value.
  Result() : v_(Status(Code::kInternal, "no result")) {}
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  // REQUIRES: ok()
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace keel

// Returns early from a function returning Status or Result<T> when `expr` is not ok.
#define KEEL_RETURN_IF_ERROR(expr)              \
  do {                                          \
    auto keel_status_ = (expr);                 \
    if (!keel_status_.ok()) return keel_status_; \
  } while (0)

#define KEEL_CONCAT_INNER(a, b) a##b
#define KEEL_CONCAT(a, b) KEEL_CONCAT_INNER(a, b)
#define KEEL_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
// `KEEL_ASSIGN_OR_RETURN(auto x, Foo());` binds x to Foo()'s value or returns its Status.
#define KEEL_ASSIGN_OR_RETURN(lhs, expr) \
  KEEL_ASSIGN_OR_RETURN_IMPL(KEEL_CONCAT(keel_result_, __LINE__), lhs, expr)
