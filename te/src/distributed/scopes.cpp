#include "te/distributed/scopes.h"

#include <ATen/core/ivalue.h>
#include <torch/custom_class.h>

#include "internal.h"
#include "te/error.h"

namespace te {
namespace detail {

namespace {

std::shared_ptr<ThreadScopes>& own_scopes() {
  thread_local std::shared_ptr<ThreadScopes> own;
  return own;
}

// The scopes lent to this thread, innermost last (ScopeLoan).
ScopeStack<std::shared_ptr<ThreadScopes>>& lent_scopes() {
  thread_local ScopeStack<std::shared_ptr<ThreadScopes>> lent;
  return lent;
}

struct ScopesHolder : torch::CustomClassHolder {
  std::shared_ptr<ThreadScopes> scopes;
};

}  // namespace

std::shared_ptr<ThreadScopes> scopes_in_effect() {
  if (const auto* lent = lent_scopes().top(); lent != nullptr && *lent) return *lent;
  auto& own = own_scopes();
  if (!own) own = std::make_shared<ThreadScopes>();
  return own;
}

}  // namespace detail

ScopeCapture ScopeCapture::current() {
  ScopeCapture c;
  c.scopes_ = detail::scopes_in_effect();
  return c;
}

c10::IValue ScopeCapture::to_ivalue() const {
  auto holder = c10::make_intrusive<detail::ScopesHolder>();
  holder->scopes = scopes_;
  return c10::IValue::make_capsule(holder);
}

ScopeCapture ScopeCapture::from_ivalue(const c10::IValue& value) {
  TE_CHECK(value.isCapsule(),
           "ScopeCapture::from_ivalue: the value is not a capsule made by to_ivalue()");
  ScopeCapture c;
  c.scopes_ = c10::static_intrusive_pointer_cast<detail::ScopesHolder>(value.toCapsule())->scopes;
  return c;
}

ScopeLoan::ScopeLoan(const ScopeCapture& scopes) {
  detail::lent_scopes().push(this, scopes.scopes_);
}

ScopeLoan::~ScopeLoan() { detail::lent_scopes().pop(this); }

}  // namespace te
