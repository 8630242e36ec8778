#!/usr/bin/env python3
"""A fake of Slack for Keel's tests: the Web API a bot calls (https://api.slack.com/web) and the
sender of the Events API requests (https://api.slack.com/apis/events-api) and interactivity
requests (a button's press, https://api.slack.com/interactivity/handling) a Slack app receives,
speaking the real wire formats.

Usage: fake_slack.py --token xoxb-... [--bot-user UBOT0001] [--team T0001]. It listens on
127.0.0.1 on a free port, prints the port on the first line of stdout, and serves until stdin
closes (so it dies with the test that started it) or it is sent SIGTERM.

Web API: `POST /api/<method>` (or GET), parameters in a JSON body (Content-Type
application/json), a form body or the query string. As Slack does, an error is HTTP 200 with
`{"ok": false, "error": "..."}`: a missing or wrong `Authorization: Bearer TOKEN` is
`invalid_auth` (counted in `unauthorized`), an unknown method `unknown_method`, a JSON body that
does not parse `invalid_json`.

- auth.test: the bot (team_id TEAM, user_id BOT_USER, bot_id B0001).
- chat.postMessage {channel, text, thread_ts, blocks, ...}: a channel no event came from is
  `channel_not_found`; an empty or missing text (without blocks) `no_text`; a text longer than
  40,000 characters `msg_too_long`. A text (or a section block's text) with a bare `<` or `>`, or
  a `&` that does not start `&amp;`, `&lt;` or `&gt;`, is taken (Slack would render it as markup:
  a link, a mention, @channel) and counted in `unescaped`. `blocks` (a list, or a JSON string of
  one, as in a form body) is checked as Slack does, minimally, else `invalid_blocks`: at most 50
  blocks, each an object with a string "type"; a section's "text" a text object ("plain_text" or
  "mrkdwn") of 1 to 3,000 characters; an actions block's "elements" 1 to 25 buttons
  ({"type": "button"}), each with a string action_id (at most 255 characters, unique in the
  message), a "text" {"type": "plain_text", "text": 1 to 75 characters}, a string "value" of at
  most 2,000 characters (optional) and a "style" "primary" or "danger" (optional). A block
  without a block_id gets one (as Slack does). Answers {"ok": true, "channel", "ts"
  ("<unix>.<6 digits>", increasing), "message": {..., "blocks" when given}}.
- chat.update {channel, ts, text, blocks}: the message must be one posted to that channel
  (`channel_not_found` for a channel no event came from, `message_not_found` for another ts);
  a text or blocks is needed (`no_text`); blocks are checked as above. The message takes the new
  text, and the new blocks when given (as Slack does: without "blocks" the old ones stay; `[]`
  removes them). Answers {"ok": true, "channel", "ts", "text", "message"}.
- chat.postEphemeral {channel, user, text}: `channel_not_found` as above, `user_not_found` for a
  missing user, `no_text`; answers {"ok": true, "message_ts"} (a new ts). Ephemeral messages are
  not messages of the channel: they cannot be updated or pressed.

Failure injection, per method, consumed in order before normal answers (POST /_fail {"method",
"answers": [...]}): {"status": 429, "retry_after": S} (HTTP 429, `Retry-After: S`, body
`{"ok": false, "error": "ratelimited"}`), {"status": 500} (any other status: that status with
`{"ok": false, "error": "fatal_error"}`), {"error": "channel_not_found"} (HTTP 200 with ok false
and that error), {"drop": true} (the request is read and counted, then the connection is closed
without an answer), {"delay": S} (answered normally after S seconds). A request with a wrong
token is refused before a failure is consumed.

Control endpoints (no token, JSON):
- POST /_event {"url": KEEL_HOOK_URL, "signing_secret": VALUE, and one of
  "event": EVENT (sent as it is inside an event_callback envelope),
  "dm": {"channel": "D..", "user": "U..", "text", "thread_ts"?} (a message event, channel_type
  im, with a new ts), "mention": {"channel": "C..", "user", "text", "thread_ts"?} (an
  app_mention event with a new ts), "url_verification": true; or none of them with the
  event_id of an envelope sent before: the same bytes again, re-signed (Slack's retry).
  Optional: "event_id" (default "Ev" and a counter; null leaves it out), "retry_num" (adds
  X-Slack-Retry-Num and X-Slack-Retry-Reason: http_timeout), "timestamp" (sent in
  X-Slack-Request-Timestamp and signed with, so a stale request is correctly signed; null leaves
  the header out), "signature" (sent instead of the right one; null leaves the header out),
  "body_suffix" (appended to the body after signing: tampering). The channels of the events sent
  are remembered (chat.postMessage to them works). Signs as Slack does: X-Slack-Signature is
  `v0=` and the hex HMAC-SHA256 of `v0:TIMESTAMP:BODY` under the signing secret. POSTs once and
  answers {"status": Keel's HTTP status (null when the request failed; "error" then says why),
  "body": Keel's body text, "event_id", "ts" (the event's ts), "challenge" (url_verification)}.
- POST /_press {"url": KEEL_HOOK_URL, "signing_secret": VALUE, "channel": "D..", "ts": the
  message's ts, "user": "U.." (who presses), and "action": "approve" or "reject" (the button
  with action_id keel_approve / keel_reject) or "action_id"}: a press of a button of a message
  posted by chat.postMessage, as Slack's interactivity request (a block_actions payload,
  https://api.slack.com/reference/interaction-payloads/block-actions): {"type": "block_actions",
  "user": {"id", "username", "name", "team_id"}, "api_app_id", "token", "container": {"type":
  "message", "message_ts", "channel_id", "is_ephemeral": false, "thread_ts"?}, "trigger_id",
  "team": {"id", "domain"}, "enterprise": null, "is_enterprise_install": false, "channel": {"id",
  "name"}, "message": the message as it is now (type, user, bot_id, app_id, team, text, ts,
  thread_ts?, blocks), "state": {"values": {}}, "response_url", "actions": [{"type": "button",
  "action_id", "block_id", "text", "value", "style"?, "action_ts"}]}, sent as the form body
  `payload=<urlencoded JSON>` (Content-Type application/x-www-form-urlencoded) to KEEL_HOOK_URL,
  signed like an event. The button must be on the message as it is now (a message updated
  without its buttons has none) unless "stale": true (a client that has not seen the update yet
  presses the button as first posted). Optional: "username" (default: the user id in lower
  case), "value" (sent instead of the button's value: a forged button), and "timestamp",
  "signature", "body_suffix" as for /_event. Answers {"status", "body" (Keel's; "error" when the
  request failed), "payload" (the payload sent)}.
- GET /_sent: {"messages": [chat.postMessage bodies as received, plus "_at" (time.time()),
  "_ts" (the message's ts) and "_text" (the text as Slack shows it: &lt; &gt; &amp; decoded)],
  "updates": [chat.update bodies as received, plus "_at" and "_text"], "ephemerals":
  [chat.postEphemeral bodies as received, plus "_at", "_ts" and "_text"], "presses": [the
  payloads /_press sent], "attempts": {method: calls, failed or not}, "calls": [{"method", "at",
  "status" (HTTP status, "drop", or null while unanswered), "error" (ok false's error), "channel"
  when given}], "unescaped": N, "unauthorized": N, "channels": [channels seen in events]}.
- POST /_reset: clears the recordings and queued failures (not the channels seen, the
  envelopes sent or the messages posted, which can still be updated and pressed).
"""

