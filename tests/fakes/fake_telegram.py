#!/usr/bin/env python3
"""A fake Telegram Bot API server for Keel's tests, speaking the real wire format
(https://core.telegram.org/bots/api).

Usage: fake_telegram.py --token TOKEN [--bot-id ID] [--username NAME]. It listens on 127.0.0.1
on a free port, prints the port on the first line of stdout, and serves until stdin closes (so it
dies with the test that started it) or it is sent SIGTERM.

Bot methods are `POST /bot<TOKEN>/<method>` (or GET; parameters in the query string, a JSON body
with Content-Type application/json, or a form body; a body of another type is ignored, as
Telegram ignores it). Every answer is `{"ok": true, "result": ...}` or `{"ok": false,
"error_code": N, "description": "...", "parameters": {...}}` with HTTP status N. A wrong token is
401 Unauthorized, an unknown method 404 Not Found; method names are case-insensitive.

- getMe: the bot. setWebhook {url, secret_token, allowed_updates}: the webhook (secret_token 1
  to 256 of A-Z, a-z, 0-9, _ and -); deleteWebhook, getWebhookInfo: as Telegram. While a
  webhook is set, getUpdates is 409 (`Conflict: can't use getUpdates method while webhook is
  active; use deleteWebhook to delete the webhook first`).
- getUpdates {offset, limit, timeout, allowed_updates}: updates with update_id < offset are
  confirmed and forgotten; answers the queued ones with update_id >= offset (at most limit),
  waiting up to timeout seconds for one. As Telegram does, a getUpdates arriving while another
  waits terminates the waiting one with 409 `Conflict: terminated by other getUpdates request;
  ...`; `conflicts` counts those whose client was still connected (two live pollers of one bot),
  not those a dead client left behind. allowed_updates is recorded but not applied: Telegram
  may deliver updates queued before it changed, so a client must ignore what it did not ask for.
- sendMessage {chat_id, text, parse_mode, reply_parameters, message_thread_id, reply_markup,
  ...}: checked as Telegram checks it (a chat no update came from: `chat not found`; an empty
  text; a text longer than 4096 UTF-16 code units after entity parsing: `message is too long`;
  with parse_mode HTML, a `<` that does not start a supported tag, an unbalanced tag, or a `&`
  that does not start an entity (&lt; &gt; &amp; &quot; or numeric): `can't parse entities:
  ...`; text that is not UTF-8; a reply_markup that is not an object: `can't parse reply
  keyboard markup JSON object`). An inline keyboard ({"inline_keyboard": [[BUTTON, ...], ...]})
  must be an array of arrays of buttons, each an object with a non-empty string "text" and one
  action field (`can't parse inline keyboard button: ...` otherwise); a callback_data that is not
  a string of 1 to 64 bytes is `BUTTON_DATA_INVALID`. Answers the Message {message_id, from (the
  bot), chat {id, type}, date, text (the parsed text), reply_markup (a non-empty inline keyboard
  only), message_thread_id}, as Telegram's does.
- editMessageText {chat_id, message_id, text, parse_mode, reply_markup}: the bot's message (in
  a chat no update came from: `chat not found`; not one of the bot's messages there: `message
  to edit not found`) gets the text and the inline keyboard (omitted or {"inline_keyboard": []}:
  none). The same text and keyboard it has: `message is not modified: specified new message
  content and reply markup are exactly the same as a current content and reply markup of the
  message`. Text and markup are checked as sendMessage's (a markup other than an inline
  keyboard: `inline keyboard expected`). Answers the edited Message (with edit_date).
- answerCallbackQuery {callback_query_id, text (0 to 200 characters, else `MESSAGE_TOO_LONG`),
  show_alert, url, cache_time}: true. A query id no queued or pushed update carried, or one
  answered already: `query is too old and response timeout expired or query ID is invalid`.
- sendChatAction {chat_id, action}: true.

Failure injection, per method, consumed in order before normal answers (POST /_fail):
{"status": 429, "retry_after": S}, {"status": 500}, {"status": 403, "description": "..."} (any
status, with a default description), {"drop": true} (the whole request is read and counted, then
the connection is closed without an answer), {"delay": S} (answered normally after S seconds;
{"delay": 0} is a normal answer), {"garbled": true} (carried out, then answered 200 with an HTML
page instead of the result, as a broken proxy in front of Telegram would).

Control endpoints (no token, JSON):
- POST /_updates {"updates": [UPDATE, ...]}: queued; an update without update_id gets the next
  one (from 1000). Answers {"update_ids": [...]}.
- POST /_message {"chat_id", "text", "from_id" (default chat_id), "first_name" ("Ann"),
  "username", "chat_type" ("private"; "group", "supergroup", "channel"), "is_bot" (false),
  "reply_to_bot" (the message replies to the bot's last message in the chat),
  "message_thread_id"}: queues a realistic text message Update (a "mention" entity per @word,
  UTF-16 offsets). Answers {"update_id", "message_id"}.
- POST /_press {"chat_id", "message_id" (a message the bot sent there), "from_id" (required),
  "first_name" ("Ann"), "username", "is_bot" (false), "button" (0: the index of the button in
  the message's first row), "data" (default: that button's callback_data; given, it is sent as
  is, null for none)}: queues the Update of a press of that message's button, as Telegram
  delivers it: {"update_id", "callback_query": {"id" (a new query id, a string of digits),
  "from" {"id", "is_bot", "first_name", "username"?, "language_code"}, "message" (the message as
  it is now, its reply_markup included while it has buttons), "chat_instance" (a string, one per
  chat), "data"}}. A message whose buttons an edit removed is pressed with the keyboard it was
  sent with (a press made before the edit, delivered after it). Answers {"update_id",
  "callback_query_id"}.
- GET /_sent: {"messages": [sendMessage bodies as received (reply_markup included), plus "_at"
  (time.time()), "_text" (the text as Telegram shows it) and "_message_id"], "edits":
  [editMessageText bodies that changed a message, plus "_at" and "_text"], "callback_answers":
  [answerCallbackQuery bodies answered, plus "_at"], "actions": [sendChatAction bodies, plus
  "_at"], "attempts": {method: calls, failed or not}, "calls": [{"method", "at", "status"
  (HTTP status, "drop", or null while unanswered), "chat_id" when given}], "polls": [each
  authorized getUpdates' offset, null for none], "poll_requests": [their parameters],
  "pending": [update_ids still queued], "conflicts": N, "unauthorized": N}.
- POST /_fail {"method": "sendMessage", "answers": [...]}: queues failures.
- POST /_reset: clears the recordings and queued failures (not the update queue, the bot's
  messages, the presses' query ids or counters).
- POST /_push {"update": UPDATE}, {"message": (as /_message)} or {"press": (as /_press)},
  optional "secret" (sent instead of the webhook's secret_token; null for no header): POSTs the
  update to the webhook as Telegram does, once (Telegram would retry a non-2xx answer later; a
  test repeats the push). Answers {"update_id", "status" (Keel's HTTP status), "body"}, and
  "callback_query_id" for a press. 409 when no webhook is set.
"""

