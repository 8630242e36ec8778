#include "keel/http/outbound_guard.h"

#include <optional>

namespace keel::http {
namespace {

namespace ip = boost::asio::ip;

struct Refused {
  const char* cidr;
  const char* what;
};

// IPv4 ranges that reach the host or its networks rather than the public internet
// (RFC 6890 and its updates).
constexpr Refused kRefusedV4[] = {
    {"0.0.0.0/8", "a \"this network\" address"},
    {"10.0.0.0/8", "a private address"},
    {"100.64.0.0/10", "a shared (carrier-grade NAT) address"},
    {"127.0.0.0/8", "a loopback address"},
    {"169.254.0.0/16", "a link-local address"},
    {"172.16.0.0/12", "a private address"},
    {"192.0.0.0/24", "an IETF protocol address"},
    {"192.168.0.0/16", "a private address"},
    {"198.18.0.0/15", "a benchmarking address"},
    {"224.0.0.0/4", "a multicast address"},
    {"240.0.0.0/4", "a reserved or broadcast address"},
};

constexpr Refused kRefusedV6[] = {
    {"::/128", "the unspecified address"},
    {"::1/128", "a loopback address"},
    {"fc00::/7", "a unique-local address"},
    {"fe80::/10", "a link-local address"},
    {"fec0::/10", "a site-local address"},
    {"ff00::/8", "a multicast address"},
};

// The IPv4 address an IPv6 one carries in a form that routes to it: IPv4-mapped, IPv4-compatible
// (::a.b.c.d; not :: and ::1, which are refused as themselves), NAT64 and 6to4.
std::optional<ip::address_v4> EmbeddedV4(const ip::address_v6& a) {
  const auto b = a.to_bytes();
  auto v4_at = [&](size_t i) {
    return ip::address_v4(ip::address_v4::bytes_type{b[i], b[i + 1], b[i + 2], b[i + 3]});
  };
  auto zeros = [&](size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) {
      if (b[i] != 0) return false;
    }
    return true;
  };
  if (a.is_v4_mapped()) return v4_at(12);
  if (zeros(0, 12) && !(zeros(12, 15) && b[15] <= 1)) return v4_at(12);
  if (b[0] == 0x00 && b[1] == 0x64 && b[2] == 0xff && b[3] == 0x9b && zeros(4, 12)) {
    return v4_at(12);
  }
  if (b[0] == 0x20 && b[1] == 0x02) return v4_at(2);
  return std::nullopt;
}

bool PrefixMatches(const uint8_t* net, const uint8_t* addr, int prefix) {
  int full = prefix / 8;
  for (int i = 0; i < full; ++i) {
    if (net[i] != addr[i]) return false;
  }
  int rest = prefix % 8;
  if (rest == 0) return true;
  uint8_t mask = static_cast<uint8_t>(0xff << (8 - rest));
  return (net[full] & mask) == (addr[full] & mask);
}

std::string AllowHint(const std::string& address) {
  return "; the platform admin can allow it with outbound_allow (keel.toml) or "
         "KEEL_OUTBOUND_ALLOW, e.g. \"" + address + "/" +
         (address.find(':') == std::string::npos ? "32" : "128") + "\"";
}

}  // namespace

Result<Cidr> Cidr::Parse(const std::string& text) {
  std::string addr = text;
  std::optional<int> prefix;
  if (size_t slash = text.find('/'); slash != std::string::npos) {
    addr = text.substr(0, slash);
    std::string p = text.substr(slash + 1);
    if (p.empty() || p.size() > 3 || p.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgument("'" + text + "' is not an address range (CIDR)");
    }
    prefix = std::stoi(p);
  }
  boost::system::error_code ec;
  ip::address a = ip::make_address(addr, ec);
  if (ec) return InvalidArgument("'" + text + "' is not an address range (CIDR)");
  Cidr c;
  c.v6 = a.is_v6();
  const int max = c.v6 ? 128 : 32;
  c.prefix = prefix.value_or(max);
  if (c.prefix > max) {
    return InvalidArgument("'" + text + "': the prefix is longer than the address");
  }
  if (c.v6) {
    const auto b = a.to_v6().to_bytes();
    std::copy(b.begin(), b.end(), c.bytes.begin());
  } else {
    const auto b = a.to_v4().to_bytes();
    std::copy(b.begin(), b.end(), c.bytes.begin());
  }
  for (int bit = c.prefix; bit < max; ++bit) {
    if (c.bytes[bit / 8] & (0x80 >> (bit % 8))) {
      return InvalidArgument("'" + text + "' has host bits set below its prefix");
    }
  }
  return c;
}

bool Cidr::Contains(const ip::address& a) const {
  if (a.is_v4()) {
    if (v6) return false;
    return PrefixMatches(bytes.data(), a.to_v4().to_bytes().data(), prefix);
  }
  const auto v6bytes = a.to_v6().to_bytes();
  if (v6) return PrefixMatches(bytes.data(), v6bytes.data(), prefix);
  // An IPv4 range also covers the IPv4-mapped form of its addresses (a dual-stack resolver's
  // answer for an IPv4 name).
  if (!a.to_v6().is_v4_mapped()) return false;
  return PrefixMatches(bytes.data(), v6bytes.data() + 12, prefix);
}

Result<OutboundGuard> OutboundGuard::FromAllowList(const std::vector<std::string>& cidrs) {
  std::vector<Cidr> allow;
  for (const auto& text : cidrs) {
    KEEL_ASSIGN_OR_RETURN(Cidr c, Cidr::Parse(text));
    allow.push_back(c);
  }
  return OutboundGuard(std::move(allow));
}

Status OutboundGuard::Check(const ip::address& a) const {
  for (const Cidr& c : allow_) {
    if (c.Contains(a)) return Status::Ok();
  }
  const std::string shown = a.to_string();
  // Parsed on each check: a handful of constant ranges, next to a network round trip.
  auto refused_by = [](const auto& table, const ip::address& x) -> const char* {
    for (const Refused& r : table) {
      auto c = Cidr::Parse(r.cidr);
      if (c.ok() && c->Contains(x)) return r.what;
    }
    return nullptr;
  };
  if (a.is_v4()) {
    if (const char* what = refused_by(kRefusedV4, a)) {
      return PermissionDenied(shown + " is " + what + ", which outbound calls may not reach" +
                              AllowHint(shown));
    }
    return Status::Ok();
  }
  if (const char* what = refused_by(kRefusedV6, a)) {
    return PermissionDenied(shown + " is " + what + ", which outbound calls may not reach" +
                            AllowHint(shown));
  }
  if (auto v4 = EmbeddedV4(a.to_v6())) {
    if (const char* what = refused_by(kRefusedV4, ip::address(*v4))) {
      return PermissionDenied(shown + " carries " + v4->to_string() + ", " + what +
                              ", which outbound calls may not reach" + AllowHint(shown));
    }
  }
  return Status::Ok();
}

}  // namespace keel::http
