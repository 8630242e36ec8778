#pragma once
// Tenants and their first owner token: created the same way at first start and through
// POST /v1/tenants.

#include <string>

#include "keel/store/store.h"

namespace keel::tenants {

struct NewTenant {
  store::Tenant tenant;
  store::Token owner;  // its hash only
  std::string secret;  // the owner token, shown once and never stored
};

// A tenant named `name` with a fresh owner token. Writes nothing.
NewTenant MakeTenant(const std::string& name);

// Inserts the tenant and its owner token, with their events, in `tx`.
Status InsertTenant(store::Tx& tx, const NewTenant& t);

}  // namespace keel::tenants
