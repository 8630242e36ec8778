#pragma once
// Small cryptographic helpers on OpenSSL.

#include <optional>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace keel {

// SHA-256 fed piece by piece, on a digest fetched once (OpenSSL 3's one-shot SHA256() looks the
// algorithm up on every call, which costs more than hashing a small input). Add() frames each
// field as its length, ':' and its bytes, so that no two sequences of fields hash alike.
class FieldDigest {
 public:
  FieldDigest();
  ~FieldDigest();
  // A copy goes on from where the original is (a kept midstate).
  FieldDigest(const FieldDigest& other);
  FieldDigest& operator=(const FieldDigest&) = delete;

  void Raw(std::string_view v);
  void Add(std::string_view v);
  // Lowercase hex; the digest is finished.
  std::string HexDigest();
  // Lowercase hex of what was fed so far; more may be fed after.
  std::string HexDigestSoFar() const;

 private:
  evp_md_ctx_st* ctx_;
};

// Lowercase hex SHA-256 of `data`.
std::string Sha256Hex(std::string_view data);
// Lowercase hex HMAC-SHA256 of `data` under `key`.
std::string HmacSha256Hex(std::string_view key, std::string_view data);
// The raw 32-byte HMAC-SHA256 of `data` under `key`.
std::string HmacSha256(std::string_view key, std::string_view data);
// `n` bytes from the OS CSPRNG, hex-encoded (2n characters).
std::string RandomHex(size_t n);
// A bearer token: "keel_" followed by 43 url-safe characters (256 bits).
std::string NewToken();
std::string Base64UrlEncode(std::string_view data);
// Empty on malformed input.
std::string Base64UrlDecode(std::string_view data);
// Standard base64 (RFC 4648 section 4), padded.
std::string Base64Encode(std::string_view data);
// Standard or url-safe base64, padding optional. Empty on malformed input.
std::string Base64Decode(std::string_view data);
// Constant-time comparison.
bool ConstantTimeEquals(std::string_view a, std::string_view b);
// The bytes `hex` spells (either case); nullopt when it is not an even run of hex digits.
std::optional<std::string> HexDecode(std::string_view hex);
// Whether `signature` (64 bytes) is the Ed25519 signature (RFC 8032) of `message` under the
// 32-byte public key `public_key`.
bool Ed25519Verify(std::string_view public_key, std::string_view message,
                   std::string_view signature);

}  // namespace keel