import argparse
import collections
import hashlib
import hmac
import http.client
import json
import re
import secrets
import sys
import threading
import time
import urllib.parse

from fake_http import FakeHandler, Server

TOKEN, BOT_USER, TEAM, BOT_ID, APP_ID = None, "UBOT0001", "T0001", "B0001", "A0001"
METHODS = ("auth.test", "chat.postMessage", "chat.update", "chat.postEphemeral")
MAX_TEXT = 40000
MAX_BLOCKS, MAX_SECTION_TEXT, MAX_ELEMENTS, MAX_ACTION_ID, MAX_BUTTON_TEXT, MAX_VALUE = \
    50, 3000, 25, 255, 75, 2000
ACTIONS = {"approve": "keel_approve", "reject": "keel_reject"}
BARE = re.compile(r"[<>]|&(?!amp;|lt;|gt;)")

lock = threading.Lock()
S = {}  # the state, under lock


def reset_recordings():
    S.update(messages=[], updates=[], ephemerals=[], presses=[], calls=[],
             attempts=collections.Counter(), unescaped=0, unauthorized=0,
             failures=collections.defaultdict(collections.deque))


# sent: event_id -> the envelope's bytes; posted: (channel, ts) -> the message as Slack keeps it
# ({"text", "blocks", "thread_ts", "first_blocks"})
S.update(channels=set(), seq=0, events=0, sent={}, posted={})
reset_recordings()


