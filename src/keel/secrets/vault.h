#pragma once
// The secrets service: names and sealed values per tenant, with envelope encryption
// (secret_box.h). The key-encryption key comes from KEEL_SECRET_KEK; without a valid one every
// operation that seals or opens fails closed with a message saying what to set. Values are
// never logged, rendered or put in events.

#include <optional>
#include <string>
#include <string_view>

#include "keel/common/status.h"
#include "keel/common/time.h"
#include "keel/secrets/secret_box.h"

namespace keel::store {
class Tx;
}

namespace keel::secrets {

inline constexpr size_t kMaxSecretBytes = 64 * 1024;

class Vault {
 public:
  // `kek_base64`: the value of KEEL_SECRET_KEK (empty when unset).
  static Vault FromKekText(std::string_view kek_base64);
  Vault() : ready_(Unavailable("secrets are disabled")) {}

  // Ok when secrets can be sealed and opened; otherwise why not (for operations and the log).
  const Status& ready() const { return ready_; }

  // Letters, digits, '_', '-', '.'; 1 to 128 characters.
  static Status CheckName(std::string_view name);

  // Seals `value` under the tenant's data key (created, wrapped, on first use) and stores it in
  // the caller's unit of work. Returns whether the name was new.
  Result<bool> Put(store::Tx& tx, const std::string& tenant_id, const std::string& name,
                   std::string_view value, Millis now) const;
  // Opens a stored secret. kNotFound when absent.
  Result<std::string> Get(store::Tx& tx, const std::string& tenant_id,
                          const std::string& name) const;

 private:
  // The tenant's data key; created and stored when `now` is given and there is none.
  Result<Key> DataKey(store::Tx& tx, const std::string& tenant_id, std::optional<Millis> now) const;

  std::optional<Key> kek_;
  Status ready_;
};

}  // namespace keel::secrets
