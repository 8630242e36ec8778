#include "keel/common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include <charconv>
#include <stdexcept>

namespace keel {
namespace {
constexpr char kHex[] = "0123456789abcdef";
constexpr char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

std::string Hex(const unsigned char* p, size_t n) {
  std::string out(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kHex[p[i] >> 4];
    out[2 * i + 1] = kHex[p[i] & 15];
  }
  return out;
}
}  // namespace

FieldDigest::FieldDigest() : ctx_(EVP_MD_CTX_new()) {
  static EVP_MD* const kSha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  if (!ctx_ || !kSha256 || EVP_DigestInit_ex(ctx_, kSha256, nullptr) != 1) {
    EVP_MD_CTX_free(ctx_);
    throw std::runtime_error("SHA-256 is not available");
  }
}

FieldDigest::FieldDigest(const FieldDigest& other) : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_MD_CTX_copy_ex(ctx_, other.ctx_) != 1) {
    EVP_MD_CTX_free(ctx_);
    throw std::runtime_error("cannot copy a SHA-256 state");
  }
}

FieldDigest::~FieldDigest() { EVP_MD_CTX_free(ctx_); }

void FieldDigest::Raw(std::string_view v) { EVP_DigestUpdate(ctx_, v.data(), v.size()); }

void FieldDigest::Add(std::string_view v) {
  char len[24];
  auto end = std::to_chars(len, len + sizeof len, v.size()).ptr;
  *end++ = ':';
  Raw(std::string_view(len, static_cast<size_t>(end - len)));
  Raw(v);
}

std::string FieldDigest::HexDigest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx_, md, &n);
  return Hex(md, n);
}

std::string FieldDigest::HexDigestSoFar() const { return FieldDigest(*this).HexDigest(); }

std::string Sha256Hex(std::string_view data) {
  FieldDigest d;
  d.Raw(data);
  return d.HexDigest();
}

std::string HmacSha256Hex(std::string_view key, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len);
  return Hex(md, len);
}

std::string HmacSha256(std::string_view key, std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), md, &len);
  return std::string(reinterpret_cast<const char*>(md), len);
}

std::string RandomHex(size_t n) {
  std::string bytes(n, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(n)) != 1) {
    throw std::runtime_error("RAND_bytes failed");
  }
  return Hex(reinterpret_cast<const unsigned char*>(bytes.data()), n);
}

std::string NewToken() {
  std::string bytes(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(bytes.data()), 32) != 1) {
    throw std::runtime_error("RAND_bytes failed");
  }
  return "keel_" + Base64UrlEncode(bytes);
}

std::string Base64UrlEncode(std::string_view data) {
  std::string out;
  out.reserve((data.size() * 4 + 2) / 3);
  size_t i = 0;
  auto at = [&](size_t k) { return static_cast<unsigned char>(data[k]); };
  for (; i + 2 < data.size(); i += 3) {
    unsigned v = (at(i) << 16) | (at(i + 1) << 8) | at(i + 2);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
    out += kB64[v & 63];
  }
  if (i + 1 == data.size()) {
    unsigned v = at(i) << 16;
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
  } else if (i + 2 == data.size()) {
    unsigned v = (at(i) << 16) | (at(i + 1) << 8);
    out += kB64[(v >> 18) & 63];
    out += kB64[(v >> 12) & 63];
    out += kB64[(v >> 6) & 63];
  }
  return out;
}

std::string Base64Encode(std::string_view data) {
  std::string out = Base64UrlEncode(data);
  for (char& c : out) {
    if (c == '-') c = '+';
    if (c == '_') c = '/';
  }
  out.append((4 - out.size() % 4) % 4, '=');
  return out;
}

std::string Base64Decode(std::string_view data) {
  while (!data.empty() && data.back() == '=') data.remove_suffix(1);
  std::string url(data);
  for (char& c : url) {
    if (c == '+')
      c = '-';
    else if (c == '/')
      c = '_';
  }
  return Base64UrlDecode(url);
}

std::string Base64UrlDecode(std::string_view data) {
  auto val = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '-') return 62;
    if (c == '_') return 63;
    return -1;
  };
  if (data.size() % 4 == 1) return {};
  std::string out;
  unsigned acc = 0;
  int bits = 0;
  for (char c : data) {
    int v = val(c);
    if (v < 0) return {};
    acc = (acc << 6) | unsigned(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

bool ConstantTimeEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::optional<std::string> HexDecode(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    int hi = nibble(hex[2 * i]), lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

bool Ed25519Verify(std::string_view public_key, std::string_view message,
                   std::string_view signature) {
  if (public_key.size() != 32 || signature.size() != 64) return false;
  EVP_PKEY* key = EVP_PKEY_new_raw_public_key(
      EVP_PKEY_ED25519, nullptr, reinterpret_cast<const unsigned char*>(public_key.data()), 32);
  if (!key) return false;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok =
      ctx && EVP_DigestVerifyInit(ctx, nullptr, nullptr, nullptr, key) == 1 &&
      EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(signature.data()), 64,
                       reinterpret_cast<const unsigned char*>(message.data()), message.size()) == 1;
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(key);
  return ok;
}

}  // namespace keel