import argparse
import collections
import http.client
import json
import re
import select
import socket
import sys
import threading
import time
import urllib.parse

from fake_http import FakeHandler, Server

BOT = {"id": 7000001, "is_bot": True, "first_name": "Keel Test", "username": "keel_test_bot"}
TOKEN = None
METHODS = {m.lower(): m for m in ("getMe", "getUpdates", "sendMessage", "sendChatAction",
                                   "deleteWebhook", "getWebhookInfo", "setWebhook",
                                   "editMessageText", "answerCallbackQuery")}
TAGS = {"b", "strong", "i", "em", "u", "ins", "s", "strike", "del", "span", "tg-spoiler", "a",
        "tg-emoji", "code", "pre", "blockquote"}
ACTIONS = {"typing", "upload_photo", "record_video", "upload_video", "record_voice",
           "upload_voice", "upload_document", "choose_sticker", "find_location",
           "record_video_note", "upload_video_note"}
ENTITY = re.compile(r"&(lt|gt|amp|quot|#[0-9]{1,8}|#[xX][0-9a-fA-F]{1,7});")
TAG = re.compile(r"<(/?)([a-zA-Z][a-zA-Z0-9-]*)(\s[^<>]*)?>")
MENTION = re.compile(r"@[A-Za-z0-9_]+")
INT_PARAMS = {"offset", "limit", "timeout", "chat_id", "message_thread_id", "reply_to_message_id",
              "message_id"}
