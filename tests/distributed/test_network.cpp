// Which address a process rank's Gloo binds, and the world's check that no rank advertises an
// address its peers cannot reach (the two-host runs are tests/multihost/).

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "../../te/src/distributed/network.h"
#include "../expect_error.h"
#include "../fake_env.h"

namespace te::detail {
namespace {

using test::env_of;

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
  const BoundAddress by_option = choose_gloo_address("lo", "10.9.9.9", 1, "MASTER_ADDR",
                                                     env_of({{"GLOO_SOCKET_IFNAME", "nope0"}}));
  EXPECT_EQ(by_option.address, "127.0.0.1");
  EXPECT_EQ(by_option.chosen_by, "DistributedOptions::interface='lo'");
  const BoundAddress by_env =
      choose_gloo_address("", "10.9.9.9", 1, "MASTER_ADDR", env_of({{"GLOO_SOCKET_IFNAME", "lo"}}));
  EXPECT_EQ(by_env.address, "127.0.0.1");
  EXPECT_EQ(by_env.chosen_by, "GLOO_SOCKET_IFNAME=lo");
  // An address of this host is taken as it is.
  EXPECT_EQ(choose_gloo_address("127.0.0.1", "10.9.9.9", 1, "MASTER_ADDR", none).address,
            "127.0.0.1");
  const BoundAddress master = choose_gloo_address("", "localhost", 1234, "MASTER_ADDR", none);
  EXPECT_TRUE(is_loopback_address(master.address)) << master.address;
  EXPECT_EQ(master.chosen_by, "MASTER_ADDR=localhost (a loopback address)");
  // A non-loopback master: this host's source address towards it, never a loopback one (where
  // this host has a route off itself at all).
  try {
    const BoundAddress routed = choose_gloo_address("", "192.0.2.77", 1234, "MASTER_ADDR", none);
    EXPECT_FALSE(is_loopback_address(routed.address)) << routed.address;
    EXPECT_EQ(routed.chosen_by, "the route to MASTER_ADDR=192.0.2.77");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("has no route to MASTER_ADDR=192.0.2.77"),
              std::string::npos)
        << e.what();
  }
}

TEST(Network, AMasterGivenByANameThatIsThisHostsLoopbackIsProvisional) {
  // A master written as a name is not taken to mean one host, even where the name resolves to a
  // loopback address (this host's own name on a stock Debian host): init_distributed then takes
  // the route to a rank on another host, if there is one.
  // (Where this host's name does not resolve at all, as in a bare chroot, that is the error.)
  const std::string from = "the first host of SLURM_STEP_NODELIST";
  try {
    const BoundAddress b = choose_gloo_address("", host_name(), 1234, from);
    EXPECT_EQ(b.provisional, is_loopback_address(b.address)) << b.address;
    EXPECT_EQ(b.chosen_by, "the route to " + host_name() + " (" + from + ")");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(host_name() + " (" + from + ") does not resolve"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(choose_gloo_address("", "127.0.0.1", 1, "MASTER_ADDR", env_of({})).provisional);
  const BoundAddress peer = route_to("127.0.0.1", "rank 1's address 127.0.0.1");
  EXPECT_EQ(peer.address, "127.0.0.1");
  EXPECT_EQ(peer.chosen_by, "the route to rank 1's address 127.0.0.1");
  EXPECT_EQ(with_port("10.0.0.1", 80), "10.0.0.1:80");
  EXPECT_EQ(with_port("fd00::1", 80), "[fd00::1]:80");
}

TEST(Network, BadChoicesAreNamed) {
  const EnvLookup veth9 = env_of({{"GLOO_SOCKET_IFNAME", "veth9"}});
  EXPECT_ERROR(choose_gloo_address("", "10.0.0.1", 1, "MASTER_ADDR", veth9),
               "GLOO_SOCKET_IFNAME: 'veth9' is neither an interface of this host nor an address; "
               "name one of this host's interfaces or addresses: ");
  EXPECT_ERROR(choose_gloo_address("", "10.0.0.1", 1, "MASTER_ADDR", veth9), "lo 127.0.0.1");
  EXPECT_ERROR(choose_gloo_address("203.0.113.9", "10.0.0.1", 1, "MASTER_ADDR", env_of({})),
               "DistributedOptions::interface: '203.0.113.9' is not an address of this host");
  EXPECT_ERROR(choose_gloo_address("", "10.0.0.1", 1, "MASTER_ADDR",
                                   env_of({{"GLOO_SOCKET_IFNAME", "eth0,lo"}})),
               "GLOO_SOCKET_IFNAME='eth0,lo' names several interfaces; te-cpp binds one");
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

TEST(Network, ALoopbackOrSharedAddressIsRefusedOnlyAcrossHosts) {
  // One host, every rank on 127.0.0.1: fine.
  EXPECT_EQ(address_conflict({peer("127.0.0.1", "A", "h0"), peer("127.0.0.1", "A", "h0")}), "");
  // Two hosts, real addresses: fine.
  EXPECT_EQ(address_conflict({peer("10.0.0.1", "A", "h0"), peer("10.0.0.2", "B", "h1")}), "");
  // Two hosts that both advertise 172.17.0.2 (two containers' default addresses).
  EXPECT_EQ(address_conflict({peer("172.17.0.2", "A", "h0"), peer("172.17.0.2", "B", "h1")}),
            "ranks 0 (host h0) and 1 (host h1) are on different hosts but both advertise the "
            "address 172.17.0.2 (chosen by the route to MASTER_ADDR=10.0.0.1 and by the route to "
            "MASTER_ADDR=10.0.0.1), so their peers cannot tell them apart; set GLOO_SOCKET_IFNAME "
            "on each host to an interface with an address of its own");
  // Rank 2 advertises 127.0.1.1 (its host name's address) to rank 0 on another host.
  const std::string m = address_conflict(
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
  EXPECT_ERROR(ProbeListener({"203.0.113.9", "GLOO_SOCKET_IFNAME=x"}),
               "this rank cannot listen on 203.0.113.9 (chosen by GLOO_SOCKET_IFNAME=x)");
  // A peer on another host at an address this rank also holds is probed (it may not be this
  // rank's own listener that answers there).
  peers[3].loopback = "B";
  peers[3].probe_port = closed_port;
  EXPECT_EQ(probe_peers(peers, 0, std::chrono::seconds(5)).size(), 2u);
}

}  // namespace
}  // namespace te::detail
