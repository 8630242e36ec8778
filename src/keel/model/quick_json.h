#pragma once
// Boost.JSON's parser for what a model provider's stream sends per token (docs/decisions/0001):
// about five times as fast as ParseJson for a chunk. Included only by the wire modules
// (openai_wire.cc, anthropic_wire.cc), which read the value into plain strings and numbers, so
// no Boost.JSON value leaves them. Everything they do not read this way goes through ParseJson.

#include <boost/json/monotonic_resource.hpp>
#include <boost/json/value.hpp>
#include <string_view>

namespace keel::model {

// Parses `text` into `out` (allocated from `memory`) when ParseJson would accept it, but for a
// key given twice, where the last copy counts: Keel is the only reader of a provider's stream.
// false when Boost.JSON refuses the text (syntax, ill-formed UTF-8, something after the value),
// when it nests deeper than kMaxJsonDepth, or holds a number too large for a double, which
// ParseJson refuses and Boost.JSON reads as infinity.
bool QuickParse(std::string_view text, boost::json::monotonic_resource& memory,
                boost::json::value& out);

// A stream's token count as the wire modules read it from a parsed value: an integer, a
// negative one as 0, one beyond int64 as its maximum; absent or anything else 0.
int64_t QuickCount(const boost::json::object& obj, std::string_view field);

}  // namespace keel::model
