// Channels (owners and users; the API refuses guests): every channel of every agent the token
// sees, with its status (ready, disabled, or error with the reason) and its hook URL, and its
// outbox: the answers and approval cards it sends back to the chat, dead and unknown ones first
// with why. Owners enable and disable a channel. Live from the channel.* events; Refresh for
// what has none (a poll that starts failing, a card shown or edited).
import { useEffect, useRef, useState } from 'preact/hooks';
import {
  errorText,
  get,
  getAll,
  patch,
  qs,
  seg,
  type Agent,
  type Channel,
  type ChannelReply,
  type Page,
} from '../api';
import { ErrorText, Fold, IdLink, Json, Loading, Status, StreamBadge, Time, shortId } from '../components';
import { href } from '../router';
import { useCoalesce, useStream, type Handlers } from '../stream';
import { isOwner, useWho } from '../who';

// Read from the outbox, 500 at a time: its newest replies and its dead and unknown ones, up to
// this many of each, then ordered here.
const OUTBOX_MAX = 2000;
// Rows shown per channel on the list (failed ones first), and per "Show more" on its page.
const COMPACT_ROWS = 5;
const PAGE_ROWS = 50;
// Characters of a reply's text shown before its fold.
const SHORT_TEXT = 200;
// Agents whose channels are read at once.
const PARALLEL = 6;

const FAILED = new Set(['dead', 'unknown']);
const STATUS_ORDER = ['dead', 'unknown', 'waiting', 'pending', 'sending', 'shown', 'sent', 'skipped'];

// Where a channel's deliveries come from, by kind (a polled telegram channel has no URL).
const URL_NOTE: Record<string, string> = {
  webhook: 'signed deliveries (Standard Webhooks) are posted here',
  telegram: 'Telegram posts the bot’s updates here (webhook mode)',
  slack: 'the Slack app’s Request URL (events and interactivity)',
  discord: 'the Discord application’s Interactions Endpoint URL',
};

// Whether a channel sends replies (a webhook channel takes deliveries and answers none).
const chats = (c: Channel) => c.kind !== 'webhook';

