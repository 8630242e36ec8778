#!/usr/bin/env python3
"""A fake of Discord for Keel's tests: the HTTP API an application calls
(https://discord.com/developers/docs/reference, v10) and the sender of the interactions an
application's Interactions Endpoint URL receives (slash commands, and presses of the buttons on
its bot's messages, signed with Ed25519), speaking the real wire formats.

Usage: fake_discord.py --token BOT_TOKEN [--application-id 1100000000000000001]. It listens on
127.0.0.1 on a free port, prints the port on the first line of stdout, and serves until stdin
closes (so it dies with the test that started it) or it is sent SIGTERM. At start it makes the
application's Ed25519 key pair: `GET /_public_key` -> {"public_key": the raw 32 bytes in hex}.

API, under /api/v10, JSON; errors are Discord's {"message", "code"}: a missing or wrong
`Authorization: Bot TOKEN` where one is needed is 401 {"message": "401: Unauthorized", "code": 0}
(counted in `unauthorized`), an unknown path 404 {"message": "404: Not Found", "code": 0}.
- POST /applications/{app}/commands (bot; another app id: 404 Unknown Application, 10002):
  creates or overwrites (by name) a global command, 201 (200 when it overwrote) with the
  command ("id", "application_id", "version", ...); GET lists them; PUT (a list) overwrites all.
- PATCH /webhooks/{app}/{token}/messages/@original: edits the deferred response.
- POST /webhooks/{app}/{token}: a follow-up message. Both need no bot token, but an interaction
  token this fake issued, less than 15 minutes old, else 404 Unknown Webhook (10015).
- POST /channels/{channel}/messages (bot; a channel no interaction came from: 404 Unknown
  Channel, 10003): a bot message, answered with its Message object ("id", "channel_id",
  "content", "components", "author" the bot, ...), which the fake keeps (a button on it can be
  pressed, below).
- PATCH /channels/{channel}/messages/{message} (bot; "edit"): edits a bot message posted there
  (any other: 404 Unknown Message, 10008; an unknown channel 404 Unknown Channel, 10003). The
  fields given replace the message's ("content", "components": [] takes the buttons away,
  "embeds", "flags"); answered with the Message object, "edited_timestamp" set; recorded in
  `edits`. A message left with nothing in it is 400 Cannot send an empty message (50006).
Each message body is checked as Discord does: `content` over 2,000 characters is 400 Invalid
Form Body (50035, with "errors"); no content (empty or blank) and no components or embeds is
400 Cannot send an empty message (50006); `components` (buttons only, in this fake) must be a
list of at most 5 action rows ({"type": 1, "components": [...]}) of 1 to 5 buttons each
({"type": 2, "style": 1-5, "label"?: at most 80 characters, ...}); a button of style 1-4 needs a
"custom_id" of 1 to 100 characters, unique in the message, and no "url"; a link button (style 5)
a "url" and no custom_id; else 400 Invalid Form Body (50035) with Discord's nested "errors"
({"components": {"0": {"components": {"1": {"custom_id": {"_errors": [{"code", "message"}]}}}}}}).
Each message taken is answered with a Message object and recorded; a body without
"allowed_mentions": {"parse": []} (which Keel must send, so that no answer pings @everyone) is
counted in `no_allowed_mentions` (an edit's is recorded in its "safe", not counted: Discord
pings nobody on an edit).

Failure injection per route ("commands", "original", "followup", "channel", "edit"), consumed in
order after the bot token is checked (POST /_fail {"route", "answers": [...]}): {"status": 429,
"retry_after": S} (HTTP 429, `Retry-After: ceil(S)`, body {"message": "You are being rate
limited.", "retry_after": S, "global": false}), {"status": 500} (any other status: that status
with {"message", "code"} given or "500: Internal Server Error", 0), e.g. {"status": 403, "code":
50001, "message": "Missing Access"}, {"drop": true} (the request is read and recorded, then the
connection closed without an answer), {"delay": S} (answered normally after S seconds, the token
checked then).

Control endpoints (JSON):
- POST /_interaction {"url": KEEL_HOOK_URL, and one of "ping": true, "command": {"name" ("ask"),
  "message": TEXT (the string option "message"; null: no options), "options" (sent instead),
  "channel_id" ("2200000000000000001"), "guild_id" (none: a DM), "user": {"id", "username",
  "global_name"?, "bot"?} (default Ann), "nick"?}, or "resend": INTERACTION_ID (the same bytes
  again, newly signed: what a replay looks like). Optional: "interaction_id" (default a new
  snowflake), "age": S (the interaction and its token made S seconds ago: its snowflake's time
  and the token's 15 minutes count from then), "timestamp" (sent in X-Signature-Timestamp and
  signed with; null leaves the header out), "signature" (hex, sent instead of the right one;
  null leaves the header out), "wrong_key": true (signed with another key: a forgery),
  "body_suffix" (appended after signing: tampering). The interaction is Discord's, with a new
  interaction token remembered with its time, and its channel remembered (the bot may post
  there). Signs as Discord does: X-Signature-Ed25519 is the hex signature of TIMESTAMP + BODY.
  POSTs once; answers {"status" (null when the POST failed: "error" says why), "body" (parsed
  JSON when it parses), "interaction_id", "token"}.
- POST /_press {"url": KEEL_HOOK_URL, "message_id": a bot message posted through POST
  /channels/{channel}/messages, and "button" (the label or custom_id of one of its buttons as it
  is now: 400 when it has none such, as Discord shows no such button) or "custom_id" (sent as
  given: a client that still shows a button since taken away, or a forgery)}: someone presses a
  button. Optional: "user" (default: in a DM the person whose command the fake sent there, else
  Ann),
  "guild_id" (default: the guild the fake saw the message's channel in; none: a DM), "nick",
  "component_type" (2), and "interaction_id", "age", "timestamp", "signature", "wrong_key",
  "body_suffix" as for /_interaction. The interaction is Discord's MESSAGE_COMPONENT (type 3):
  {"id", "application_id", "type": 3, "token", "version": 1, "channel_id", "channel",
  "guild_id" + "member": {"user", ...} in a server or "user" in a DM, "message": the Message
  object as it is now, "data": {"custom_id", "component_type": 2}, "app_permissions",
  "entitlements", "locale", "context", ...}, with a new interaction token; signed and POSTed as
  /_interaction does (recorded in `presses`, and resent by "resend" like any interaction).
  Answers as /_interaction: {"status", "body", "interaction_id", "token"}.
- POST /_age {"token", "seconds"}: the token is that much older.
- GET /_sent: {"messages": [bodies taken, plus "kind" (original/followup/channel), "token"
  (webhooks), "channel_id", "interaction_id" (webhooks), "message_id", "safe" (had the
  allowed_mentions), "_at"], "edits": [bodies of bot message edits taken (PATCH
  /channels/..., not @original), plus "channel_id", "message_id",
  "safe", "_at"], "presses": [{"interaction_id", "message_id", "channel_id", "custom_id",
  "user_id", "_at"}], "commands": [the commands as Discord answers them, plus "body" (as
  last sent) and "_at"], "attempts": {route: n}, "calls": [{"route",
  "method", "at", "status" (HTTP status, "drop", or null while unanswered), "code", "token",
  "channel_id", "message_id" (edits), "auth"}], "no_allowed_mentions": n, "unauthorized": n,
  "channels": [...]}.
- GET /_message?id=MESSAGE_ID: a bot message as it is now (400 when none).
- POST /_reset: clears the recordings and queued failures (not the commands, tokens, channels,
  bot messages or interactions sent).
"""