def new_ts():
    """A message ts as Slack makes them: unix seconds, a dot, six digits; increasing (under
    lock)."""
    S["seq"] += 1
    return "%d.%06d" % (int(time.time()), S["seq"] % 1000000)


def shown(text):
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def short_id():
    return secrets.token_urlsafe(4)[:5]


def checked_blocks(blocks):
    """The blocks of a chat.postMessage or chat.update as Slack keeps them (a block_id given to
    each block without one), or ApiError invalid_blocks; counts unescaped section texts (under
    lock)."""
    if isinstance(blocks, str):  # a form body carries them as a JSON string
        try:
            blocks = json.loads(blocks)
        except ValueError:
            raise ApiError("invalid_blocks")
    if not isinstance(blocks, list) or len(blocks) > MAX_BLOCKS:
        raise ApiError("invalid_blocks")
    out, action_ids = [], set()
    for block in blocks:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ApiError("invalid_blocks")
        block = json.loads(json.dumps(block))
        if block["type"] == "section":
            text = block.get("text")
            if not isinstance(text, dict) or text.get("type") not in ("plain_text", "mrkdwn") or \
                    not isinstance(text.get("text"), str) or \
                    not 1 <= len(text["text"]) <= MAX_SECTION_TEXT:
                raise ApiError("invalid_blocks")
            if text["type"] == "mrkdwn" and BARE.search(text["text"]):
                S["unescaped"] += 1
        elif block["type"] == "actions":
            elements = block.get("elements")
            if not isinstance(elements, list) or not 1 <= len(elements) <= MAX_ELEMENTS:
                raise ApiError("invalid_blocks")
            for e in elements:
                if not isinstance(e, dict) or e.get("type") != "button":
                    raise ApiError("invalid_blocks")
                action_id, text = e.get("action_id"), e.get("text")
                if not isinstance(action_id, str) or not 1 <= len(action_id) <= MAX_ACTION_ID \
                        or action_id in action_ids:
                    raise ApiError("invalid_blocks")
                action_ids.add(action_id)
                if not isinstance(text, dict) or text.get("type") != "plain_text" or \
                        not isinstance(text.get("text"), str) or \
                        not 1 <= len(text["text"]) <= MAX_BUTTON_TEXT:
                    raise ApiError("invalid_blocks")
                if "value" in e and (not isinstance(e["value"], str) or
                                     len(e["value"]) > MAX_VALUE):
                    raise ApiError("invalid_blocks")
                if "style" in e and e["style"] not in ("primary", "danger"):
                    raise ApiError("invalid_blocks")
                text.setdefault("emoji", True)
        if "block_id" in block and (not isinstance(block["block_id"], str) or
                                    not 1 <= len(block["block_id"]) <= 255):
            raise ApiError("invalid_blocks")
        block.setdefault("block_id", short_id())
        out.append(block)
    return out