export function ChannelsPage() {
  const owner = isOwner(useWho());
  const [channels, setChannels] = useState<Channel[] | null>(null);
  const [names, setNames] = useState<Map<string, string>>(new Map());
  const [error, setError] = useState<string | null>(null);
  // Bumped per channel when its outbox changed, so that it is read again.
  const [versions, setVersions] = useState<Record<string, number>>({});
  const coalesce = useCoalesce();
  const seq = useRef(0);

  async function readAll() {
    const n = ++seq.current;
    try {
      const agents = await getAll<Agent>('/v1/agents');
      const found: Channel[] = [];
      const problems: string[] = [];
      for (let i = 0; i < agents.length; i += PARALLEL) {
        const batch = agents.slice(i, i + PARALLEL);
        const got = await Promise.allSettled(batch.map((a) => getAll<Channel>(`/v1/agents/${seg(a.id)}/channels`)));
        got.forEach((r, j) => (r.status === 'fulfilled' ? found.push(...r.value) : problems.push(`${batch[j].name}: ${errorText(r.reason)}`)));
      }
      if (n !== seq.current) return;
      setNames(new Map(agents.map((a) => [a.id, a.name])));
      setChannels(found);
      setError(problems.length ? 'Could not read the channels of ' + problems.join('; ') : null);
    } catch (e) {
      if (n === seq.current) setError(errorText(e));
    }
  }
  function readAgents() {
    getAll<Agent>('/v1/agents')
      .then((agents) => setNames(new Map(agents.map((a) => [a.id, a.name]))))
      .catch(() => {});
  }
  function readOne(id: string) {
    get<Channel>('/v1/channels/' + seg(id))
      .then((c) => setChannels((l) => l && [...l.filter((x) => x.id !== c.id), c]))
      .catch(() => {});
  }
  useEffect(() => {
    readAll();
  }, []);

  const bump = (id: string) => setVersions((v) => ({ ...v, [id]: (v[id] ?? 0) + 1 }));
  const outbox = (ev: any) => {
    const id = ev.payload?.channel_id;
    if (id) coalesce('o' + id, () => bump(id));
  };
  const one = (ev: any) => {
    const id = ev.payload?.channel_id;
    if (id) coalesce('c' + id, () => readOne(id));
  };
  const live = useStream(
    {},
    {
      'channel.created@v1': one,
      'channel.updated@v1': one,
      'channel.deleted@v1': (ev) => {
        const id = ev.payload?.channel_id;
        if (id) setChannels((l) => l && l.filter((c) => c.id !== id));
      },
      'channel.delivered@v1': (ev) => {
        one(ev); // a delivery taken: a failing poll works again
        outbox(ev);
      },
      'channel.replied@v1': outbox,
      'channel.reply_failed@v1': outbox,
      'channel.card_shown@v1': outbox,
      'channel.status@v1': one, // a poll started failing, or works again
      'agent.created@v1': () => coalesce('agents', readAgents),
      // Its channels stop ("its agent was deleted") and leave the list with it.
      'agent.deleted@v1': () => coalesce('all', readAll),
    },
  );

  const sorted = channels && [...channels].sort((a, b) => compare(names.get(a.agent_id) ?? a.agent_id, names.get(b.agent_id) ?? b.agent_id) || compare(a.name, b.name));
  return (
    <section aria-labelledby="channels-h">
      <div class="page-head">
        <h1 id="channels-h">Channels</h1>
        <StreamBadge state={live} />
      </div>
      <p class="muted small">
        An agent's doors besides the API: webhooks, and Telegram, Slack and Discord bots, whose answers and approval cards go back through a durable outbox. A
        reply that is <strong>dead</strong> was refused for good; one that is <strong>unknown</strong> may or may not have reached the chat, and is never sent
        again. Create channels with <code>POST /v1/agents/ID/channels</code> (docs/CHANNELS.md).
      </p>
      {!owner && <p class="muted small">Enabling and disabling need an owner token: this page is read-only for you.</p>}
      <ErrorText error={error} />
      {!sorted && !error && <Loading what="channels" />}
      {sorted && sorted.length === 0 && <p class="muted">No agent has a channel.</p>}
      {sorted && sorted.length > 0 && (
        <ul class="list" aria-labelledby="channels-h">
          {sorted.map((c) => (
            <li key={c.id}>
              <ChannelCard
                c={c}
                owner={owner}
                agentName={names.get(c.agent_id)}
                version={versions[c.id] ?? 0}
                compact
                onChange={(next) => setChannels((l) => l && l.map((x) => (x.id === next.id ? next : x)))}
              />
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

// One channel (#/channels/ID), its whole outbox.
export function ChannelPage({ id }: { id: string }) {
  const owner = isOwner(useWho());
  const [c, setC] = useState<Channel | null>(null);
  const [agentName, setAgentName] = useState<string | undefined>(undefined);
  const [error, setError] = useState<string | null>(null);
  const [deleted, setDeleted] = useState(false);
  const [version, setVersion] = useState(0);
  const coalesce = useCoalesce();

  function read() {
    get<Channel>('/v1/channels/' + seg(id))
      .then((ch) => {
        setC(ch);
        setError(null);
      })
      .catch((e) => setError(errorText(e)));
  }
  useEffect(read, [id]);
  const agentId = c?.agent_id;
  useEffect(() => {
    if (!agentId) return;
    get<Agent>('/v1/agents/' + seg(agentId))
      .then((a) => setAgentName(a.name))
      .catch(() => {});
  }, [agentId]);

  const mine = (fn: () => void) => (ev: any) => ev.payload?.channel_id === id && fn();
  const outbox = mine(() => coalesce('outbox', () => setVersion((v) => v + 1)));
  const handlers: Handlers = {
    'channel.updated@v1': mine(() => coalesce('channel', read)),
    'channel.deleted@v1': mine(() => setDeleted(true)),
    'channel.delivered@v1': (ev) => {
      mine(() => coalesce('channel', read))(ev);
      outbox(ev);
    },
    'channel.replied@v1': outbox,
    'channel.reply_failed@v1': outbox,
    'channel.card_shown@v1': outbox,
    'channel.status@v1': mine(() => coalesce('channel', read)),
  };
  const live = useStream(agentId ? { agent_id: agentId } : null, handlers);

  return (
    <section aria-labelledby="channel-h">
      <p class="crumbs">
        <a href="#/channels">Channels</a> /
      </p>
      <div class="page-head">
        <h1 id="channel-h">{c ? c.name : 'Channel'}</h1>
        {c && <StreamBadge state={live} />}
      </div>
      {deleted && <p class="notice">This channel was deleted.</p>}
      <ErrorText error={error} />
      {!c && !error && <Loading what="channel" />}
      {c && <ChannelCard c={c} owner={owner} agentName={agentName} version={version} compact={false} onChange={setC} />}
    </section>
  );
}

function compare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function ChannelCard({
  c,
  owner,
  agentName,
  version,
  compact,
  onChange,
}: {
  c: Channel;
  owner: boolean;
  agentName?: string;
  version: number;
  compact: boolean;
  onChange: (c: Channel) => void;
}) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  // Bumped by Refresh: the outbox is read again with the channel.
  const [refreshed, setRefreshed] = useState(0);

  async function toggle() {
    setBusy(true);
    setError(null);
    try {
      onChange(await patch<Channel>('/v1/channels/' + seg(c.id), { enabled: !c.enabled }));
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }
  async function refresh() {
    setBusy(true);
    setError(null);
    try {
      onChange(await get<Channel>('/v1/channels/' + seg(c.id)));
      setRefreshed((n) => n + 1);
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }

  const mode = c.kind === 'telegram' ? (c.settings?.mode === 'webhook' ? 'webhook mode' : 'polled') : '';
  return (
    <article class="card" data-testid="channel-row" data-id={c.id} data-kind={c.kind} data-status={c.status} data-enabled={String(c.enabled)} aria-label={`Channel ${c.name}`}>
      <div class="row-head">
        <strong class="name">{compact ? <a href={href('channels', c.id)}>{c.name}</a> : c.name}</strong>
        <span class="tag">{c.kind}</span>
        <Status s={c.status} />
        <span class="small">
          agent <a href={href('agents', c.agent_id)}>{agentName ?? shortId(c.agent_id)}</a>
        </span>
        {mode && <span class="small muted">{mode}</span>}
        <span class="grow" />
        <button type="button" class="small-btn" disabled={busy} onClick={refresh} aria-label={`Refresh channel ${c.name}`}>
          Refresh
        </button>
        {owner && (
          <button
            type="button"
            class="small-btn"
            data-testid={c.enabled ? 'channel-disable' : 'channel-enable'}
            disabled={busy}
            onClick={toggle}
            aria-label={`${c.enabled ? 'Disable' : 'Enable'} channel ${c.name}`}
          >
            {c.enabled ? 'Disable' : 'Enable'}
          </button>
        )}
      </div>
      {c.error && (
        <p class="small error-text" data-testid="channel-error">
          {c.error}
        </p>
      )}
      {c.url ? (
        <p class="small">
          Hook URL <span class="mono">{location.origin + c.url}</span> <span class="muted">({URL_NOTE[c.kind] ?? 'deliveries are posted here'})</span>
        </p>
      ) : (
        <p class="small muted">No hook URL: Keel polls the bot for its updates.</p>
      )}
      <p class="small muted">
        {c.enabled ? 'enabled' : 'disabled'} · created <Time t={c.created_at} /> · <span class="mono">{c.id}</span>
      </p>
      <ErrorText error={error} />
      {chats(c) ? (
        <Outbox channel={c} version={version + refreshed} compact={compact} />
      ) : (
        <p class="small muted">A webhook channel sends no replies: the runs it starts are read in their sessions.</p>
      )}
      <Fold summary="Settings">
        <p class="small muted">Secrets are named, never shown.</p>
        <Json value={c.settings} label={`Settings of ${c.name}`} />
      </Fold>
    </article>
  );
}

// Every dead and unknown reply (up to OUTBOX_MAX of each), and the newest OUTBOX_MAX of all.
async function readOutbox(id: string): Promise<{ items: ChannelReply[]; more: boolean }> {
  const read = async (query: Record<string, string>) => {
    const items: ChannelReply[] = [];
    let cursor: string | null = null;
    do {
      const page: Page<ChannelReply> = await get<Page<ChannelReply>>(`/v1/channels/${seg(id)}/replies` + qs({ ...query, limit: 500, cursor }));
      items.push(...page.items);
      cursor = page.next_cursor;
    } while (cursor && items.length < OUTBOX_MAX);
    return { items, more: cursor !== null };
  };
  const [dead, unknown, newest] = await Promise.all([read({ status: 'dead' }), read({ status: 'unknown' }), read({ order: 'desc' })]);
  const byId = new Map<string, ChannelReply>();
  for (const r of [...dead.items, ...unknown.items, ...newest.items]) byId.set(r.id, r);
  return { items: [...byId.values()], more: dead.more || unknown.more || newest.more };
}

// Dead and unknown replies first, each part newest first (ids are time-ordered).
function ordered(items: ChannelReply[]): ChannelReply[] {
  const newest = [...items].sort((a, b) => compare(b.id, a.id));
  return [...newest.filter((r) => FAILED.has(r.status)), ...newest.filter((r) => !FAILED.has(r.status))];
}

function countsOf(items: ChannelReply[]): [string, number][] {
  const n = new Map<string, number>();
  for (const r of items) n.set(r.status, (n.get(r.status) ?? 0) + 1);
  const rank = (s: string) => (STATUS_ORDER.includes(s) ? STATUS_ORDER.indexOf(s) : STATUS_ORDER.length);
  return [...n.entries()].sort((a, b) => rank(a[0]) - rank(b[0]) || compare(a[0], b[0]));
}

function Outbox({ channel, version, compact }: { channel: Channel; version: number; compact: boolean }) {
  const [data, setData] = useState<{ items: ChannelReply[]; more: boolean } | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [filter, setFilter] = useState('');
  const [rows, setRows] = useState(compact ? COMPACT_ROWS : PAGE_ROWS);
  // Only the latest read is shown: an older one may answer after it.
  const seq = useRef(0);
  const idp = 'outbox-' + channel.id;

  useEffect(() => {
    const n = ++seq.current;
    readOutbox(channel.id)
      .then((d) => {
        if (n !== seq.current) return;
        setData(d);
        setError(null);
      })
      .catch((e) => n === seq.current && setError(errorText(e)));
  }, [channel.id, version]);

  const counts = data ? countsOf(data.items) : [];
  const all = data ? ordered(data.items) : [];
  const list = filter === 'failed' ? all.filter((r) => FAILED.has(r.status)) : filter ? all.filter((r) => r.status === filter) : all;
  return (
    <div class="deliveries">
      <div class="row-head">
        <h3 id={idp + '-h'} class="h-small">
          Outbox
        </h3>
        {counts
          .filter(([s]) => FAILED.has(s))
          .map(([s, n]) => (
            <span key={s} class="status status-dead" data-testid="channel-failed-count">
              {n} {s}
            </span>
          ))}
        {data && (
          <span class="small muted">
            {data.items.length}
            {data.more ? '+' : ''} {data.items.length === 1 ? 'reply' : 'replies'}
            {counts.some(([s]) => !FAILED.has(s)) && ': ' + counts.filter(([s]) => !FAILED.has(s)).map(([s, n]) => `${n} ${s}`).join(' · ')}
          </span>
        )}
        <span class="grow" />
        {!compact && data && data.items.length > 0 && (
          <>
            <label for={idp + '-status'} class="inline-label">
              Status
            </label>
            <select id={idp + '-status'} class="narrow" value={filter} onChange={(e) => setFilter(e.currentTarget.value)}>
              <option value="">any</option>
              <option value="failed">dead or unknown</option>
              {counts.map(([s]) => (
                <option key={s} value={s}>
                  {s}
                </option>
              ))}
            </select>
          </>
        )}
      </div>
      <ErrorText error={error} />
      {!data && !error && <Loading what="outbox" />}
      {data && data.items.length === 0 && <p class="muted small">Nothing sent yet: a reply is recorded for each message the channel takes.</p>}
      {data && data.items.length > 0 && list.length === 0 && <p class="muted small">No replies with this status.</p>}
      {list.length > 0 && (
        <ul class="list" aria-labelledby={idp + '-h'}>
          {list.slice(0, rows).map((r) => (
            <ReplyRow key={r.id} r={r} />
          ))}
        </ul>
      )}
      {list.length > rows &&
        (compact ? (
          <p class="small">
            <a href={href('channels', channel.id)}>
              All {list.length} replies of {channel.name}
            </a>
          </p>
        ) : (
          <button type="button" class="small-btn" onClick={() => setRows((n) => n + PAGE_ROWS)}>
            Show {Math.min(PAGE_ROWS, list.length - rows)} more
          </button>
        ))}
      {data?.more && (
        <p class="small muted">
          The outbox holds more than {OUTBOX_MAX} replies: the newest {OUTBOX_MAX}, and every dead or unknown one, are shown.
        </p>
      )}
    </div>
  );
}

function ReplyRow({ r }: { r: ChannelReply }) {
  const failed = FAILED.has(r.status);
  const card = r.kind === 'approval_card';
  const long = r.text.length > SHORT_TEXT;
  return (
    <li class={'delivery' + (failed ? ' delivery-dead' : '')} data-testid="channel-reply" data-status={r.status} data-kind={r.kind} data-id={r.id}>
      <div class="row-head small">
        <span class="tag">{card ? 'approval card' : 'answer'}</span>
        <Status s={r.status} />
        <span>
          {r.attempts} {r.attempts === 1 ? 'attempt' : 'attempts'}
        </span>
        {r.parts_sent > 1 && <span>{r.parts_sent} parts sent</span>}
        <span class="muted">
          <Time t={r.created_at} />
        </span>
        <span>
          run <IdLink kind="runs" id={r.run_id} />
        </span>
        {card && r.approval_id && (
          <span>
            approval{' '}
            <a href="#/approvals" class="mono" title={r.approval_id}>
              {shortId(r.approval_id)}
            </a>
          </span>
        )}
        <span class="muted">
          {card ? (r.user_id ? 'to approver ' : 'to the conversation') : r.user_id ? 'answers user ' : 'answers a sender who is no user'}
          {r.user_id && (
            <span class="mono" title={r.user_id}>
              {shortId(r.user_id)}
            </span>
          )}
        </span>
      </div>
      {r.error && (
        <p class="small error-text" data-testid="channel-reply-error">
          {r.status === 'dead' ? 'Dead: ' : r.status === 'unknown' ? 'Unknown (never sent again): ' : ''}
          {r.error}
        </p>
      )}
      {r.text && <p class="small msg-text">{long ? r.text.slice(0, SHORT_TEXT) + '…' : r.text}</p>}
      {long && (
        <Fold summary="Whole text">
          <p class="small msg-text">{r.text}</p>
        </Fold>
      )}
      <p class="small muted">
        updated <Time t={r.updated_at} /> · session <IdLink kind="sessions" id={r.session_id} /> · delivery <span class="mono">{r.delivery_id}</span>
      </p>
    </li>
  );
}

// The agent page's short list of the agent's channels (owners and users), each linking to its page.
export function AgentChannels({ agentId, version }: { agentId: string; version: number }) {
  const [channels, setChannels] = useState<Channel[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    getAll<Channel>(`/v1/agents/${seg(agentId)}/channels`)
      .then((l) => {
        setChannels(l);
        setError(null);
      })
      .catch((e) => setError(errorText(e)));
  }, [agentId, version]);
  return (
    <section class="card" aria-labelledby="agent-channels-h">
      <h2 id="agent-channels-h">Channels</h2>
      <ErrorText error={error} />
      {!channels && !error && <Loading what="channels" />}
      {channels && channels.length === 0 && <p class="muted small">No channel: the agent is reached through the API only.</p>}
      {channels && channels.length > 0 && (
        <ul class="list">
          {channels.map((c) => (
            <li key={c.id} class="item" data-testid="agent-channel-row" data-id={c.id} data-status={c.status}>
              <div class="row-head">
                <a href={href('channels', c.id)}>{c.name}</a>
                <span class="tag">{c.kind}</span>
                <Status s={c.status} />
              </div>
              {c.error && <p class="small error-text">{c.error}</p>}
            </li>
          ))}
        </ul>
      )}
      <p class="small">
        <a href="#/channels">All channels and their outboxes</a>
      </p>
    </section>
  );
}