import argparse
import base64
import collections
import http.client
import itertools
import json
import math
import re
import secrets
import sys
import threading
import time
import urllib.parse
from datetime import datetime, timezone

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from fake_http import FakeHandler, Server

TOKEN, APP_ID = None, "1100000000000000001"
KEY = Ed25519PrivateKey.generate()
PUBLIC_KEY = KEY.public_key().public_bytes(serialization.Encoding.Raw,
                                           serialization.PublicFormat.Raw).hex()
ROUTES = ("commands", "original", "followup", "channel", "edit")
MAX_CONTENT = 2000
MAX_ROWS, MAX_BUTTONS, MAX_LABEL, MAX_CUSTOM_ID = 5, 5, 80, 100
TOKEN_LIFE = 15 * 60
DISCORD_EPOCH_MS = 1420070400000
COMMAND_NAME = re.compile(r"^[-_a-z0-9]{1,32}$")
DEFAULT_USER = {"id": "3300000000000000001", "username": "ann", "global_name": "Ann"}

lock = threading.Lock()
S = {}  # the state, under lock
_seq = itertools.count(1)


def reset_recordings():
    S.update(messages=[], edits=[], presses=[], calls=[], attempts=collections.Counter(),
             unauthorized=0, no_allowed_mentions=0,
             failures=collections.defaultdict(collections.deque))


