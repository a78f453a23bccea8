#pragma once

// The stack behind every scoped kind in te: rules and mesh resources (ShardingContextScope),
// meshes (MeshScope), FP8 autocast regions, scopes lent to autograd threads (ScopeLoan), gradient
// hooks, CommTraces, AllocationCounters and the parameter modes (MetaParameterScope,
// EmptyParameterScope). Each kind keeps one stack per thread (a thread_local in the .cpp that owns
// the kind) or per ThreadScopes (guarded by its mutex); a scope pushes an entry under its own
// address when it opens and removes that entry when it closes. The innermost (last) entry is in
// force. Scopes are RAII guards, so they normally close in reverse order; one that closes out of
// order (held in an optional, say) is removed wherever it is, and the stack stays whole.

#include <algorithm>
#include <iterator>
#include <utility>
#include <vector>

namespace te {

template <typename T>
class ScopeStack {
 public:
  /// Opens a scope owned by `owner` (its address names it when it closes) holding `value`.
  void push(const void* owner, T value) { entries_.emplace_back(owner, std::move(value)); }

  /// Closes `owner`'s innermost scope, wherever it is in the stack; nothing if it holds none.
  void pop(const void* owner) {
    const auto it = std::find_if(entries_.rbegin(), entries_.rend(),
                                 [owner](const auto& e) { return e.first == owner; });
    if (it != entries_.rend()) entries_.erase(std::next(it).base());
  }

  bool empty() const { return entries_.empty(); }

  /// The innermost value, or null when no scope is open.
  const T* top() const { return entries_.empty() ? nullptr : &entries_.back().second; }

  /// The innermost value, or `fallback` when no scope is open.
  T top_or(T fallback) const {
    return entries_.empty() ? std::move(fallback) : entries_.back().second;
  }

  /// Every open value, outermost first.
  std::vector<T> values() const {
    std::vector<T> out;
    out.reserve(entries_.size());
    for (const auto& e : entries_) out.push_back(e.second);
    return out;
  }

  /// Calls f(value) for every open value, outermost first.
  template <typename F>
  void for_each(F&& f) const {
    for (const auto& e : entries_) f(e.second);
  }

 private:
  std::vector<std::pair<const void*, T>> entries_;
};

}  // namespace te
