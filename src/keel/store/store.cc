#include "keel/store/store.h"

#include <future>

#include "keel/common/crypto.h"
#include "keel/store/postgres/postgres_store.h"
#include "keel/store/sqlite/sqlite_store.h"

namespace keel::store {

Status Store::WriteSync(WriteFn fn, std::vector<Event>* events) {
  std::promise<std::pair<Status, std::vector<Event>>> done;
  auto fut = done.get_future();
  Write(std::move(fn), [&done](Status s, std::vector<Event> ev) {
    done.set_value({std::move(s), std::move(ev)});
  });
  auto [status, ev] = fut.get();
  if (events) *events = std::move(ev);
  return status;
}

Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const StoreOptions& options) {
  std::string path;
  if (url.rfind("sqlite://", 0) == 0) {
    path = url.substr(9);
  } else if (url.rfind("postgres://", 0) == 0 || url.rfind("postgresql://", 0) == 0) {
    return postgres::PostgresStore::Open(url, options);
  } else if (url.find("://") != std::string::npos) {
    return InvalidArgument("unknown store URL scheme: " + url +
                           " (expected sqlite:///path/keel.db or postgres://user@host:port/db)");
  } else {
    path = url;
  }
  if (path.empty()) return InvalidArgument("store URL has no path: " + url);
  return sqlite::SqliteStore::Open(path, options);
}

std::string EncodeCursor(const std::string& last_key) {
  return last_key.empty() ? "" : Base64UrlEncode(last_key);
}
std::string DecodeCursor(const std::string& cursor) { return Base64UrlDecode(cursor); }

}  // namespace keel::store
