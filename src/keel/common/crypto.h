#pragma once
// Small cryptographic helpers on OpenSSL.

#include <string>
#include <string_view>

namespace keel {

// Lowercase hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);
// Lowercase hex HMAC-SHA256 of `data` under `key`.
std::string HmacSha256Hex(std::string_view key, std::string_view data);
// `n` bytes from the OS CSPRNG, hex-encoded (2n characters).
std::string RandomHex(size_t n);
// A bearer token: "keel_" followed by 43 url-safe characters (256 bits).
std::string NewToken();
std::string Base64UrlEncode(std::string_view data);
// Empty on malformed input.
std::string Base64UrlDecode(std::string_view data);
// Constant-time comparison.
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace keel
