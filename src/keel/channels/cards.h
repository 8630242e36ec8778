#pragma once
// Approval cards (docs/CHANNELS.md, "Approvals in chat"): a tool call parked for a human in a
// run that a chat platform's message started is shown to its approvers as a card with two
// buttons, and a press decides it through approvals::Decide, as the API would.
//
//   open     the leader finds the approval (ChannelStore::ApprovalsToCard) and records its
//            cards in the outbox, in one unit: one to each approver (the policy's approvers, else
//            the agent's owners) who has an identity on the channel's platform and a direct
//            conversation with its bot; else, when the policy allows it, one in the conversation
//            the run came from; else a "skipped" card that says why (the approval waits in the
//            dashboard and the API).
//   show     the outbox sends a card like an answer (never twice: a send cut midway is
//            "unknown"); once the platform has it, it is "shown" and records where it is.
//   press    a button's press names the approval; the identity behind it must be an approver
//            (separation of duties included) of an approval carded on that channel. Then
//            approvals::Decide, in the unit that checked it.
//   close    once the approval is decided (by a press, the API or its expiry), each shown card is
//            edited to say how and by whom, and loses its buttons.
//
// Pure functions and units of work: no I/O here (channels/relay.h sends and takes).

#include <optional>
#include <string>

#include "keel/access/users.h"
#include "keel/common/json_util.h"
#include "keel/common/status.h"
#include "keel/common/time.h"

namespace keel::store {
class Tx;
struct Approval;
struct Channel;
}  // namespace keel::store

namespace keel::channels {

// A button pressed on a card, as a platform reports it.
struct Press {
  std::string approval_id;
  bool approve = false;
  access::Sender sender;  // who pressed
  std::string handle;     // how the platform wants the press answered (Telegram's query id)
  Json message;           // the card's message: where a notice to the presser goes
};

// What a button carries: "keel:approve:ID" or "keel:reject:ID" (at most 64 bytes, Telegram's
// callback_data limit, for an id of up to 51).
std::string ButtonData(const std::string& approval_id, bool approve);
// The approval and verdict a button's data names; nullopt for another button's.
std::optional<std::pair<std::string, bool>> ParseButtonData(const std::string& data);

// A press from a Telegram update's callback_query; nullopt when the update is not a press of a
// card's button.
std::optional<Press> TelegramPress(const Json& update);
// A press from a Slack block_actions payload (the interactivity request's `payload` field).
std::optional<Press> SlackPress(const Json& payload);
// A press from a Discord interaction of type 3 (a message component).
std::optional<Press> DiscordPress(const Json& interaction);
// The value of `field` in an application/x-www-form-urlencoded body ("" when absent).
std::string FormField(const std::string& body, const std::string& field);

// A card's text while it waits, and once decided (`decider`: who decided, as a person reads it).
std::string CardText(const store::Approval& a, const std::string& agent_name);
std::string DecidedText(const store::Approval& a, const std::string& decider);

// The requests that show a card (with its buttons) and edit it once decided, per platform.
// `target`: where it goes (a conversation's target, channels/*.h); `message`: where it is
// (CardMessage's).
Json TelegramCardBody(const Json& target, const std::string& text, const std::string& approval_id);
Json TelegramEditBody(const Json& message, const std::string& text);
Json SlackCardBody(const Json& target, const std::string& text, const std::string& approval_id);
Json SlackEditBody(const Json& message, const std::string& text);
Json DiscordCardBody(const std::string& text, const std::string& approval_id);
Json DiscordEditBody(const std::string& text);
// Where a card went, from the platform's answer to the request that showed it: Telegram's
// {"chat_id", "message_id"}, Slack's {"channel", "ts"}, Discord's {"channel_id", "message_id"}.
// kInvalidArgument when the answer does not say.
Result<Json> CardMessage(const std::string& kind, const Json& answer);

// Records the cards of pending approval `approval_id` (see "open" above) in `tx`; nothing when
// it is not pending or no channel owes its run an answer.
Status OpenCards(store::Tx& tx, const std::string& tenant_id, const std::string& approval_id,
                 Millis now);

// What became of a press: `decided` when it decided the approval (the caller wakes the
// dispatcher and the outbox after the commit); `notice` what the presser is told.
struct PressOutcome {
  bool decided = false;
  std::string notice;
};
// Decides the approval a press on channel `c` names, in `tx`, when the presser may (see
// "press" above). A refusal is an outcome with its notice, nothing written.
Result<PressOutcome> DecidePress(store::Tx& tx, const store::Channel& c, const Press& p,
                                 Millis now);

}  // namespace keel::channels