# places: channel id -> {"guild_id" (None: a DM), "recipient" (a DM's user)}; posted: the bot
# messages (Message objects) posted with the bot token, by id.
S.update(commands={}, tokens={}, channels=set(), places={}, posted={}, sent={}, originals={})
reset_recordings()


def snowflake(at=None):
    """A snowflake id made at `at` (unix seconds; now by default): ms since Discord's epoch << 22,
    then a worker, a process and an increment."""
    ms = int((time.time() if at is None else at) * 1000) - DISCORD_EPOCH_MS
    return str((ms << 22) | (1 << 17) | (next(_seq) % 4096))


def iso(at):
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="microseconds")


class ApiError(Exception):
    """An API error: HTTP `status` with {"message", "code"} (and `extra` fields)."""

    def __init__(self, status, message, code=0, headers=(), **extra):
        super().__init__(message)
        self.status, self.headers = status, list(headers)
        self.body = dict({"message": message, "code": code}, **extra)


def unauthorized():
    return ApiError(401, "401: Unauthorized")


def unknown_webhook():
    return ApiError(404, "Unknown Webhook", 10015)


def component_errors(components):
    """Discord's nested "errors" for a message's `components` ({} when they are valid): action
    rows of buttons (the only components this fake knows)."""
    errors = {}

    def add(path, code, msg):
        at = errors
        for key in path:
            at = at.setdefault(str(key), {})
        at.setdefault("_errors", []).append({"code": code, "message": msg})

    if not isinstance(components, list):
        add((), "LIST_TYPE_CONVERT", "Only iterables may be used.")
        return errors
    if len(components) > MAX_ROWS:
        add((), "BASE_TYPE_MAX_LENGTH", "Must be %d or fewer in length." % MAX_ROWS)
    seen = set()
    for i, row in enumerate(components):
        if not isinstance(row, dict):
            add((i,), "DICT_TYPE_CONVERT", "Only dictionaries may be used.")
            continue
        if row.get("type") != 1:
            add((i, "type"), "UNION_TYPE_CHOICES",
                'Value of field "type" must be one of (1,).')
            continue
        buttons = row.get("components")
        if not isinstance(buttons, list) or not 1 <= len(buttons) <= MAX_BUTTONS:
            add((i, "components"), "BASE_TYPE_BAD_LENGTH",
                "Must be between 1 and %d in length." % MAX_BUTTONS)
            continue
        for j, b in enumerate(buttons):
            at = (i, "components", j)
            if not isinstance(b, dict):
                add(at, "DICT_TYPE_CONVERT", "Only dictionaries may be used.")
                continue
            if b.get("type") != 2:
                add(at + ("type",), "UNION_TYPE_CHOICES",
                    'Value of field "type" must be one of (2,).')
                continue
            style = b.get("style")
            if type(style) is not int or not 1 <= style <= 5:
                add(at + ("style",), "BASE_TYPE_CHOICES", "Value must be one of {1, 2, 3, 4, 5}.")
                continue
            label = b.get("label")
            if label is not None and not isinstance(label, str):
                add(at + ("label",), "BASE_TYPE_BAD_TYPE", "Must be a string.")
            elif label is not None and len(label) > MAX_LABEL:
                add(at + ("label",), "BASE_TYPE_MAX_LENGTH",
                    "Must be %d or fewer in length." % MAX_LABEL)
            elif not label and not b.get("emoji"):
                add(at, "BUTTON_COMPONENT_LABEL_OR_EMOJI_REQUIRED",
                    "A label or an emoji is required.")
            custom_id = b.get("custom_id")
            if style == 5:
                if not isinstance(b.get("url"), str) or not b["url"]:
                    add(at + ("url",), "BUTTON_COMPONENT_URL_REQUIRED",
                        "A url is required for link buttons.")
                if custom_id is not None:
                    add(at + ("custom_id",), "BUTTON_COMPONENT_CUSTOM_ID_INVALID",
                        "A custom id cannot be set on a link button.")
                continue
            if b.get("url") is not None:
                add(at + ("url",), "BUTTON_COMPONENT_URL_INVALID",
                    "A url can only be set on a link button.")
            if custom_id is None:
                add(at + ("custom_id",), "BASE_TYPE_REQUIRED", "This field is required")
            elif not isinstance(custom_id, str):
                add(at + ("custom_id",), "BASE_TYPE_BAD_TYPE", "Must be a string.")
            elif not 1 <= len(custom_id) <= MAX_CUSTOM_ID:
                add(at + ("custom_id",), "BASE_TYPE_BAD_LENGTH",
                    "Must be between 1 and %d in length." % MAX_CUSTOM_ID)
            elif custom_id in seen:
                add(at + ("custom_id",), "COMPONENT_CUSTOM_ID_DUPLICATED",
                    "Component custom id cannot be duplicated")
            else:
                seen.add(custom_id)
    return errors


