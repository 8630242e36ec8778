#pragma once
// OutboundGuard — which addresses Keel may connect to when a tenant chose the URL (an MCP
// server over HTTP, a webhook plugin's receiver). By default it refuses every address that
// reaches the host or its private networks rather than the public internet: loopback,
// private, shared (CGNAT), link-local (cloud metadata at 169.254.169.254), "this network",
// unique-local and site-local IPv6, multicast, broadcast and the other reserved ranges; an
// IPv6 address that embeds an IPv4 one (IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible ::a.b.c.d,
// NAT64 64:ff9b::/96, 6to4 2002::/16) is judged by the IPv4 address it carries. The platform
// admin opens ranges with `outbound_allow` (CIDRs, keel.toml or KEEL_OUTBOUND_ALLOW); an
// allowed range wins over a refused one.
//
// The check is made on each address a connection is about to use, after the name was
// resolved, so a name that resolves (or re-resolves, DNS rebinding) to an internal address is
// refused like the address itself. http::Client applies it (ClientRequest-independent: it is
// part of the client's Options) and follows no redirects, so no later hop escapes it.
//
// Model providers' base URLs are the operator's own configuration and are not guarded.
//
// A plain value: immutable after construction, safe to share between threads.

#include <array>
#include <boost/asio/ip/address.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "keel/common/status.h"

namespace keel::http {

// An address range: an IPv4 or IPv6 network and its prefix length.
struct Cidr {
  bool v6 = false;
  std::array<uint8_t, 16> bytes{};  // IPv4 in the first 4 bytes
  int prefix = 0;

  // "10.1.2.0/24", "::1/128", or a bare address (a single host). kInvalidArgument otherwise,
  // also for host bits set below the prefix ("10.1.2.3/24"), which usually is a typo.
  static Result<Cidr> Parse(const std::string& text);
  bool Contains(const boost::asio::ip::address& a) const;
};

class OutboundGuard {
 public:
  // Refuses the internal ranges and allows nothing extra: the safe default.
  OutboundGuard() = default;
  explicit OutboundGuard(std::vector<Cidr> allow) : allow_(std::move(allow)) {}
  // Parses `outbound_allow`; errors name the entry.
  static Result<OutboundGuard> FromAllowList(const std::vector<std::string>& cidrs);

  // Ok when `a` may be connected to; kPermissionDenied saying which range refused it and how
  // the platform admin can allow it.
  Status Check(const boost::asio::ip::address& a) const;

 private:
  std::vector<Cidr> allow_;
};

}  // namespace keel::http
