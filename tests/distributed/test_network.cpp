// Which address a process rank's Gloo binds, and the world's check that no rank advertises an
// address its peers cannot reach (the two-host runs are tests/multihost/).

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "../../te/src/distributed/network.h"
#include "te/error.h"

namespace te::detail {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> const char* {
    const auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(Network, LoopbackAddresses) {
  for (const char* a : {"127.0.0.1", "127.0.1.1", "127.255.0.3", "::1", "::ffff:127.0.0.1"}) {
    EXPECT_TRUE(is_loopback_address(a)) << a;
  }
  for (const char* a : {"10.0.0.1", "128.0.0.1", "fe80::1", "::ffff:10.0.0.1", "localhost", ""}) {
    EXPECT_FALSE(is_loopback_address(a)) << a;
  }
}

TEST(Network, TheOptionThenGlooSocketIfnameThenTheRouteToTheMaster) {
  const EnvLookup none = env_of({});
  const BoundAddress by_option =
      choose_gloo_address("lo", "10.9.9.9", 1, env_of({{"GLOO_SOCKET_IFNAME", "nope0"}}));
  EXPECT_EQ(by_option.address, "127.0.0.1");
  EXPECT_EQ(by_option.chosen_by, "DistributedOptions::interface='lo'");
  const BoundAddress by_env =
      choose_gloo_address("", "10.9.9.9", 1, env_of({{"GLOO_SOCKET_IFNAME", "lo"}}));
  EXPECT_EQ(by_env.address, "127.0.0.1");
  EXPECT_EQ(by_env.chosen_by, "GLOO_SOCKET_IFNAME=lo");
  // An address of this host is taken as it is.
  EXPECT_EQ(choose_gloo_address("127.0.0.1", "10.9.9.9", 1, none).address, "127.0.0.1");
  const BoundAddress master = choose_gloo_address("", "localhost", 1234, none);
  EXPECT_TRUE(is_loopback_address(master.address)) << master.address;
  EXPECT_EQ(master.chosen_by, "MASTER_ADDR=localhost (a loopback address)");
  // A non-loopback master: this host's source address towards it, never a loopback one (where
  // this host has a route off itself at all).
  try {
    const BoundAddress routed = choose_gloo_address("", "192.0.2.77", 1234, none);
    EXPECT_FALSE(is_loopback_address(routed.address)) << routed.address;
    EXPECT_EQ(routed.chosen_by, "the route to MASTER_ADDR=192.0.2.77");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no route to MASTER_ADDR=192.0.2.77"),
              std::string::npos)
        << e.what();
  }
}

TEST(Network, BadChoicesAreNamed) {
  const std::string unknown = error_of([] {
    choose_gloo_address("", "10.0.0.1", 1, env_of({{"GLOO_SOCKET_IFNAME", "veth9"}}));
  });
  EXPECT_NE(unknown.find("GLOO_SOCKET_IFNAME: 'veth9' is neither an interface of this host nor an "
                         "address; name one of this host's interfaces or addresses: "),
            std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find("lo 127.0.0.1"), std::string::npos) << unknown;
  EXPECT_NE(error_of([] {
              choose_gloo_address("203.0.113.9", "10.0.0.1", 1, env_of({}));
            }).find("DistributedOptions::interface: '203.0.113.9' is not an address of this host"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              choose_gloo_address("", "10.0.0.1", 1, env_of({{"GLOO_SOCKET_IFNAME", "eth0,lo"}}));
            }).find("GLOO_SOCKET_IFNAME='eth0,lo' names several interfaces; te-cpp binds one"),
            std::string::npos);
}

PeerAddress peer(const std::string& address, const std::string& loopback, const std::string& host) {
  PeerAddress p;
  p.address = address;
  p.probe_port = 1000;
  p.loopback = loopback;
  p.chosen_by = "the route to MASTER_ADDR=10.0.0.1";
  p.host = host;
  return p;
}

TEST(Network, PeerAddressesTravelAsOneLine) {
  PeerAddress p = peer("10.0.0.2", "boot/4026531840", "h1");
  p.chosen_by = "GLOO_SOCKET_IFNAME=a\tb";
  const PeerAddress back = PeerAddress::decode(p.encode());
  EXPECT_EQ(back.address, "10.0.0.2");
  EXPECT_EQ(back.probe_port, 1000);
  EXPECT_EQ(back.loopback, "boot/4026531840");
  EXPECT_EQ(back.chosen_by, "GLOO_SOCKET_IFNAME=a b");
  EXPECT_EQ(back.host, "h1");
}

TEST(Network, ALoopbackAddressIsRefusedOnlyToAnotherHost) {
  // One host, every rank on 127.0.0.1: fine.
  EXPECT_EQ(loopback_conflict({peer("127.0.0.1", "A", "h0"), peer("127.0.0.1", "A", "h0")}), "");
  // Two hosts, real addresses: fine.
  EXPECT_EQ(loopback_conflict({peer("10.0.0.1", "A", "h0"), peer("10.0.0.2", "B", "h1")}), "");
  // Rank 2 advertises 127.0.1.1 (its host name's address) to rank 0 on another host.
  const std::string m = loopback_conflict(
      {peer("10.0.0.1", "A", "h0"), peer("10.0.0.1", "A", "h0"), peer("127.0.1.1", "B", "h1")});
  EXPECT_EQ(m,
            "rank 2 (host h1) would advertise its loopback address 127.0.1.1 (chosen by the route "
            "to MASTER_ADDR=10.0.0.1) to rank 0 on another host (h0, address 10.0.0.1), which "
            "cannot reach it there; set GLOO_SOCKET_IFNAME on rank 2's host to the interface that "
            "reaches rank 0's host (or DistributedOptions::interface)");
}

TEST(Network, ProbesReachListenersAndNameThoseThatDoNotAnswer) {
  ProbeListener listening({"127.0.0.2", "test"});
  int closed_port = 0;
  {
    ProbeListener gone({"127.0.0.3", "test"});
    closed_port = gone.port();
  }
  std::vector<PeerAddress> peers{peer("127.0.0.1", "A", "h"), peer("127.0.0.2", "A", "h"),
                                 peer("127.0.0.3", "A", "h"), peer("127.0.0.1", "A", "h")};
  peers[1].probe_port = listening.port();
  peers[2].probe_port = closed_port;
  peers[3].probe_port = 1;  // shares rank 0's own address: not probed
  const auto failures = probe_peers(peers, 0, std::chrono::seconds(5));
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_EQ(failures[0],
            "rank 2's address 127.0.0.3:" + std::to_string(closed_port) + " (Connection refused)");
  EXPECT_NE(error_of([] {
              ProbeListener({"203.0.113.9", "GLOO_SOCKET_IFNAME=x"});
            }).find("this rank cannot listen on 203.0.113.9 (chosen by GLOO_SOCKET_IFNAME=x)"),
            std::string::npos);
}

}  // namespace
}  // namespace te::detail
