#pragma once
// Envelope encryption for secrets (AES-256-GCM on OpenSSL). A key-encryption key (KEK) from the
// environment wraps one random data key per tenant; the data key seals each secret value. Every
// sealed blob is bound to where it belongs by associated data, so a blob copied to another
// tenant or name does not open.
//
// A sealed blob is base64url text: 12-byte nonce || ciphertext || 16-byte tag.

#include <string>
#include <string_view>

#include "keel/common/status.h"

namespace keel::secrets {

// The 32 raw bytes of an AES-256 key.
class Key {
 public:
  // A fresh random key.
  static Key Random();
  // From base64 (standard or url-safe, padding optional) of exactly 32 bytes; `what` names the
  // source in errors ("KEEL_SECRET_KEK").
  static Result<Key> FromBase64(std::string_view text, std::string_view what);
  static Result<Key> FromBytes(std::string bytes);
  const std::string& bytes() const { return bytes_; }
  // A short fingerprint (16 hex digits of SHA-256) that tells keys apart without revealing them.
  std::string Fingerprint() const;
  std::string ToBase64() const;

 private:
  explicit Key(std::string bytes) : bytes_(std::move(bytes)) {}
  std::string bytes_;
};

// Encrypts `plaintext` under `key`, bound to `aad`.
std::string Seal(const Key& key, std::string_view plaintext, std::string_view aad);
// Decrypts what Seal produced; kInternal when the blob is malformed, was sealed under another
// key or for other associated data, or was altered.
Result<std::string> Open(const Key& key, std::string_view sealed, std::string_view aad);

}  // namespace keel::secrets
