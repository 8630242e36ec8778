#pragma once
// Where a channel's delivery goes (decisions/0019): shared by the webhook route and the relay's
// pollers.

#include <boost/asio/awaitable.hpp>
#include <string>

#include "keel/common/status.h"

namespace keel::store {
class Store;
struct Channel;
}  // namespace keel::store

namespace keel::channels {

// The session a delivery goes to, recorded with it (channel_deliveries) in one unit with
// channel.delivered@v1: the one it went to before (a retry, whatever its body says now), else
// its conversation's, opened when new (in the channel creator's name). kNotFound when the
// channel was deleted or disabled meanwhile; kPermissionDenied once its creator's token is
// revoked.
boost::asio::awaitable<Result<std::string>> RecordDelivery(store::Store& store,
                                                           const store::Channel& channel,
                                                           const std::string& delivery_id,
                                                           const std::string& conversation);

}  // namespace keel::channels