def bot_message(text, ts, thread=None, blocks=None):
    """A message of the bot as Slack shows it in answers and payloads."""
    message = {"type": "message", "text": text, "user": BOT_USER, "bot_id": BOT_ID,
               "app_id": APP_ID, "team": TEAM, "ts": ts}
    if thread is not None:
        message["thread_ts"] = thread
    if blocks:
        message["blocks"] = blocks
    return message


class ApiError(Exception):
    """A Web API error: HTTP `status` with {"ok": false, "error": error}."""

    def __init__(self, error, status=200, headers=()):
        super().__init__(error)
        self.error, self.status, self.headers = error, status, headers


class Handler(FakeHandler):
    def send_error_json(self, status, message):
        self.send_json(status, {"ok": False, "error": message})

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def params(self, url, raw):
        p = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if raw and ctype == "application/x-www-form-urlencoded":
            p.update(urllib.parse.parse_qsl(raw.decode("utf-8", "replace"),
                                            keep_blank_values=True))
        elif raw:
            try:
                body = json.loads(raw.decode("utf-8"))
            except ValueError:
                raise ApiError("invalid_json")
            if not isinstance(body, dict):
                raise ApiError("invalid_json")
            p.update(body)
        return p

    def dispatch(self):
        url = urllib.parse.urlparse(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if url.path.startswith("/api/"):
            return self.api(url, raw)
        control = CONTROL.get((self.command, url.path))
        if control is None:
            return self.send_error_json(404, "no such path: " + url.path)
        try:
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if control in (c_event, c_press):  # post to Keel: not under the lock Keel's
                return self.send_json(200, control(body))  # calls need
            with lock:
                result = json.loads(json.dumps(control(body)))  # a snapshot
            self.send_json(200, result)
        except (ValueError, KeyError, TypeError) as e:
            self.send_error_json(400, "bad control request: %s" % e)

    def api(self, url, raw):
        method = url.path[len("/api/"):]
        call = {"method": method, "at": time.time(), "status": None}
        failure = None
        try:
            with lock:
                S["attempts"][method] += 1
                S["calls"].append(call)
                if self.headers.get("Authorization") != "Bearer " + TOKEN:
                    S["unauthorized"] += 1
                    raise ApiError("invalid_auth")
                if method not in METHODS:
                    raise ApiError("unknown_method")
                if S["failures"][method]:
                    failure = S["failures"][method].popleft()
            p = self.params(url, raw)
            with lock:
                if "channel" in p:
                    call["channel"] = p["channel"]
            if failure is not None:
                if failure.get("drop"):
                    with lock:
                        call["status"] = "drop"
                    return self.drop()
                if failure.get("delay") is not None:
                    time.sleep(float(failure["delay"]))
                elif failure.get("status"):
                    status = int(failure["status"])
                    if status == 429:
                        after = str(int(failure.get("retry_after", 1)))
                        raise ApiError("ratelimited", 429, [("Retry-After", after)])
                    raise ApiError(failure.get("error", "fatal_error"), status)
                elif failure.get("error"):
                    raise ApiError(failure["error"])
            result = dict({"ok": True}, **getattr(self, "m_" + method.replace(".", "_"))(p))
        except ApiError as e:
            with lock:
                call["status"], call["error"] = e.status, e.error
            return self.send_json(e.status, {"ok": False, "error": e.error}, e.headers)
        with lock:
            call["status"] = 200
        self.send_json(200, result)

    def m_auth_test(self, p):
        return {"url": "https://fake.slack.com/", "team": "Fake", "user": "keel",
                "team_id": TEAM, "user_id": BOT_USER, "bot_id": BOT_ID}

    def m_chat_postMessage(self, p):
        channel, text, thread = p.get("channel"), p.get("text"), p.get("thread_ts")
        with lock:
            if not isinstance(channel, str) or channel not in S["channels"]:
                raise ApiError("channel_not_found")
            blocks = checked_blocks(p["blocks"]) if p.get("blocks") is not None else None
            if not blocks and (not isinstance(text, str) or not text.strip()):
                raise ApiError("no_text")
            if text is not None and not isinstance(text, str):
                raise ApiError("invalid_arguments")
            text = text or ""
            if len(text) > MAX_TEXT:
                raise ApiError("msg_too_long")
            if BARE.search(text):
                S["unescaped"] += 1
            ts = new_ts()
            S["messages"].append(dict(p, _at=time.time(), _ts=ts, _text=shown(text)))
            S["posted"][(channel, ts)] = {"text": text, "blocks": blocks, "thread_ts": thread,
                                          "first_blocks": blocks}
        return {"channel": channel, "ts": ts, "message": bot_message(text, ts, thread, blocks)}

    def m_chat_update(self, p):
        channel, ts, text = p.get("channel"), p.get("ts"), p.get("text")
        with lock:
            if not isinstance(channel, str) or channel not in S["channels"]:
                raise ApiError("channel_not_found")
            message = S["posted"].get((channel, ts)) if isinstance(ts, str) else None
            if message is None:
                raise ApiError("message_not_found")
            blocks = checked_blocks(p["blocks"]) if p.get("blocks") is not None else None
            if text is not None and not isinstance(text, str):
                raise ApiError("invalid_arguments")
            if not blocks and not (text or "").strip():
                raise ApiError("no_text")
            text = text or ""
            if len(text) > MAX_TEXT:
                raise ApiError("msg_too_long")
            if BARE.search(text):
                S["unescaped"] += 1
            S["updates"].append(dict(p, _at=time.time(), _text=shown(text)))
            message["text"] = text
            if blocks is not None:
                message["blocks"] = blocks
            shown_now = bot_message(text, ts, message["thread_ts"], message["blocks"])
        return {"channel": channel, "ts": ts, "text": text, "message": shown_now}

    def m_chat_postEphemeral(self, p):
        channel, user, text = p.get("channel"), p.get("user"), p.get("text")
        with lock:
            if not isinstance(channel, str) or channel not in S["channels"]:
                raise ApiError("channel_not_found")
            if not isinstance(user, str) or not user:
                raise ApiError("user_not_found")
            if not isinstance(text, str) or not text.strip():
                raise ApiError("no_text")
            if len(text) > MAX_TEXT:
                raise ApiError("msg_too_long")
            if BARE.search(text):
                S["unescaped"] += 1
            ts = new_ts()
            S["ephemerals"].append(dict(p, _at=time.time(), _ts=ts, _text=shown(text)))
        return {"message_ts": ts}


# -------------------------------------------------------------------- control endpoints


def message_event(kind, spec, ts):
    """The event a "dm" or "mention" stands for."""
    for field in ("channel", "user", "text"):
        if not isinstance(spec.get(field), str):
            raise ValueError("%s needs a string %r" % (kind, field))
    event = {"type": "message" if kind == "dm" else "app_mention", "user": spec["user"],
             "text": spec["text"], "ts": ts, "team": TEAM, "channel": spec["channel"],
             "event_ts": ts, "client_msg_id": "%08x-0000-4000-8000-%012x" % (
                 secrets.randbits(32), secrets.randbits(48))}
    if kind == "dm":
        event["channel_type"] = "im"
    if spec.get("thread_ts") is not None:
        event["thread_ts"] = spec["thread_ts"]
    return event


def build(body):
    """(raw envelope, event_id, ts, challenge) for a /_event body (under lock)."""
    eid = body.get("event_id", "")
    if body.get("url_verification"):
        challenge = secrets.token_urlsafe(32)
        payload = {"token": "legacy", "challenge": challenge, "type": "url_verification"}
        return json.dumps(payload).encode(), None, None, challenge
    kinds = [k for k in ("event", "dm", "mention") if body.get(k) is not None]
    if not kinds:
        if eid not in S["sent"]:
            raise ValueError("'event', 'dm', 'mention' or 'url_verification' is required, or "
                             "the event_id of an envelope sent before")
        raw = S["sent"][eid]
        return raw, eid, json.loads(raw)["event"].get("ts"), None
    if len(kinds) > 1 or not isinstance(body[kinds[0]], dict):
        raise ValueError("one of 'event', 'dm' and 'mention' (an object)")
    if kinds[0] == "event":
        event = dict(body["event"])
    else:
        event = message_event(kinds[0], body[kinds[0]], new_ts())
    if eid == "":
        S["events"] += 1
        eid = "Ev%010d" % S["events"]
    envelope = {"token": "legacy", "team_id": TEAM, "api_app_id": APP_ID, "event": event,
                "type": "event_callback", "event_id": eid, "event_time": int(time.time()),
                "authorizations": [{"enterprise_id": None, "team_id": TEAM,
                                    "user_id": BOT_USER, "is_bot": True,
                                    "is_enterprise_install": False}],
                "is_ext_shared_channel": False,
                "event_context": "4-" + secrets.token_urlsafe(24)}
    if eid is None:
        del envelope["event_id"]
    for channel in (event.get("channel"), (event.get("item") or {}).get("channel")):
        if isinstance(channel, str):
            S["channels"].add(channel)
    raw = json.dumps(envelope).encode()
    if eid is not None:
        S["sent"][eid] = raw
    return raw, eid, event.get("ts"), None


def hook(body):
    """The URL and signing secret of a /_event or /_press body."""
    url = urllib.parse.urlparse(body["url"])
    secret = body["signing_secret"]
    if url.scheme != "http" or not url.hostname or not isinstance(secret, str):
        raise ValueError("'url' (an http:// URL) and 'signing_secret' (a string) are required")
    return url, secret


def c_event(body):
    url, secret = hook(body)
    with lock:
        raw, eid, ts, challenge = build(body)
    answer = {"event_id": eid, "ts": ts}
    if challenge is not None:
        answer["challenge"] = challenge
    answer.update(post_signed(url, secret, raw, "application/json", body))
    return answer


def post_signed(url, secret, raw, content_type, body):
    """POSTs `raw` to `url` signed as Slack signs (with the options of a /_event body: timestamp,
    signature, retry_num, body_suffix); {"status", "body"} and "error" when it failed."""
    stamp = body.get("timestamp", int(time.time()))
    signed = str(stamp if stamp is not None else int(time.time()))
    mac = hmac.new(secret.encode(), b"v0:" + signed.encode() + b":" + raw, hashlib.sha256)
    headers = {"Content-Type": content_type,
               "User-Agent": "Slackbot 1.0 (+https://api.slack.com/robots)"}
    if stamp is not None:
        headers["X-Slack-Request-Timestamp"] = signed
    signature = body.get("signature", "v0=" + mac.hexdigest())
    if signature is not None:
        headers["X-Slack-Signature"] = signature
    if body.get("retry_num") is not None:
        headers["X-Slack-Retry-Num"] = str(body["retry_num"])
        headers["X-Slack-Retry-Reason"] = "http_timeout"
    raw += (body.get("body_suffix") or "").encode()
    answer = {"status": None, "body": ""}
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=20)
    try:
        conn.request("POST", url.path or "/", body=raw, headers=headers)
        resp = conn.getresponse()
        answer.update(status=resp.status, body=resp.read().decode("utf-8", "replace"))
    except (OSError, http.client.HTTPException) as e:
        answer["error"] = repr(e)
    finally:
        conn.close()
    return answer