# What an inline keyboard button does besides showing its text: exactly one of these.
BUTTON_ACTIONS = ("url", "callback_data", "web_app", "login_url", "switch_inline_query",
                  "switch_inline_query_current_chat", "switch_inline_query_chosen_chat",
                  "copy_text", "callback_game", "pay")
NOT_MODIFIED = ("Bad Request: message is not modified: specified new message content and reply "
                "markup are exactly the same as a current content and reply markup of the message")
QUERY_INVALID = ("Bad Request: query is too old and response timeout expired or query ID is "
                 "invalid")

cond = threading.Condition()
S = {}  # the state, under cond


def reset_recordings():
    S.update(messages=[], edits=[], callback_answers=[], actions=[], calls=[], polls=[],
             poll_requests=[], conflicts=0, unauthorized=0, attempts=collections.Counter(),
             failures=collections.defaultdict(collections.deque))


# bot_messages: (chat, message_id) -> the Message as it is now; keyboards: -> the inline keyboard
# it was sent with; queries: callback query id -> {"answered": bool}.
S.update(updates=[], next_update_id=1000, chats={}, last_id={}, bot_last={}, waiter=None,
         webhook={"url": "", "secret": None}, bot_messages={}, keyboards={}, queries={},
         next_query=5810000000000000000)
reset_recordings()


class ApiError(Exception):
    def __init__(self, status, description, parameters=None):
        super().__init__(description)
        self.status, self.description, self.parameters = status, description, parameters


def utf16_len(text):
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def byte_offset(text, i):
    return len(text[:i].encode("utf-8", "surrogatepass"))


def parse_html(text):
    """The text Telegram shows for `text` sent with parse_mode HTML; ApiError when it does not
    parse."""
    out, stack, i = [], [], 0
    while i < len(text):
        c = text[i]
        if c == "&":
            m = ENTITY.match(text, i)
            if not m:
                raise ApiError(400, "Bad Request: can't parse entities: Character '&' at byte "
                               "offset %d does not begin an HTML entity" % byte_offset(text, i))
            name = m.group(1)
            if name[0] == "#":
                code = int(name[2:], 16) if name[1] in "xX" else int(name[1:])
                if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF or code == 0:
                    raise ApiError(400, "Bad Request: can't parse entities: invalid numeric "
                                   "entity at byte offset %d" % byte_offset(text, i))
                out.append(chr(code))
            else:
                out.append({"lt": "<", "gt": ">", "amp": "&", "quot": '"'}[name])
            i = m.end()
        elif c == "<":
            m = TAG.match(text, i)
            name = m.group(2).lower() if m else ""
            if not m or name not in TAGS:
                raise ApiError(400, 'Bad Request: can\'t parse entities: Unsupported start tag '
                               '"%s" at byte offset %d' % (name, byte_offset(text, i)))
            if m.group(1):
                if not stack or stack[-1] != name:
                    raise ApiError(400, "Bad Request: can't parse entities: Unmatched end tag "
                                   'at byte offset %d, expected "</%s>", found "</%s>"'
                                   % (byte_offset(text, i), stack[-1] if stack else "", name))
                stack.pop()
            else:
                stack.append(name)
            i = m.end()
        else:
            out.append(c)
            i += 1
    if stack:
        raise ApiError(400, "Bad Request: can't parse entities: Can't find end tag "
                       'corresponding to start tag "%s"' % stack[-1])
    return "".join(out)


