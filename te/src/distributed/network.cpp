#include "network.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "te/error.h"

namespace te::detail {

namespace {

// A socket address's numeric text (no port).
std::string numeric(const sockaddr* sa) {
  char host[NI_MAXHOST] = {0};
  const socklen_t len = sa->sa_family == AF_INET6 ? sizeof(sockaddr_in6)
                                                  : static_cast<socklen_t>(sizeof(sockaddr_in));
  if (getnameinfo(sa, len, host, sizeof(host), nullptr, 0, NI_NUMERICHOST) != 0) return {};
  std::string out = host;
  // A link-local IPv6 address carries its scope ("fe80::1%veth0"): keep it, Gloo needs it.
  return out;
}

// fe80::/10: meaningful on this host only (its scope names a local interface).
bool link_local(const sockaddr* sa) {
  if (sa->sa_family != AF_INET6) return false;
  const auto* a = &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr;
  return IN6_IS_ADDR_LINKLOCAL(a);
}

struct Interface {
  std::string name;
  std::string address;
  int family = 0;
  bool link_local = false;
};

std::vector<Interface> interfaces() {
  std::vector<Interface> out;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    const int family = a->ifa_addr->sa_family;
    if (family != AF_INET && family != AF_INET6) continue;
    out.push_back({a->ifa_name, numeric(a->ifa_addr), family, link_local(a->ifa_addr)});
  }
  freeifaddrs(list);
  return out;
}

std::string interface_list(const std::vector<Interface>& all) {
  std::string out;
  for (const Interface& i : all) out += (out.empty() ? "" : ", ") + i.name + " " + i.address;
  return out.empty() ? "none" : out;
}

// The address an interface name or an address literal stands for on this host.
std::string local_address(const std::string& value, const std::string& what) {
  const std::vector<Interface> all = interfaces();
  bool named = false;
  // An interface's IPv4 address first, then a global IPv6 one: a link-local address means
  // nothing on another host.
  for (int family : {AF_INET, AF_INET6}) {
    for (const Interface& i : all) {
      if (i.name != value) continue;
      named = true;
      if (i.family == family && !i.link_local) return i.address;
    }
  }
  TE_CHECK(!named, what, ": the interface '", value,
           "' has no IPv4 or global IPv6 address that other hosts could reach; name one that "
           "does (this host's: ",
           interface_list(all), ")");
  for (const Interface& i : all) {
    if (i.address == value) return value;
  }
  in6_addr probe6{};
  in_addr probe4{};
  const bool literal = inet_pton(AF_INET, value.c_str(), &probe4) == 1 ||
                       inet_pton(AF_INET6, value.c_str(), &probe6) == 1;
  TE_FAIL(
      what, ": '", value, "' is ",
      literal ? "not an address of this host" : "neither an interface of this host nor an address",
      "; name one of this host's interfaces or addresses: ", interface_list(all));
}

// The first address `host` resolves to (numeric hosts are taken as they are).
bool resolve(const std::string& host, int port, sockaddr_storage& out, socklen_t& len) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &res) != 0 || res == nullptr) return false;
  std::memcpy(&out, res->ai_addr, res->ai_addrlen);
  len = res->ai_addrlen;
  freeaddrinfo(res);
  return true;
}