def press_payload(body):
    """The block_actions payload of a /_press body (under lock)."""
    channel, ts, user = body.get("channel"), body.get("ts"), body.get("user")
    if not all(isinstance(x, str) and x for x in (channel, ts, user)):
        raise ValueError("'channel', 'ts' and 'user' (strings) are required")
    message = S["posted"].get((channel, ts))
    if message is None:
        raise ValueError("no message %s was posted to %s" % (ts, channel))
    action_id = body.get("action_id") or ACTIONS.get(body.get("action"))
    if not isinstance(action_id, str):
        raise ValueError("'action' (approve or reject) or 'action_id' is required")
    found = None
    for blocks in ([message["blocks"]] + ([message["first_blocks"]] if body.get("stale") else [])):
        for block in blocks or []:
            for e in block.get("elements", []) if block.get("type") == "actions" else []:
                if e.get("action_id") == action_id and found is None:
                    found = (block["block_id"], e)
    if found is None:
        raise ValueError("message %s has no button %s%s" % (
            ts, action_id, "" if body.get("stale") else " now (\"stale\": true presses the "
                                                         "buttons it was posted with)"))
    block_id, button = found
    action = {"type": "button", "block_id": block_id, "action_id": action_id,
              "text": button["text"], "action_ts": "%.6f" % time.time()}
    value = body.get("value", button.get("value"))
    if value is not None:
        action["value"] = value
    if "style" in button:
        action["style"] = button["style"]
    container = {"type": "message", "message_ts": ts, "channel_id": channel,
                 "is_ephemeral": False}
    if message["thread_ts"] is not None:
        container["thread_ts"] = message["thread_ts"]
    username = body.get("username") or user.lower()
    n = len(S["presses"]) + 1
    return {
        "type": "block_actions",
        "user": {"id": user, "username": username, "name": username, "team_id": TEAM},
        "api_app_id": APP_ID, "token": "legacy", "container": container,
        "trigger_id": "%d.%d.%s" % (n, int(time.time()), secrets.token_hex(16)),
        "team": {"id": TEAM, "domain": "fake"}, "enterprise": None,
        "is_enterprise_install": False,
        "channel": {"id": channel,
                    "name": "directmessage" if channel.startswith("D") else channel.lower()},
        "message": bot_message(message["text"], ts, message["thread_ts"], message["blocks"]),
        "state": {"values": {}},
        "response_url": "https://hooks.slack.com/actions/%s/%d/%s" % (
            TEAM, n, secrets.token_urlsafe(18)),
        "actions": [action]}