def check_utf8(value):
    """Strings in a JSON body must be UTF-8: a lone surrogate (\\ud83d) is not."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(400, "Bad Request: strings must be encoded in UTF-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            check_utf8(k)
            check_utf8(v)
    elif isinstance(value, list):
        for v in value:
            check_utf8(v)


def as_int(params, name, default=None):
    value = params.get(name, default)
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ApiError(400, "Bad Request: invalid %s specified" % name)


def check_markup(markup, inline_only=False):
    """The inline keyboard `markup` shows (None for none), once checked as Telegram checks a
    reply_markup; ApiError when it does not parse. Another kind of markup (a reply keyboard, its
    removal, force_reply) is taken as is and shows no inline keyboard, unless `inline_only`."""
    if markup is None:
        return None
    if not isinstance(markup, dict):
        raise ApiError(400, "Bad Request: can't parse reply keyboard markup JSON object")
    if "inline_keyboard" not in markup:
        if inline_only:
            raise ApiError(400, "Bad Request: inline keyboard expected")
        return None
    rows = markup["inline_keyboard"]
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise ApiError(400, 'Bad Request: field "inline_keyboard" of the InlineKeyboardMarkup '
                       'should be an Array of Arrays')
    for row in rows:
        for button in row:
            if not isinstance(button, dict):
                raise ApiError(400, "Bad Request: can't parse inline keyboard button: "
                               "InlineKeyboardButton should be an Object")
            if not isinstance(button.get("text"), str) or not button["text"]:
                raise ApiError(400, "Bad Request: can't parse inline keyboard button: Field "
                               '"text" must be of type String')
            actions = [a for a in BUTTON_ACTIONS if a in button]
            if not actions:
                raise ApiError(400, "Bad Request: can't parse inline keyboard button: Text "
                               "buttons are unallowed in the inline keyboard")
            if len(actions) > 1:
                raise ApiError(400, "Bad Request: can't parse inline keyboard button: "
                               "InlineKeyboardButton must have exactly one optional field")
            if "callback_data" in button:
                data = button["callback_data"]
                if not isinstance(data, str) or not 1 <= len(data.encode("utf-8")) <= 64:
                    raise ApiError(400, "Bad Request: BUTTON_DATA_INVALID")
    if not any(rows):
        return None  # no button: no keyboard
    return {"inline_keyboard": [list(r) for r in rows if r]}


def checked_text(p):
    """The text a sendMessage or editMessageText shows (its parse_mode applied); ApiError when
    Telegram would refuse it."""
    text = p.get("text")
    if not isinstance(text, str) or not text:
        raise ApiError(400, "Bad Request: message text is empty")
    mode = p.get("parse_mode") or ""
    if not isinstance(mode, str) or mode.lower() not in ("", "html", "markdown", "markdownv2"):
        raise ApiError(400, "Bad Request: unsupported parse_mode")
    shown = parse_html(text) if mode.lower() == "html" else text
    if not shown.strip():
        raise ApiError(400, "Bad Request: message text is empty")
    if utf16_len(shown) > 4096:
        raise ApiError(400, "Bad Request: message is too long")
    return shown


def chat_key(chat_id):
    try:
        return int(chat_id)
    except (TypeError, ValueError):
        return chat_id


def remember_update(u):
    """Notes the chats and message ids an update shows, and the query id of a press (under
    cond)."""
    q = u.get("callback_query")
    if isinstance(q, dict) and isinstance(q.get("id"), str):
        S["queries"].setdefault(q["id"], {"answered": False})
    for v in u.values():
        if isinstance(v, dict) and isinstance(v.get("chat"), dict) and "id" in v["chat"]:
            cid = chat_key(v["chat"]["id"])
            S["chats"][cid] = v["chat"].get("type", "private")
            if isinstance(v.get("message_id"), int):
                S["last_id"][cid] = max(S["last_id"].get(cid, 0), v["message_id"])


def queue_update(u):
    """Queues one update (under cond); returns its update_id."""
    if "update_id" not in u:
        u["update_id"] = S["next_update_id"]
    if not isinstance(u["update_id"], int):
        raise ApiError(400, "update_id must be an integer")
    S["next_update_id"] = max(S["next_update_id"], u["update_id"] + 1)
    remember_update(u)
    S["updates"].append(u)
    S["updates"].sort(key=lambda x: x["update_id"])
    cond.notify_all()
    return u["update_id"]


def build_message(p):
    """The Update POST /_message describes (under cond)."""
    chat_id, text = p["chat_id"], p["text"]
    ctype = p.get("chat_type", "private")
    sender = {"id": p.get("from_id", chat_id), "is_bot": bool(p.get("is_bot", False)),
              "first_name": p.get("first_name", "Ann")}
    if p.get("username"):
        sender["username"] = p["username"]
    chat = {"id": chat_id, "type": ctype}
    if ctype == "private":
        chat["first_name"] = sender["first_name"]
        if p.get("username"):
            chat["username"] = p["username"]
    else:
        chat["title"] = "Group %s" % chat_id
    key = chat_key(chat_id)
    earlier = S["bot_last"].get(key)
    if p.get("reply_to_bot") and earlier is None:  # an answer of the bot from before
        S["last_id"][key] = S["last_id"].get(key, 0) + 1
        earlier = {"message_id": S["last_id"][key], "from": dict(BOT), "chat": chat,
                   "date": int(time.time()) - 60, "text": "An earlier answer."}
    message_id = S["last_id"].get(key, 0) + 1
    S["last_id"][key] = message_id
    msg = {"message_id": message_id, "from": sender, "chat": chat, "date": int(time.time()),
           "text": text}
    entities = [{"type": "mention", "offset": utf16_len(text[:m.start()]),
                 "length": utf16_len(m.group())} for m in MENTION.finditer(text)]
    if entities:
        msg["entities"] = entities
    if p.get("message_thread_id") is not None:
        msg["message_thread_id"] = p["message_thread_id"]
        msg["is_topic_message"] = True
    if p.get("reply_to_bot"):
        msg["reply_to_message"] = earlier
    return {"message": msg}


def connection_alive(sock):
    """False when the peer of a connection waiting for its answer has gone (EOF or reset)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        if not readable:
            return True
        return sock.recv(1, socket.MSG_PEEK) != b""
    except OSError:
        return False