std::string clean(std::string s) {
  std::replace(s.begin(), s.end(), '\t', ' ');
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace

std::string with_port(const std::string& address, int port) {
  const bool v6 = address.find(':') != std::string::npos;
  return (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
}

bool is_loopback_address(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) {
    return (ntohl(v4.s_addr) >> 24) == 127;
  }
  in6_addr v6{};
  const std::string bare = address.substr(0, address.find('%'));
  if (inet_pton(AF_INET6, bare.c_str(), &v6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
  }
  return false;
}

BoundAddress choose_gloo_address(const std::string& option, const std::string& master_addr,
                                 int master_port, const std::string& master_from,
                                 const EnvLookup& env_in) {
  const EnvLookup& env = env_in ? env_in : process_env();
  if (!option.empty()) {
    return {local_address(option, "DistributedOptions::interface"),
            "DistributedOptions::interface='" + option + "'"};
  }
  if (const char* v = env("GLOO_SOCKET_IFNAME"); v != nullptr && *v != '\0') {
    const std::string value = v;
    TE_CHECK(value.find(',') == std::string::npos, "GLOO_SOCKET_IFNAME='", value,
             "' names several interfaces; te-cpp binds one: name the one that reaches the other "
             "hosts");
    return {local_address(value, "GLOO_SOCKET_IFNAME"), "GLOO_SOCKET_IFNAME=" + value};
  }
  const std::string label = master_from.empty() || master_from == "MASTER_ADDR"
                                ? "MASTER_ADDR=" + master_addr
                                : master_addr + " (" + master_from + ")";
  sockaddr_storage master{};
  socklen_t len = 0;
  TE_CHECK(resolve(master_addr, master_port, master, len), label,
           " does not resolve to an address on this host; set MASTER_ADDR to rank 0's address");
  const std::string master_numeric = numeric(reinterpret_cast<const sockaddr*>(&master));
  // Only a master written as a loopback address means one host. A host name that resolves to
  // a loopback address here (its own name on a stock Debian or Ubuntu host: 127.0.1.1) says
  // nothing of how other hosts reach this one: the choice is provisional (see BoundAddress).
  if (is_loopback_address(master_addr) || master_addr == "localhost") {
    return {master_numeric, label + " (a loopback address)"};
  }
  BoundAddress routed = route_to(master_numeric, label);
  routed.provisional = is_loopback_address(routed.address);
  return routed;
}

BoundAddress route_to(const std::string& address, const std::string& label) {
  sockaddr_storage target{};
  socklen_t len = 0;
  TE_CHECK(resolve(address, 9, target, len), "internal: '", address, "' does not parse");
  // A datagram socket "connected" to the target sends nothing; the kernel picks the source
  // address of the route to it, the one a TCP connection to it (the store's) leaves from.
  const int fd = ::socket(target.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  TE_CHECK(fd >= 0, "could not open a socket to find the route to ", label, ": ",
           std::strerror(errno));
  sockaddr_storage local{};
  socklen_t local_len = sizeof(local);
  const bool routed = ::connect(fd, reinterpret_cast<const sockaddr*>(&target), len) == 0 &&
                      ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0;
  const int err = errno;
  ::close(fd);
  TE_CHECK(routed, "this host has no route to ", label, " (", address, "): ", std::strerror(err),
           "; set GLOO_SOCKET_IFNAME to the interface that reaches it");
  return {numeric(reinterpret_cast<const sockaddr*>(&local)), "the route to " + label};
}

std::string host_name() {
  char host[256] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

std::string loopback_identity() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat ns {};
  const std::string net =
      ::stat("/proc/self/ns/net", &ns) == 0 ? std::to_string(ns.st_ino) : std::string("?");
  if (boot.empty()) boot = host_name();
  return boot + "/" + net;
}

std::string PeerAddress::encode() const {
  return clean(address) + "\t" + std::to_string(probe_port) + "\t" + clean(loopback) + "\t" +
         clean(chosen_by) + "\t" + clean(host);
}

PeerAddress PeerAddress::decode(const std::string& text) {
  std::vector<std::string> f;
  std::stringstream in(text);
  std::string field;
  while (std::getline(in, field, '\t')) f.push_back(field);
  TE_CHECK(f.size() == 5, "internal: a peer published '", text, "' as its address");
  PeerAddress p;
  p.address = f[0];
  p.probe_port = std::atoi(f[1].c_str());
  p.loopback = f[2];
  p.chosen_by = f[3];
  p.host = f[4];
  return p;
}

std::string address_conflict(const std::vector<PeerAddress>& peers) {
  for (std::size_t r = 0; r < peers.size(); ++r) {
    for (std::size_t q = 0; q < peers.size(); ++q) {
      if (peers[q].loopback == peers[r].loopback) continue;
      std::ostringstream os;
      if (is_loopback_address(peers[r].address)) {
        os << "rank " << r << " (host " << peers[r].host
           << ") would advertise its loopback address " << peers[r].address << " (chosen by "
           << peers[r].chosen_by << ") to rank " << q << " on another host (" << peers[q].host
           << ", address " << peers[q].address << "), which cannot reach it there; set "
           << "GLOO_SOCKET_IFNAME on rank " << r << "'s host to the interface that reaches rank "
           << q << "'s host (or DistributedOptions::interface)";
        return os.str();
      }
      if (q > r && peers[q].address == peers[r].address) {
        os << "ranks " << r << " (host " << peers[r].host << ") and " << q << " (host "
           << peers[q].host << ") are on different hosts but both advertise the address "
           << peers[r].address << " (chosen by " << peers[r].chosen_by << " and by "
           << peers[q].chosen_by << "), so their peers cannot tell them apart; set "
           << "GLOO_SOCKET_IFNAME on each host to an interface with an address of its own";
        return os.str();
      }
    }
  }
  return {};
}

ProbeListener::ProbeListener(const BoundAddress& bound) {
  sockaddr_storage addr{};
  socklen_t len = 0;
  TE_CHECK(resolve(bound.address, 0, addr, len), "the address ", bound.address, " (chosen by ",
           bound.chosen_by, ") does not parse");
  fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const bool ok = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
                  ::listen(fd_, SOMAXCONN) == 0;
  const int err = errno;
  sockaddr_storage got{};
  socklen_t got_len = sizeof(got);
  if (ok && ::getsockname(fd_, reinterpret_cast<sockaddr*>(&got), &got_len) == 0) {
    port_ = ntohs(got.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                                            : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
  }
  if (!ok || port_ == 0) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    TE_FAIL("this rank cannot listen on ", bound.address, " (chosen by ", bound.chosen_by,
            "): ", std::strerror(err), "; set GLOO_SOCKET_IFNAME to an interface of this host");
  }
}

ProbeListener::~ProbeListener() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<std::string> probe_peers(const std::vector<PeerAddress>& peers, int self,
                                     std::chrono::milliseconds timeout) {
  struct Attempt {
    int rank;
    int fd;
    std::string why;  // empty while pending or once connected
    bool done = false;
  };
  std::vector<Attempt> attempts;
  const PeerAddress& me = peers.at(static_cast<std::size_t>(self));
  std::set<std::pair<std::string, std::string>> seen{{me.address, me.loopback}};
  for (std::size_t q = 0; q < peers.size(); ++q) {
    if (!seen.insert({peers[q].address, peers[q].loopback}).second) continue;
    Attempt a{static_cast<int>(q), -1, {}};
    sockaddr_storage addr{};
    socklen_t len = 0;
    if (!resolve(peers[q].address, peers[q].probe_port, addr, len)) {
      a.why = "does not parse";
      a.done = true;
    } else {
      a.fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (a.fd < 0 ||
          (::connect(a.fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 && errno != EINPROGRESS)) {
        a.why = std::strerror(errno);
        a.done = true;
      } else {
        a.done = false;
      }
    }
    attempts.push_back(a);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::vector<pollfd> fds;
    std::vector<Attempt*> waiting;
    for (Attempt& a : attempts) {
      if (a.done) continue;
      fds.push_back({a.fd, POLLOUT, 0});
      waiting.push_back(&a);
    }
    if (fds.empty()) break;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      for (Attempt* a : waiting) {
        a->why = "no answer within " + std::to_string(timeout.count() / 1000.0).substr(0, 4) + " s";
        a->done = true;
      }
      break;
    }
    ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left.count(), 250)));
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &err, &len);
      waiting[i]->why = err == 0 ? std::string() : std::strerror(err);
      waiting[i]->done = true;
    }
  }
  std::vector<std::string> failures;
  for (Attempt& a : attempts) {
    if (a.fd >= 0) ::close(a.fd);
    if (a.why.empty()) continue;
    const PeerAddress& p = peers[static_cast<std::size_t>(a.rank)];
    failures.push_back("rank " + std::to_string(a.rank) + "'s address " +
                       with_port(p.address, p.probe_port) + " (" + a.why + ")");
  }
  return failures;
}

}  // namespace te::detail