def check_fields(body):
    """Discord's checks of a message body's fields (a send's or an edit's)."""
    if not isinstance(body, dict):
        raise ApiError(400, "Invalid Form Body", 50035,
                       errors={"_errors": [{"code": "DICT_TYPE_CONVERT",
                                            "message": "Only dictionaries may be used."}]})
    content = body.get("content")
    if content is not None and not isinstance(content, str):
        raise ApiError(400, "Invalid Form Body", 50035, errors={"content": {"_errors": [
            {"code": "BASE_TYPE_BAD_TYPE", "message": "Must be a string."}]}})
    if content is not None and len(content) > MAX_CONTENT:
        raise ApiError(400, "Invalid Form Body", 50035, errors={"content": {"_errors": [
            {"code": "BASE_TYPE_MAX_LENGTH", "message": "Must be 2000 or fewer in length."}]}})
    if body.get("components") is not None:
        errors = component_errors(body["components"])
        if errors:
            raise ApiError(400, "Invalid Form Body", 50035, errors={"components": errors})


def empty(m):
    return not (m.get("content") or "").strip() and not m.get("embeds") and \
        not m.get("components")


def check_message(body):
    """Discord's checks of a message body; returns whether allowed_mentions stops every ping."""
    check_fields(body)
    if empty(body):
        raise ApiError(400, "Cannot send an empty message", 50006)
    am = body.get("allowed_mentions")
    return isinstance(am, dict) and am.get("parse") == [] and not am.get("users") and \
        not am.get("roles")