class Handler(FakeHandler):
    def send_error_json(self, status, message, parameters=None):
        body = {"ok": False, "error_code": status, "description": message}
        if parameters:
            body["parameters"] = parameters
        self.send_json(status, body)

    def not_found(self, message=None):
        self.send_error_json(404, "Not Found")

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            raw = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return raw
                raw += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def params(self, url, raw):
        """The request's parameters: the query string, then a JSON or form body."""
        p = {k: v for k, v in urllib.parse.parse_qsl(url.query, keep_blank_values=True)}
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if raw and ctype == "application/json":
            try:
                body = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise ApiError(400, "Bad Request: strings must be encoded in UTF-8")
            except ValueError:
                raise ApiError(400, "Bad Request: can't parse JSON object")
            if not isinstance(body, dict):
                raise ApiError(400, "Bad Request: can't parse JSON object")
            check_utf8(body)
            p.update(body)
        elif raw and ctype == "application/x-www-form-urlencoded":
            p.update(urllib.parse.parse_qsl(raw.decode("utf-8", "replace"),
                                            keep_blank_values=True))
        for k, v in list(p.items()):  # text parameters carry JSON for structured values
            if isinstance(v, str) and (k in INT_PARAMS or v[:1] in "[{"):
                try:
                    p[k] = json.loads(v)
                except ValueError:
                    pass
        return p

    def dispatch(self):
        url = urllib.parse.urlparse(self.path)
        raw = self.read_body()
        try:
            if url.path.startswith("/bot"):
                return self.bot_method(url, raw)
            control = CONTROL.get((self.command, url.path))
            if control is None:
                return self.not_found()
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise ApiError(400, "the body must be a JSON object")
            if control is c_push:  # posts to Keel: not under the lock Keel's calls need
                return self.send_json(200, c_push(body))
            with cond:
                result = json.loads(json.dumps(control(body)))  # a snapshot
            self.send_json(200, result)
        except ApiError as e:
            self.send_error_json(e.status, e.description, e.parameters)
        except (ValueError, KeyError, TypeError) as e:
            self.send_error_json(400, "Bad Request: %s" % e)

    def bot_method(self, url, raw):
        token, _, name = url.path[len("/bot"):].partition("/")
        method = METHODS.get(name.lower(), name)
        call = {"method": method, "at": time.time(), "status": None}
        with cond:
            S["attempts"][method] += 1
            S["calls"].append(call)
            if token != TOKEN:
                S["unauthorized"] += 1
                call["status"] = 401
                raise ApiError(401, "Unauthorized")
            if name.lower() not in METHODS:
                call["status"] = 404
                raise ApiError(404, "Not Found")
            failure = S["failures"][method].popleft() if S["failures"][method] else None
        try:
            params = self.params(url, raw)
            with cond:
                if "chat_id" in params:
                    call["chat_id"] = params["chat_id"]
            if failure is not None:
                if failure.get("drop"):
                    with cond:
                        call["status"] = "drop"
                    return self.drop()
                if failure.get("delay") is not None:
                    time.sleep(float(failure["delay"]))
                elif failure.get("status"):
                    raise injected(failure)
            result = getattr(self, "m_" + method)(params)
        except ApiError as e:
            with cond:
                call["status"] = e.status
            raise
        with cond:
            call["status"] = 200
        if failure is not None and failure.get("garbled"):
            page = b"<html><body>upstream answered</body></html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)
            return
        self.send_json(200, {"ok": True, "result": result})

    # ---------------------------------------------------------------- bot methods

    def m_getMe(self, p):
        return dict(BOT, can_join_groups=True, can_read_all_group_messages=False,
                    supports_inline_queries=False)

    def m_setWebhook(self, p):
        url, secret = p.get("url"), p.get("secret_token")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ApiError(400, "Bad Request: bad webhook: An HTTPS URL must be provided for "
                           "webhook")
        if secret is not None and not re.fullmatch(r"[A-Za-z0-9_-]{1,256}", str(secret)):
            raise ApiError(400, "Bad Request: secret token contains unallowed characters")
        with cond:
            S["webhook"] = {"url": url, "secret": secret}
            S["setwebhook_calls"] = S.get("setwebhook_calls", 0) + 1
            cond.notify_all()
        return True

    def m_deleteWebhook(self, p):
        with cond:
            S["webhook"] = {"url": "", "secret": None}
        return True

    def m_getWebhookInfo(self, p):
        with cond:
            return {"url": S["webhook"]["url"], "has_custom_certificate": False,
                    "pending_update_count": len(S["updates"])}

    def m_getUpdates(self, p):
        offset, limit = as_int(p, "offset"), as_int(p, "limit", 100)
        timeout = min(max(as_int(p, "timeout", 0), 0), 600)
        limit = min(max(limit, 1), 100)
        me = {"conn": self.connection, "superseded": False}
        with cond:
            if S["webhook"]["url"]:
                raise ApiError(409, "Conflict: can't use getUpdates method while webhook is "
                               "active; use deleteWebhook to delete the webhook first")
            S["polls"].append(offset)
            S["poll_requests"].append(p)
            if offset is not None:
                if offset >= 0:
                    S["updates"] = [u for u in S["updates"] if u["update_id"] >= offset]
                else:
                    S["updates"] = S["updates"][offset:]
            old = S["waiter"]
            if old is not None:
                old["superseded"] = True
                if connection_alive(old["conn"]):
                    S["conflicts"] += 1
                cond.notify_all()
            deadline = time.monotonic() + timeout
            while True:
                batch = S["updates"][:limit]
                left = deadline - time.monotonic()
                if batch or me["superseded"] or left <= 0:
                    break
                S["waiter"] = me
                cond.wait(left)
            if S["waiter"] is me:
                S["waiter"] = None
            if me["superseded"]:
                raise ApiError(409, "Conflict: terminated by other getUpdates request; make "
                               "sure that only one bot instance is running")
            return json.loads(json.dumps(batch))

    def known_chat(self, p):
        if p.get("chat_id") in (None, ""):
            raise ApiError(400, "Bad Request: chat_id is empty")
        key = chat_key(p["chat_id"])
        with cond:
            if key not in S["chats"]:
                raise ApiError(400, "Bad Request: chat not found")
            return key, S["chats"][key]

    def m_sendMessage(self, p):
        key, ctype = self.known_chat(p)
        shown = checked_text(p)
        keyboard = check_markup(p.get("reply_markup"))
        reply = p.get("reply_parameters")
        if reply is not None and (not isinstance(reply, dict) or
                                  not isinstance(reply.get("message_id"), int)):
            raise ApiError(400, "Bad Request: invalid reply parameters specified")
        thread = p.get("message_thread_id")
        if thread is not None and not isinstance(thread, int):
            raise ApiError(400, "Bad Request: invalid message_thread_id specified")
        with cond:
            if reply is not None and not reply.get("allow_sending_without_reply") and \
                    reply["message_id"] > S["last_id"].get(key, 0):
                raise ApiError(400, "Bad Request: message to be replied not found")
            message_id = S["last_id"].get(key, 0) + 1
            S["last_id"][key] = message_id
            msg = {"message_id": message_id, "from": dict(BOT),
                   "chat": {"id": key, "type": ctype}, "date": int(time.time()), "text": shown}
            if thread is not None:
                msg["message_thread_id"] = thread
            if keyboard is not None:
                msg["reply_markup"] = keyboard
                S["keyboards"][(key, message_id)] = keyboard["inline_keyboard"]
            S["bot_last"][key] = msg
            S["bot_messages"][(key, message_id)] = msg
            S["messages"].append(dict(p, _at=time.time(), _text=shown, _message_id=message_id))
            return json.loads(json.dumps(msg))

    def m_editMessageText(self, p):
        if p.get("inline_message_id") and p.get("chat_id") in (None, ""):
            raise ApiError(400, "Bad Request: message to edit not found")  # none sent inline
        key, _ = self.known_chat(p)
        message_id = as_int(p, "message_id")
        if message_id is None:
            raise ApiError(400, "Bad Request: message identifier is not specified")
        shown = checked_text(p)
        keyboard = check_markup(p.get("reply_markup"), inline_only=True)
        with cond:
            msg = S["bot_messages"].get((key, message_id))
            if msg is None:
                raise ApiError(400, "Bad Request: message to edit not found")
            if msg["text"] == shown and msg.get("reply_markup") == keyboard:
                raise ApiError(400, NOT_MODIFIED)
            msg["text"] = shown
            msg["edit_date"] = int(time.time())
            if keyboard is None:
                msg.pop("reply_markup", None)
            else:
                msg["reply_markup"] = keyboard
            S["edits"].append(dict(p, _at=time.time(), _text=shown))
            return json.loads(json.dumps(msg))

    def m_answerCallbackQuery(self, p):
        query = p.get("callback_query_id")
        query = str(query) if isinstance(query, (str, int)) and not isinstance(query, bool) \
            else ""
        text = p.get("text", "")
        if text is not None and not isinstance(text, str):
            raise ApiError(400, "Bad Request: can't parse text")
        if text and utf16_len(text) > 200:
            raise ApiError(400, "Bad Request: MESSAGE_TOO_LONG")
        alert = p.get("show_alert", False)
        if isinstance(alert, str):
            alert = alert.lower() in ("true", "1")
        with cond:
            q = S["queries"].get(query)
            if q is None or q["answered"]:
                raise ApiError(400, QUERY_INVALID)
            q["answered"] = True
            S["callback_answers"].append(dict(p, show_alert=bool(alert), _at=time.time()))
        return True

    def m_sendChatAction(self, p):
        self.known_chat(p)
        if p.get("action") not in ACTIONS:
            raise ApiError(400, "Bad Request: wrong parameter action in request")
        with cond:
            S["actions"].append(dict(p, _at=time.time()))
        return True


