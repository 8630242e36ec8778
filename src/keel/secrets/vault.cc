#include "keel/secrets/vault.h"

#include "keel/store/row_images.h"
#include "keel/store/store.h"

namespace keel::secrets {
namespace {

std::string DataKeyAad(const std::string& tenant_id) { return "keel-data-key|" + tenant_id; }
std::string SecretAad(const std::string& tenant_id, const std::string& name) {
  return tenant_id + "|" + name;
}

}  // namespace

Vault Vault::FromKekText(std::string_view kek_base64) {
  Vault v;
  if (kek_base64.empty()) {
    v.ready_ = Unavailable(
        "secrets are disabled: KEEL_SECRET_KEK is not set (a base64-encoded 256-bit key, e.g. "
        "from `openssl rand -base64 32`)");
    return v;
  }
  auto key = Key::FromBase64(kek_base64, "KEEL_SECRET_KEK");
  if (!key.ok()) {
    v.ready_ = Unavailable("secrets are disabled: " + key.status().message());
    return v;
  }
  v.kek_ = *key;
  v.ready_ = Status::Ok();
  return v;
}

Status Vault::CheckName(std::string_view name) {
  if (name.empty() || name.size() > 128) {
    return InvalidArgument("a secret name has 1 to 128 characters");
  }
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.';
    if (!ok) {
      return InvalidArgument("secret name '" + std::string(name) +
                             "' may contain only letters, digits, '_', '-' and '.'");
    }
  }
  return Status::Ok();
}

Result<Key> Vault::DataKey(store::Tx& tx, const std::string& tenant_id,
                           std::optional<Millis> now) const {
  KEEL_RETURN_IF_ERROR(ready_);
  KEEL_ASSIGN_OR_RETURN(auto stored, tx.secrets().GetTenantKey(tenant_id));
  if (stored) {
    if (stored->kek_fingerprint != kek_->Fingerprint()) {
      return Unavailable("the tenant's secrets were sealed under another KEEL_SECRET_KEK "
                         "(fingerprint " + stored->kek_fingerprint + "; this server's key has " +
                         kek_->Fingerprint() + ")");
    }
    auto raw = Open(*kek_, stored->wrapped, DataKeyAad(tenant_id));
    if (!raw.ok()) return Internal("the tenant's data key does not open: " + raw.status().message());
    return Key::FromBytes(std::move(raw).value());
  }
  if (!now) return NotFound("the tenant has no secrets");
  Key fresh = Key::Random();
  store::TenantKey key{tenant_id, Seal(*kek_, fresh.bytes(), DataKeyAad(tenant_id)),
                       kek_->Fingerprint(), *now};
  KEEL_RETURN_IF_ERROR(tx.secrets().InsertTenantKey(key));
  tx.Carry("tenant_keys", store::RowImage(key));
  return fresh;
}

Result<bool> Vault::Put(store::Tx& tx, const std::string& tenant_id, const std::string& name,
                        std::string_view value, Millis now) const {
  KEEL_RETURN_IF_ERROR(CheckName(name));
  if (value.size() > kMaxSecretBytes) {
    return InvalidArgument("a secret value is at most " + std::to_string(kMaxSecretBytes) +
                           " bytes");
  }
  KEEL_ASSIGN_OR_RETURN(Key data_key, DataKey(tx, tenant_id, now));
  auto existing = tx.secrets().GetSecret(tenant_id, name);
  if (!existing.ok() && existing.status().code() != Code::kNotFound) return existing.status();
  store::Secret s{tenant_id, name, Seal(data_key, value, SecretAad(tenant_id, name)),
                  existing.ok() ? existing->created_at : now, now};
  KEEL_RETURN_IF_ERROR(tx.secrets().PutSecret(s));
  tx.Carry("secrets", store::RowImage(s));
  return !existing.ok();
}

Result<std::string> Vault::Get(store::Tx& tx, const std::string& tenant_id,
                               const std::string& name) const {
  KEEL_RETURN_IF_ERROR(ready_);
  KEEL_ASSIGN_OR_RETURN(auto secret, tx.secrets().GetSecret(tenant_id, name));
  KEEL_ASSIGN_OR_RETURN(Key data_key, DataKey(tx, tenant_id, std::nullopt));
  auto value = Open(data_key, secret.sealed, SecretAad(tenant_id, name));
  if (!value.ok()) return Internal("secret " + name + " does not open: " + value.status().message());
  return value;
}

}  // namespace keel::secrets
