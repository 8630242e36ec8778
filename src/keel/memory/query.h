#pragma once
// The memory search language, parsed once in C++ and rendered for each store backend, so that
// no user text ever reaches FTS5's MATCH or PostgreSQL's to_tsquery as it was typed.
//
//   cat food          both words (AND)
//   "black cat"       the words next to each other, in this order (a phrase)
//   cat OR dog        either (OR binds the terms on each side; it must be upper case)
//   cat -dog          cat, but not dog (a leading - excludes a word or a phrase)
//   feed*             a word starting with "feed" (a trailing * makes the last word a prefix)
//
// A word is a run of letters and digits; any other character separates words, so `e-mail`
// is the phrase "e mail" and a term made only of punctuation is left out. Case does not matter.
// Errors are kInvalidArgument naming the problem and its position (a character count from 1):
// an unbalanced quote, an OR with nothing on one side or next to an excluded term, a phrase
// with no words, a query with only excluded terms or no words at all, a query over
// kMaxQueryBytes or with more than kMaxQueryTerms terms, text that is not UTF-8.

#include <string_view>

#include "keel/common/status.h"
#include "keel/store/memory_store.h"

namespace keel::memory {

inline constexpr size_t kMaxQueryBytes = 512;
inline constexpr int kMaxQueryTerms = 16;

Result<store::MemoryQuery> ParseQuery(std::string_view text);

}  // namespace keel::memory