def injected(failure):
    status = int(failure["status"])
    if status == 429:
        after = int(failure.get("retry_after", 1))
        return ApiError(429, failure.get("description", "Too Many Requests: retry after %d"
                                         % after), {"retry_after": after})
    default = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
               500: "Internal Server Error", 502: "Bad Gateway"}.get(status, "Error")
    return ApiError(status, failure.get("description", default))


# -------------------------------------------------------------------- control endpoints


def build_press(p):
    """The Update POST /_press describes (under cond)."""
    if "chat_id" not in p or "message_id" not in p or "from_id" not in p:
        raise ApiError(400, "'chat_id', 'message_id' and 'from_id' are required")
    key, message_id = chat_key(p["chat_id"]), int(p["message_id"])
    msg = S["bot_messages"].get((key, message_id))
    if msg is None:
        raise ApiError(400, "the bot sent no message %s in chat %s" % (message_id, key))
    if "data" in p:
        data = p["data"]
    else:
        keyboard = (msg.get("reply_markup") or {}).get("inline_keyboard") or \
            S["keyboards"].get((key, message_id))
        index = int(p.get("button", 0))
        if not keyboard or not 0 <= index < len(keyboard[0]):
            raise ApiError(400, "message %s in chat %s has no button %d in its first row"
                           % (message_id, key, index))
        data = keyboard[0][index].get("callback_data")
    sender = {"id": p["from_id"], "is_bot": bool(p.get("is_bot", False)),
              "first_name": p.get("first_name", "Ann"), "language_code": "en"}
    if p.get("username"):
        sender["username"] = p["username"]
    S["next_query"] += 1
    query = str(S["next_query"])  # remember_update notes it when it is queued or pushed
    q = {"id": query, "from": sender, "message": json.loads(json.dumps(msg)),
         "chat_instance": str(-(4000000000000000000 + abs(hash(str(key))) % 10 ** 18))}
    if data is not None:
        q["data"] = data
    return {"callback_query": q}


