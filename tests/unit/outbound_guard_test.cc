// OutboundGuard: the internal ranges are refused (IPv4, IPv6 and IPv6 forms that carry an
// IPv4 address), public addresses pass, and the admin's allow list opens exactly its ranges.

#include <gtest/gtest.h>

#include "keel/http/outbound_guard.h"

namespace keel::http {
namespace {

boost::asio::ip::address A(const char* text) { return boost::asio::ip::make_address(text); }

TEST(OutboundGuardTest, RefusesInternalAddressesByDefault) {
  OutboundGuard guard;
  for (const char* internal :
       {"127.0.0.1", "127.8.9.10", "10.0.0.1", "10.255.255.255", "172.16.0.1", "172.31.255.1",
        "192.168.1.1", "169.254.169.254", "100.64.0.1", "100.127.255.254", "0.0.0.0", "0.1.2.3",
        "224.0.0.1", "239.255.255.250", "255.255.255.255", "240.0.0.1", "198.18.0.1", "::1",
        "::", "fc00::1", "fd12:3456::1", "fe80::1", "ff02::1", "::ffff:127.0.0.1",
        "::ffff:169.254.169.254", "::ffff:10.0.0.1", "::127.0.0.1", "64:ff9b::a00:1",
        "2002:7f00:1::1", "2002:a9fe:a9fe::1"}) {
    Status st = guard.Check(A(internal));
    EXPECT_EQ(st.code(), Code::kPermissionDenied) << internal;
    EXPECT_NE(st.message().find("outbound_allow"), std::string::npos) << st.message();
  }
}

TEST(OutboundGuardTest, AllowsPublicAddresses) {
  OutboundGuard guard;
  for (const char* pub : {"93.184.216.34", "8.8.8.8", "172.32.0.1", "100.128.0.1",
                          "192.169.0.1", "2606:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1"}) {
    EXPECT_TRUE(guard.Check(A(pub)).ok()) << pub << ": " << guard.Check(A(pub)).message();
  }
}

TEST(OutboundGuardTest, TheAllowListOpensExactlyItsRanges) {
  auto guard = OutboundGuard::FromAllowList({"127.0.0.1/32", "10.1.2.0/24", "fd00::/8"});
  ASSERT_TRUE(guard.ok()) << guard.status().message();
  EXPECT_TRUE(guard->Check(A("127.0.0.1")).ok());
  EXPECT_TRUE(guard->Check(A("::ffff:127.0.0.1")).ok());
  EXPECT_FALSE(guard->Check(A("127.0.0.2")).ok());
  EXPECT_FALSE(guard->Check(A("::1")).ok());
  EXPECT_TRUE(guard->Check(A("10.1.2.200")).ok());
  EXPECT_FALSE(guard->Check(A("10.1.3.1")).ok());
  EXPECT_TRUE(guard->Check(A("fd00::5")).ok());
  EXPECT_FALSE(guard->Check(A("fc00::5")).ok());
  EXPECT_FALSE(guard->Check(A("169.254.169.254")).ok());
  // A bare address is one host.
  auto host = OutboundGuard::FromAllowList({"::1"});
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE(host->Check(A("::1")).ok());
}

TEST(OutboundGuardTest, RejectsMalformedRanges) {
  for (const char* bad : {"", "localhost", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/x", "::1/129",
                          "10.1.2.3/24", "1.2.3", "10.0.0.0/-1"}) {
    auto parsed = OutboundGuard::FromAllowList({bad});
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace keel::http