class Handler(FakeHandler):
    def send_error_json(self, status, message):
        self.send_json(status, {"message": message, "code": 0})

    def do_GET(self):
        self.dispatch()

    def do_POST(self):
        self.dispatch()

    def do_PATCH(self):
        self.dispatch()

    def do_PUT(self):
        self.dispatch()

    def dispatch(self):
        url = urllib.parse.urlparse(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if url.path.startswith("/api/v10/"):
            return self.api(url.path[len("/api/v10"):], raw)
        control = CONTROL.get((self.command, url.path))
        if control is None:
            return self.send_error_json(404, "404: Not Found")
        try:
            body = json.loads(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            if self.command == "GET":
                body = dict(urllib.parse.parse_qsl(url.query))
            # These post to Keel: not under the lock that Keel's calls to the fake need.
            if control in (c_interaction, c_press):
                return self.send_json(200, control(body))
            with lock:
                result = json.loads(json.dumps(control(body)))  # a snapshot
            self.send_json(200, result)
        except (ValueError, KeyError, TypeError) as e:
            self.send_error_json(400, "bad control request: %s" % e)

    def route(self, path):
        """(route kind, handler, needs the bot token, path parameters) of an API path."""
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "applications" and parts[2] == "commands" \
                and self.command in ("GET", "POST", "PUT"):
            return "commands", self.m_commands, True, parts[1:2]
        if len(parts) == 5 and parts[0] == "webhooks" and parts[3:] == ["messages", "@original"] \
                and self.command == "PATCH":
            return "original", self.m_webhook, False, parts[1:3]
        if len(parts) == 3 and parts[0] == "webhooks" and self.command == "POST":
            return "followup", self.m_webhook, False, parts[1:3]
        if len(parts) == 3 and parts[0] == "channels" and parts[2] == "messages" \
                and self.command == "POST":
            return "channel", self.m_channel, True, parts[1:2]
        if len(parts) == 4 and parts[0] == "channels" and parts[2] == "messages" \
                and self.command == "PATCH":
            return "edit", self.m_edit, True, [parts[1], parts[3]]
        return None, None, False, None

    def api(self, path, raw):
        kind, handler, bot, params = self.route(path)
        if kind is None:
            return self.send_json(404, {"message": "404: Not Found", "code": 0})
        auth = self.headers.get("Authorization")
        call = {"route": kind, "method": self.command, "at": time.time(), "status": None,
                "auth": auth == "Bot " + TOKEN}
        if kind in ("original", "followup"):
            call["token"] = params[1]
        elif kind in ("channel", "edit"):
            call["channel_id"] = params[0]
            if kind == "edit":
                call["message_id"] = params[1]
        failure = None
        try:
            with lock:
                S["attempts"][kind] += 1
                S["calls"].append(call)
                if bot and auth != "Bot " + TOKEN:
                    S["unauthorized"] += 1
                    raise unauthorized()
                if S["failures"][kind]:
                    failure = S["failures"][kind].popleft()
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
                        after = float(failure.get("retry_after", 1))
                        e = ApiError(429, "You are being rate limited.", headers=[
                            ("Retry-After", str(int(math.ceil(after)))),
                            ("X-RateLimit-Limit", "5"), ("X-RateLimit-Remaining", "0"),
                            ("X-RateLimit-Reset-After", "%.3f" % after),
                            ("X-RateLimit-Scope", "user")])
                        e.body = {"message": "You are being rate limited.",
                                  "retry_after": after, "global": False}
                        raise e
                    raise ApiError(status, failure.get("message", "500: Internal Server Error"),
                                   int(failure.get("code", 0)))
            try:
                body = json.loads(raw.decode("utf-8")) if raw.strip() else None
            except ValueError:
                raise ApiError(400, "The request body contains invalid JSON.", 50109)
            status, result = handler(params, body)
        except ApiError as e:
            with lock:
                call["status"], call["code"] = e.status, e.body.get("code")
            return self.send_json(e.status, e.body, e.headers)
        with lock:
            call["status"] = status
        self.send_json(status, result)

    # ------------------------------------------------------------------ the API's routes

    def m_commands(self, params, body):
        if params[0] != APP_ID:
            raise ApiError(404, "Unknown Application", 10002)
        with lock:
            if self.command == "GET":
                return 200, list(S["commands"].values())
        if self.command == "PUT":
            if not isinstance(body, list):
                raise ApiError(400, "Invalid Form Body", 50035, errors={"_errors": [
                    {"code": "LIST_TYPE_CONVERT", "message": "Only iterables may be used."}]})
            made = [command(c) for c in body]
            with lock:
                S["commands"] = {}
                out = [upsert(c)[1] for c in made]
            return 200, out
        made = command(body)
        with lock:
            existed, out = upsert(made)
        return (200 if existed else 201), out

    def m_webhook(self, params, body):
        app, token = params
        now = time.time()
        with lock:
            issued = S["tokens"].get(token)
            if app != APP_ID or issued is None or now - issued["at"] >= TOKEN_LIFE:
                raise unknown_webhook()
        safe = check_message(body)
        kind = "original" if self.command == "PATCH" else "followup"
        with lock:
            if kind == "original":
                mid = S["originals"].setdefault(token, snowflake())
            else:
                mid = snowflake()
            record(body, kind, issued["channel_id"], mid, safe, token=token,
                   interaction_id=issued["interaction_id"])
        return 200, message(body, issued["channel_id"], mid, webhook=True,
                            edited=kind == "original")

    def m_channel(self, params, body):
        channel = params[0]
        with lock:
            if channel not in S["channels"]:
                raise ApiError(404, "Unknown Channel", 10003)
        safe = check_message(body)
        mid = snowflake()
        with lock:
            record(body, "channel", channel, mid, safe)
            m = S["posted"][mid] = message(body, channel, mid)
            return 200, json.loads(json.dumps(m))

    def m_edit(self, params, body):
        channel, mid = params
        with lock:
            if channel not in S["channels"]:
                raise ApiError(404, "Unknown Channel", 10003)
            m = S["posted"].get(mid)
            if m is None or m["channel_id"] != channel:
                raise ApiError(404, "Unknown Message", 10008)
        check_fields(body)
        am = body.get("allowed_mentions")
        safe = isinstance(am, dict) and am.get("parse") == [] and not am.get("users") and \
            not am.get("roles")
        with lock:
            edited = dict(m)
            for field in ("content", "components", "embeds", "flags"):
                if field in body and body[field] is not None:
                    edited[field] = body[field]
            if empty(edited):
                raise ApiError(400, "Cannot send an empty message", 50006)
            edited["edited_timestamp"] = iso(time.time())
            m.update(edited)
            S["edits"].append(dict(body, channel_id=channel, message_id=mid, safe=safe,
                                   _at=time.time()))
            return 200, json.loads(json.dumps(m))


def command(body):
    """A command as Discord keeps it, from a create body (400 when Discord would refuse it)."""
    def invalid(field, msg):
        return ApiError(400, "Invalid Form Body", 50035, errors={field: {"_errors": [
            {"code": "APPLICATION_COMMAND_INVALID", "message": msg}]}})
    if not isinstance(body, dict):
        raise invalid("_", "Only dictionaries may be used.")
    name, ctype = body.get("name"), body.get("type", 1)
    if not isinstance(name, str) or not COMMAND_NAME.match(name):
        raise invalid("name", "Command name is invalid")
    description = body.get("description", "")
    if ctype == 1 and not (isinstance(description, str) and 1 <= len(description) <= 100):
        raise invalid("description", "Must be between 1 and 100 in length.")
    options = body.get("options") or []
    for o in options:
        if not isinstance(o, dict) or not isinstance(o.get("name"), str) or \
                not COMMAND_NAME.match(o["name"]) or \
                not (isinstance(o.get("description"), str) and 1 <= len(o["description"]) <= 100):
            raise invalid("options", "Invalid option")
    return dict(body, type=ctype, options=options)


def upsert(c):
    """Records a command (under lock); (whether one of its name existed, what Discord answers)."""
    old = S["commands"].get(c["name"])
    out = {"id": old["id"] if old else snowflake(), "application_id": APP_ID,
           "version": snowflake(), "default_member_permissions": None, "type": c["type"],
           "name": c["name"], "name_localizations": None,
           "description": c.get("description", ""), "description_localizations": None,
           "options": c["options"], "dm_permission": True, "contexts": None,
           "integration_types": [0], "nsfw": False}
    S["commands"][c["name"]] = dict(out, _body=c, _at=time.time())
    return old is not None, out


def record(body, kind, channel, mid, safe, **more):
    """Records a message taken (under lock)."""
    if not safe:
        S["no_allowed_mentions"] += 1
    S["messages"].append(dict(body, kind=kind, channel_id=channel, message_id=mid, safe=safe,
                              _at=time.time(), **more))


def message(body, channel, mid, webhook=False, edited=False):
    """The Message object Discord answers a send with."""
    now = time.time()
    m = {"id": mid, "type": 20 if edited else 0, "channel_id": channel,
         "content": body.get("content", ""), "author": {
             "id": APP_ID, "username": "keel", "discriminator": "0000", "global_name": None,
             "avatar": None, "bot": True, "public_flags": 0},
         "attachments": [], "embeds": body.get("embeds") or [], "mentions": [],
         "mention_roles": [], "mention_everyone": False, "pinned": False, "tts": False,
         "timestamp": iso(now), "edited_timestamp": iso(now) if edited else None,
         "flags": int(body.get("flags") or 0), "components": body.get("components") or []}
    if webhook:
        m.update(webhook_id=APP_ID, application_id=APP_ID)
    return m


# -------------------------------------------------------------------- control endpoints


def interaction_token(iid):
    """A token shaped as Discord's: base64 of "interaction:ID:" and random characters."""
    head = base64.b64encode(("interaction:%s:" % iid).encode()).decode().rstrip("=")
    return head + secrets.token_urlsafe(96)


def build(body):
    """(raw interaction, interaction id, token) for an /_interaction body (under lock)."""
    if body.get("resend") is not None:
        if body["resend"] not in S["sent"]:
            raise ValueError("'resend' names no interaction sent before")
        raw, token = S["sent"][body["resend"]]
        return raw, body["resend"], token
    age = float(body.get("age") or 0)
    made = time.time() - age
    iid = str(body.get("interaction_id") or snowflake(made))
    token = interaction_token(iid)
    if body.get("ping"):
        payload = {"id": iid, "application_id": APP_ID, "type": 1, "token": token,
                   "version": 1}
        S["tokens"][token] = {"at": made, "interaction_id": iid, "channel_id": None}
    elif isinstance(body.get("command"), dict):
        c = body["command"]
        name = c.get("name", "ask")
        channel = str(c.get("channel_id", "2200000000000000001"))
        guild = c.get("guild_id")
        user = full_user(c.get("user") or DEFAULT_USER)
        if c.get("options") is not None:
            options = c["options"]
        elif c.get("message") is not None:
            options = [{"type": 3, "name": "message", "value": c["message"]}]
        else:
            options = []
        registered = S["commands"].get(name)
        data = {"id": registered["id"] if registered else snowflake(), "name": name,
                "type": 1}
        if options:
            data["options"] = options
        payload = {"app_permissions": "0", "application_id": APP_ID, "channel_id": channel,
                   "data": data, "entitlements": [], "id": iid, "locale": "en-US",
                   "token": token, "type": 2, "version": 1}
        if guild is not None:
            data["guild_id"] = str(guild)
        where(payload, channel, guild, user, c.get("nick"), made)
        S["tokens"][token] = {"at": made, "interaction_id": iid, "channel_id": channel}
        S["channels"].add(channel)
        place = {"guild_id": None if guild is None else str(guild)}
        if guild is None:
            place["recipient"] = user
        S["places"][channel] = place
    else:
        raise ValueError("'ping', 'command' (an object) or 'resend' is required")
    raw = json.dumps(payload).encode()
    S["sent"][iid] = (raw, token)
    return raw, iid, token


def full_user(user):
    """A User object as Discord sends it, from the fields a test gives."""
    user = dict(user)
    user.setdefault("discriminator", "0")
    user.setdefault("avatar", None)
    user.setdefault("public_flags", 0)
    user.setdefault("global_name", None)
    return user


def where(payload, channel, guild, user, nick, made):
    """Adds to an interaction who sent it and where: "guild_id", "member" (its "user") and the
    guild's channel in a server; "user" and the DM channel in a DM."""
    if guild is not None:
        member = {"user": user, "nick": nick, "roles": [], "avatar": None,
                  "joined_at": iso(made - 86400), "deaf": False, "mute": False, "flags": 0,
                  "pending": False, "permissions": "2248473465835073"}
        payload.update(guild_id=str(guild), member=member, guild_locale="en-US",
                       guild={"id": str(guild), "locale": "en-US", "features": []},
                       channel={"id": channel, "type": 0, "guild_id": str(guild),
                                "name": "general", "flags": 0},
                       context=0, authorizing_integration_owners={"0": str(guild)})
    else:
        payload.update(user=user, channel={"id": channel, "type": 1, "flags": 0,
                                           "recipients": [user]},
                       context=1, authorizing_integration_owners={"0": user["id"]})


def build_press(body):
    """(raw interaction, interaction id, token) of a button's press (under lock): a
    MESSAGE_COMPONENT interaction on a bot message the fake keeps."""
    mid = str(body.get("message_id") or "")
    m = S["posted"].get(mid)
    if m is None:
        raise ValueError("'message_id' names no bot message posted to a channel")
    buttons = [b for row in m.get("components") or [] for b in row.get("components") or []]
    if body.get("custom_id") is not None:
        custom_id = body["custom_id"]
    elif body.get("button") is not None:
        found = [b for b in buttons if body["button"] in (b.get("label"), b.get("custom_id"))]
        if not found:
            raise ValueError("the message has no button %r now (it has %r)"
                             % (body["button"], [b.get("label") for b in buttons]))
        custom_id = found[0].get("custom_id")
    else:
        raise ValueError("'button' or 'custom_id' is required")
    channel = m["channel_id"]
    place = S["places"].get(channel, {})
    guild = body["guild_id"] if "guild_id" in body else place.get("guild_id")
    default = place.get("recipient") if guild is None else None
    user = full_user(body.get("user") or default or DEFAULT_USER)
    made = time.time() - float(body.get("age") or 0)
    iid = str(body.get("interaction_id") or snowflake(made))
    token = interaction_token(iid)
    payload = {"app_permissions": "0", "application_id": APP_ID, "channel_id": channel,
               "data": {"custom_id": custom_id,
                        "component_type": int(body.get("component_type", 2))},
               "entitlements": [], "id": iid, "locale": "en-US", "message": m,
               "token": token, "type": 3, "version": 1}
    where(payload, channel, guild, user, body.get("nick"), made)
    S["tokens"][token] = {"at": made, "interaction_id": iid, "channel_id": channel}
    S["presses"].append({"interaction_id": iid, "message_id": mid, "channel_id": channel,
                         "custom_id": custom_id, "user_id": user.get("id"), "_at": time.time()})
    raw = json.dumps(payload).encode()
    S["sent"][iid] = (raw, token)
    return raw, iid, token


def c_interaction(body, builder=build):
    url = urllib.parse.urlparse(body["url"])
    if url.scheme != "http" or not url.hostname:
        raise ValueError("'url' (an http:// URL) is required")
    with lock:
        raw, iid, token = builder(body)
    stamp = body.get("timestamp", int(time.time()))
    signed = str(stamp if stamp is not None else int(time.time()))
    key = Ed25519PrivateKey.generate() if body.get("wrong_key") else KEY
    headers = {"Content-Type": "application/json",
               "User-Agent": "Discord-Interactions/1.0 (+https://discord.com)"}
    if stamp is not None:
        headers["X-Signature-Timestamp"] = signed
    signature = body.get("signature", key.sign(signed.encode() + raw).hex())
    if signature is not None:
        headers["X-Signature-Ed25519"] = signature
    raw += (body.get("body_suffix") or "").encode()
    answer = {"status": None, "body": "", "interaction_id": iid, "token": token}
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=20)
    try:
        conn.request("POST", url.path or "/", body=raw, headers=headers)
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", "replace")
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = text
        answer.update(status=resp.status, body=parsed)
    except (OSError, http.client.HTTPException) as e:
        answer["error"] = repr(e)
    finally:
        conn.close()
    return answer


def c_press(body):
    return c_interaction(body, build_press)


def c_age(body):
    token, seconds = body["token"], float(body["seconds"])
    if token not in S["tokens"]:
        raise ValueError("no such token")
    S["tokens"][token]["at"] -= seconds
    return {"age": time.time() - S["tokens"][token]["at"]}


def c_public_key(body):
    return {"public_key": PUBLIC_KEY}


def c_sent(body):
    return {"messages": S["messages"], "edits": S["edits"], "presses": S["presses"],
            "commands": [dict({k: v for k, v in c.items() if k != "_body"}, body=c["_body"])
                         for c in S["commands"].values()],
            "attempts": dict(S["attempts"]), "calls": S["calls"],
            "no_allowed_mentions": S["no_allowed_mentions"], "unauthorized": S["unauthorized"],
            "channels": sorted(S["channels"])}


def c_fail(body):
    route, answers = body.get("route"), body.get("answers")
    if route not in ROUTES or not isinstance(answers, list) or \
            not all(isinstance(a, dict) for a in answers):
        raise ValueError("'route' (%s) and 'answers' (objects) are required"
                         % " or ".join(ROUTES))
    S["failures"][route].extend(answers)
    return {"queued": len(S["failures"][route])}


def c_reset(body):
    reset_recordings()
    return {"ok": True}


def c_message(body):
    m = S["posted"].get(str(body.get("id") or ""))
    if m is None:
        raise KeyError("no such bot message")
    return m


CONTROL = {("POST", "/_interaction"): c_interaction, ("POST", "/_press"): c_press,
           ("GET", "/_message"): c_message, ("POST", "/_age"): c_age,
           ("GET", "/_public_key"): c_public_key, ("GET", "/_sent"): c_sent,
           ("POST", "/_fail"): c_fail, ("POST", "/_reset"): c_reset}


def main():
    global TOKEN, APP_ID
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--token", required=True)
    ap.add_argument("--application-id", default=APP_ID)
    args = ap.parse_args()
    TOKEN, APP_ID = args.token, args.application_id
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