def c_press(body):
    update = build_press(body)
    return {"update_id": queue_update(update), "callback_query_id": update["callback_query"]["id"]}


def c_updates(body):
    updates = body.get("updates")
    if not isinstance(updates, list) or not all(isinstance(u, dict) for u in updates):
        raise ApiError(400, "'updates' must be an array of objects")
    return {"update_ids": [queue_update(dict(u)) for u in updates]}


def c_message(body):
    if "chat_id" not in body or not isinstance(body.get("text"), str):
        raise ApiError(400, "'chat_id' and a string 'text' are required")
    update = build_message(body)
    return {"update_id": queue_update(update), "message_id": update["message"]["message_id"]}


def c_sent(body):
    return {"webhook": S["webhook"], "setwebhook_calls": S.get("setwebhook_calls", 0),
            "messages": S["messages"], "edits": S["edits"],
            "callback_answers": S["callback_answers"], "actions": S["actions"],
            "attempts": dict(S["attempts"]), "calls": S["calls"], "polls": S["polls"],
            "poll_requests": S["poll_requests"],
            "pending": [u["update_id"] for u in S["updates"]],
            "conflicts": S["conflicts"], "unauthorized": S["unauthorized"]}


def c_fail(body):
    method = METHODS.get(str(body.get("method", "")).lower())
    answers = body.get("answers")
    if method is None or not isinstance(answers, list) or \
            not all(isinstance(a, dict) for a in answers):
        raise ApiError(400, "'method' (a bot method) and 'answers' (objects) are required")
    S["failures"][method].extend(answers)
    return {"queued": len(S["failures"][method])}


