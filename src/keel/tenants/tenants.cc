#include "keel/tenants/tenants.h"

#include "keel/common/crypto.h"
#include "keel/common/ids.h"
#include "keel/store/row_images.h"

namespace keel::tenants {

NewTenant MakeTenant(const std::string& name) {
  NewTenant t;
  t.tenant = {NewId(), name, NowMillis()};
  t.secret = NewToken();
  t.owner.id = NewId();
  t.owner.tenant_id = t.tenant.id;
  t.owner.name = "owner";
  t.owner.role = "owner";
  t.owner.hash = Sha256Hex(t.secret);
  t.owner.created_at = t.tenant.created_at;
  return t;
}

Status InsertTenant(store::Tx& tx, const NewTenant& t) {
  KEEL_RETURN_IF_ERROR(tx.tenants().InsertTenant(t.tenant));
  tx.Carry("tenants", store::RowImage(t.tenant));
  KEEL_RETURN_IF_ERROR(
      tx.events()
          .Append({t.tenant.id, "tenant.created@v1", "", "", "",
                   {{"tenant_id", t.tenant.id}, {"name", t.tenant.name}}}));
  KEEL_RETURN_IF_ERROR(tx.tokens().InsertToken(t.owner));
  tx.Carry("api_tokens", store::RowImage(t.owner));
  return tx.events()
      .Append({t.tenant.id, "token.created@v1", "", "", "",
               {{"token_id", t.owner.id}, {"name", t.owner.name}, {"role", t.owner.role}}});
}

}  // namespace keel::tenants
