#pragma once

// Which address a process rank's Gloo communicators bind and advertise to their peers, and the
// check, once per world, that every rank can reach every other rank's. LibTorch-free.

#include <chrono>
#include <string>
#include <vector>

#include "te/runtime/launch.h"

namespace te::detail {

/// An address this rank binds, and what chose it (for messages: "GLOO_SOCKET_IFNAME=veth1").
struct BoundAddress {
  std::string address;
  std::string chosen_by;
  /// A loopback address reached through a master given by a host name (rank 0's own name on
  /// its host, which stock Debian and Ubuntu resolve to 127.0.1.1): right for a world on one
  /// host; in a world of several, the rank takes its route to a rank on another host instead.
  bool provisional = false;
};

/// True for 127.0.0.0/8, ::1 and ::ffff:127.x.y.z.
bool is_loopback_address(const std::string& address);

/// The address Gloo binds, in order: `option` (DistributedOptions::interface: an interface name
/// or one of this host's addresses); GLOO_SOCKET_IFNAME (one interface name or address); a
/// master written as a loopback address (or localhost): that address; else this host's source
/// address on the route to `master_addr` (the route the store connection took, so it reaches
/// rank 0's host), provisional when that is a loopback address. `master_from` names where the
/// master came from, for messages ("MASTER_ADDR", "the first host of SLURM_STEP_NODELIST").
/// Throws te::Error naming the variable for an unknown interface, an interface without an
/// address other hosts could reach, an address no interface of this host holds, or a list of
/// interfaces (te-cpp binds one).
BoundAddress choose_gloo_address(const std::string& option, const std::string& master_addr,
                                 int master_port, const std::string& master_from = "MASTER_ADDR",
                                 const EnvLookup& env = {});

/// This host's source address on the route to `address` (a numeric address; `label` names it
/// in messages and in chosen_by).
BoundAddress route_to(const std::string& address, const std::string& label);

/// This host's name (for messages).
std::string host_name();

/// "10.0.0.1:29500", "[fd00::1]:29500".
std::string with_port(const std::string& address, int port);

/// Which loopback this process shares: processes with the same identity reach each other on
/// 127.0.0.1 (same boot of the same kernel, same network namespace), others do not.
std::string loopback_identity();

/// What each rank publishes about its address (one per rank, in rank order, from an exchange).
struct PeerAddress {
  std::string address;
  int probe_port = 0;    ///< a listener on `address` that peers connect to once
  std::string loopback;  ///< loopback_identity()
  std::string chosen_by;
  std::string host;            ///< host name, for messages
  std::string encode() const;  ///< one line; decode() reads it back
  static PeerAddress decode(const std::string& text);
};

/// The first pair of ranks on different hosts (not sharing a loopback) where one advertises a
/// loopback address to the other, or both advertise the same address, as a te::Error message
/// naming both ranks, both addresses and the variable to set; empty when there is none. Pure:
/// every rank computes the same from the same exchange.
std::string address_conflict(const std::vector<PeerAddress>& peers);

/// A TCP listener on `address` (any port) that only lets peers complete a connection: the proof
/// that they can reach this rank's address. Throws te::Error naming the address and what chose
/// it when this host cannot bind it.
class ProbeListener {
 public:
  explicit ProbeListener(const BoundAddress& bound);
  ~ProbeListener();
  ProbeListener(const ProbeListener&) = delete;
  ProbeListener& operator=(const ProbeListener&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

/// Connects to one listener of every other (address, loopback) among `peers` (ranks of this
/// rank's host sharing its address are skipped), all at once, each for at most `timeout`.
/// Returns one line per unreachable peer, "rank R's address A:P (why)"; empty when all were
/// reached.
std::vector<std::string> probe_peers(const std::vector<PeerAddress>& peers, int self,
                                     std::chrono::milliseconds timeout);

}  // namespace te::detail
