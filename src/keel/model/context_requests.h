#pragma once
// Requests Keel makes of an agent's model for itself rather than for a user's turn (docs/
// CONTEXT.md). Each has a system message whose first line names it, and a user message with the
// material; the local model recognises them by that line and answers deterministically.
//
// Summarization (compaction). The user message reads
//   Summary so far:
//   <the previous summary, or (none)>
//
//   Conversation to add:
//   user: <a message, on one line>
//   assistant: <a message, on one line>
//   ...
// and the answer is the new summary, which replaces the previous one. The system message ends
// with "Keep the summary under N characters." (kSummaryLimit).

#include <string_view>

namespace keel::model {

inline constexpr std::string_view kSummarizeRequest =
    "Keel context compaction: summarize the conversation below.";
inline constexpr std::string_view kSummarySoFar = "Summary so far:";
inline constexpr std::string_view kConversationToAdd = "Conversation to add:";
inline constexpr std::string_view kSummaryLimit = "Keep the summary under";

}  // namespace keel::model
