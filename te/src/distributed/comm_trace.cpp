#include "te/distributed/comm_trace.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "internal.h"

namespace te {

std::string to_string(Collective kind) {
  switch (kind) {
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "all_to_all";
    case Collective::kSendRecv:
      return "send_recv";
  }
  return "?";
}

CommTrace::CommTrace() : scopes_(detail::scopes_in_effect()) {
  std::lock_guard<std::mutex> lock(scopes_->mutex);
  scopes_->traces.push(this, this);
}

CommTrace::~CommTrace() {
  std::lock_guard<std::mutex> lock(scopes_->mutex);
  scopes_->traces.pop(this);
}

void CommTrace::record(const CommRecord& record) {
  const auto scopes = detail::scopes_in_effect();
  std::lock_guard<std::mutex> lock(scopes->mutex);
  scopes->traces.for_each([&](CommTrace* trace) { trace->records_.push_back(record); });
}

int64_t CommTrace::count(Collective kind, const std::string& axis) const {
  return std::count_if(records_.begin(), records_.end(), [&](const CommRecord& r) {
    return r.kind == kind && (axis.empty() || r.mesh_axis == axis);
  });
}

int64_t CommTrace::bytes(Collective kind, const std::string& axis) const {
  int64_t total = 0;
  for (const CommRecord& r : records_) {
    if (r.kind == kind && (axis.empty() || r.mesh_axis == axis)) total += r.bytes;
  }
  return total;
}

std::string CommTrace::table() const {
  std::vector<std::pair<Collective, std::string>> keys;
  for (const CommRecord& r : records_) {
    const auto key = std::make_pair(r.kind, r.mesh_axis);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) keys.push_back(key);
  }
  std::ostringstream os;
  os << "collective      mesh axis   count        bytes\n";
  for (const auto& [kind, axis] : keys) {
    std::string k = to_string(kind);
    std::string a = axis;
    k.resize(std::max<std::size_t>(k.size(), 15), ' ');
    a.resize(std::max<std::size_t>(a.size(), 10), ' ');
    const std::string c = std::to_string(count(kind, axis));
    const std::string b = std::to_string(bytes(kind, axis));
    os << k << ' ' << a << ' ' << std::string(c.size() < 6 ? 6 - c.size() : 0, ' ') << c << ' '
       << std::string(b.size() < 12 ? 12 - b.size() : 0, ' ') << b << "\n";
  }
  return os.str();
}

}  // namespace te