def c_press(body):
    url, secret = hook(body)
    with lock:
        payload = press_payload(body)
        S["presses"].append(payload)
    raw = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    answer = {"payload": payload}
    answer.update(post_signed(url, secret, raw, "application/x-www-form-urlencoded", body))
    return answer


def c_sent(body):
    return {"messages": S["messages"], "updates": S["updates"], "ephemerals": S["ephemerals"],
            "presses": S["presses"], "attempts": dict(S["attempts"]), "calls": S["calls"],
            "unescaped": S["unescaped"], "unauthorized": S["unauthorized"],
            "channels": sorted(S["channels"])}


def c_fail(body):
    method, answers = body.get("method"), body.get("answers")
    if method not in METHODS or not isinstance(answers, list) or \
            not all(isinstance(a, dict) for a in answers):
        raise ValueError("'method' (%s) and 'answers' (objects) are required"
                         % " or ".join(METHODS))
    S["failures"][method].extend(answers)
    return {"queued": len(S["failures"][method])}


def c_reset(body):
    reset_recordings()
    return {"ok": True}


CONTROL = {("POST", "/_event"): c_event, ("POST", "/_press"): c_press,
           ("GET", "/_sent"): c_sent, ("POST", "/_fail"): c_fail, ("POST", "/_reset"): c_reset}


def main():
    global TOKEN, BOT_USER, TEAM
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--token", required=True)
    ap.add_argument("--bot-user", default=BOT_USER)
    ap.add_argument("--team", default=TEAM)
    args = ap.parse_args()
    TOKEN, BOT_USER, TEAM = args.token, args.bot_user, args.team
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sys.stdin.read()  # returns at EOF: the test that started us is gone
    except KeyboardInterrupt:
        pass
    server.shutdown()


if __name__ == "__main__":
    main()