def c_reset(body):
    reset_recordings()
    return {"ok": True}


def c_push(body):
    with cond:
        hook = dict(S["webhook"])
        if not hook["url"]:
            raise ApiError(409, "no webhook is set")
        if isinstance(body.get("message"), dict):
            update = build_message(body["message"])
        elif isinstance(body.get("press"), dict):
            update = build_press(body["press"])
        elif isinstance(body.get("update"), dict):
            update = dict(body["update"])
        else:
            raise ApiError(400, "'update', 'message' or 'press' (an object) is required")
        if "update_id" not in update:
            update["update_id"] = S["next_update_id"]
        if isinstance(update["update_id"], int):
            S["next_update_id"] = max(S["next_update_id"], update["update_id"] + 1)
        remember_update(update)
    secret = body["secret"] if "secret" in body else hook["secret"]
    url = urllib.parse.urlparse(hook["url"])
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=60)
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret
    conn.request("POST", url.path or "/", body=json.dumps(update), headers=headers)
    resp = conn.getresponse()
    answer = resp.read().decode("utf-8", "replace")
    conn.close()
    out = {"update_id": update.get("update_id"), "status": resp.status, "body": answer}
    if "callback_query" in update and isinstance(update["callback_query"], dict):
        out["callback_query_id"] = update["callback_query"].get("id")
    return out


CONTROL = {("POST", "/_updates"): c_updates, ("POST", "/_push"): c_push,
           ("POST", "/_message"): c_message, ("POST", "/_press"): c_press,
           ("GET", "/_sent"): c_sent, ("POST", "/_fail"): c_fail, ("POST", "/_reset"): c_reset}


def main():
    global TOKEN
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--token", required=True)
    ap.add_argument("--bot-id", type=int, default=7000001)
    ap.add_argument("--username", default="keel_test_bot")
    args = ap.parse_args()
    TOKEN = args.token
    BOT.update(id=args.bot_id, username=args.username)
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
