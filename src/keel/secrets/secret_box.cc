#include "keel/secrets/secret_box.h"

#include <openssl/evp.h>
#include <openssl/rand.h>

#include <memory>
#include <stdexcept>

#include "keel/common/crypto.h"

namespace keel::secrets {
namespace {

constexpr size_t kKeyBytes = 32;
constexpr size_t kNonceBytes = 12;
constexpr size_t kTagBytes = 16;

struct CtxFree {
  void operator()(EVP_CIPHER_CTX* c) const { EVP_CIPHER_CTX_free(c); }
};
using Ctx = std::unique_ptr<EVP_CIPHER_CTX, CtxFree>;

const unsigned char* U(const std::string& s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}
const unsigned char* U(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}

// Standard or url-safe base64, padding optional, to url-safe without padding.
std::string ToUrlSafe(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '=' || c == '\n' || c == '\r' || c == ' ') continue;
    out += c == '+' ? '-' : c == '/' ? '_' : c;
  }
  return out;
}

}  // namespace

Key Key::Random() {
  std::string bytes(kKeyBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), kKeyBytes) != 1) {
    throw std::runtime_error("the system's random number generator failed");
  }
  return Key(std::move(bytes));
}

Result<Key> Key::FromBase64(std::string_view text, std::string_view what) {
  std::string url = ToUrlSafe(text);
  std::string bytes = Base64UrlDecode(url);
  if (url.empty() || bytes.empty()) {
    return InvalidArgument(std::string(what) + " is not base64 (expected 32 random bytes, e.g. "
                           "from `openssl rand -base64 32`)");
  }
  if (bytes.size() != kKeyBytes) {
    return InvalidArgument(std::string(what) + " decodes to " + std::to_string(bytes.size()) +
                           " bytes; a 256-bit key is 32 bytes (`openssl rand -base64 32`)");
  }
  return Key(std::move(bytes));
}

Result<Key> Key::FromBytes(std::string bytes) {
  if (bytes.size() != kKeyBytes) return Internal("a data key must be 32 bytes");
  return Key(std::move(bytes));
}

std::string Key::Fingerprint() const { return Sha256Hex("keel-key|" + bytes_).substr(0, 16); }

std::string Key::ToBase64() const { return Base64UrlEncode(bytes_); }

std::string Seal(const Key& key, std::string_view plaintext, std::string_view aad) {
  std::string out(kNonceBytes + plaintext.size() + kTagBytes, '\0');
  auto* o = reinterpret_cast<unsigned char*>(out.data());
  if (RAND_bytes(o, kNonceBytes) != 1) {
    throw std::runtime_error("the system's random number generator failed");
  }
  Ctx ctx(EVP_CIPHER_CTX_new());
  int len = 0;
  bool ok = ctx && EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) == 1 &&
            EVP_EncryptInit_ex(ctx.get(), nullptr, nullptr, U(key.bytes()), o) == 1 &&
            EVP_EncryptUpdate(ctx.get(), nullptr, &len, U(aad), static_cast<int>(aad.size())) == 1 &&
            EVP_EncryptUpdate(ctx.get(), o + kNonceBytes, &len, U(plaintext),
                              static_cast<int>(plaintext.size())) == 1 &&
            EVP_EncryptFinal_ex(ctx.get(), o + kNonceBytes + len, &len) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagBytes,
                                o + kNonceBytes + plaintext.size()) == 1;
  if (!ok) throw std::runtime_error("AES-256-GCM encryption failed");
  return Base64UrlEncode(out);
}

Result<std::string> Open(const Key& key, std::string_view sealed, std::string_view aad) {
  std::string raw = Base64UrlDecode(sealed);
  if (raw.size() < kNonceBytes + kTagBytes) return Internal("sealed value is malformed");
  const size_t n = raw.size() - kNonceBytes - kTagBytes;
  auto* r = reinterpret_cast<unsigned char*>(raw.data());
  std::string plain(n, '\0');
  Ctx ctx(EVP_CIPHER_CTX_new());
  int len = 0;
  bool ok = ctx && EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_IVLEN, kNonceBytes, nullptr) == 1 &&
            EVP_DecryptInit_ex(ctx.get(), nullptr, nullptr, U(key.bytes()), r) == 1 &&
            EVP_DecryptUpdate(ctx.get(), nullptr, &len, U(aad), static_cast<int>(aad.size())) == 1 &&
            EVP_DecryptUpdate(ctx.get(), reinterpret_cast<unsigned char*>(plain.data()), &len,
                              r + kNonceBytes, static_cast<int>(n)) == 1 &&
            EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagBytes,
                                r + kNonceBytes + n) == 1;
  int final_len = 0;
  if (!ok || EVP_DecryptFinal_ex(ctx.get(), reinterpret_cast<unsigned char*>(plain.data()) + len,
                                 &final_len) != 1) {
    return Internal("sealed value does not open: another key, another owner, or altered");
  }
  return plain;
}

}  // namespace keel::secrets
