// A session: its transcript (every page), live token deltas, pending approvals, a composer and
// its runs. Live from the session's stream.
import { useEffect, useLayoutEffect, useMemo, useRef, useState } from 'preact/hooks';
import {
  ApiError,
  errorText,
  get,
  getAll,
  patch,
  post,
  qs,
  seg,
  type Agent,
  type Approval,
  type Message,
  type Page,
  type Run,
  type Session,
  type Step,
  upsertRun,
} from '../api';
import { ApprovalCard } from '../approval';
import { ErrorText, IdLink, Loading, Status, StreamBadge, Time, memo, shortId } from '../components';
import { href } from '../router';
import { ToolCall } from '../steps';
import { RUN_EVENT_TYPES, useCoalesce, useStream, type Delta, type Handlers } from '../stream';
import { isMember, useWho } from '../who';
import { RunRow } from './Runs';

// How many of the newest runs get their tool calls shown inline without being asked.
const STEPS_FOR_RECENT_RUNS = 10;

export function SessionPage({ id }: { id: string }) {
  const [session, setSession] = useState<Session | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [messages, setMessages] = useState<Message[] | null>(null);
  const [loaded, setLoaded] = useState(0);
  const [msgError, setMsgError] = useState<string | null>(null);
  const [runs, setRuns] = useState<Run[]>([]);
  const [steps, setSteps] = useState<Record<string, Step[]>>({});
  const [deltas, setDeltas] = useState<Record<string, string>>({});
  const [approvals, setApprovals] = useState<Approval[] | null>(null);
  const [agentName, setAgentName] = useState<string | null>(null);
  const coalesce = useCoalesce();
  const member = isMember(useWho());

  // The transcript is read page by page; `tail` is where its last page started, so that new
  // messages are read again from there (a page's cursor is opaque: there is no "after id").
  const msgs = useRef<Message[]>([]);
  const tail = useRef<{ cursor: string | null; start: number }>({ cursor: null, start: 0 });
  const reading = useRef(false);
  const again = useRef(false);
  // Follow the end of the transcript while the reader is there (or has just sent a message).
  const follow = useRef(true);

  async function readMessages() {
    if (reading.current) {
      again.current = true;
      return;
    }
    reading.current = true;
    try {
      do {
        again.current = false;
        const out = msgs.current.slice(0, tail.current.start);
        let cursor = tail.current.cursor;
        let last = { ...tail.current };
        for (;;) {
          const p = await get<Page<Message>>(`/v1/sessions/${seg(id)}/messages` + qs({ limit: 500, cursor }));
          last = { cursor, start: out.length };
          for (const m of p.items) out.push(m);
          setLoaded(out.length);
          if (!p.next_cursor) break;
          cursor = p.next_cursor;
        }
        tail.current = last;
        msgs.current = out;
        setMessages(out);
        // A stored answer replaces the live text of its run.
        const answered = new Set(out.slice(tail.current.start).filter((m) => m.role === 'assistant').map((m) => m.run_id));
        setDeltas((d) => dropKeys(d, (k) => answered.has(k)));
      } while (again.current);
    } catch (e) {
      setMsgError(errorText(e));
    } finally {
      reading.current = false;
    }
  }

  function refetchSession() {
    coalesce('session', () =>
      get<Session>('/v1/sessions/' + seg(id))
        .then(setSession)
        .catch((e) => setError(errorText(e))),
    );
  }

  function loadSteps(runId: string) {
    coalesce('steps' + runId, () =>
      get<Page<Step>>(`/v1/runs/${seg(runId)}/steps`)
        .then((p) => setSteps((s) => ({ ...s, [runId]: p.items })))
        .catch(() => {}),
    );
  }

  function refetchRun(runId: string) {
    coalesce('run' + runId, () =>
      get<Run>('/v1/runs/' + seg(runId))
        .then((r) => setRuns((list) => upsertRun(list, r)))
        .catch(() => {}),
    );
  }

  useEffect(() => {
    get<Session>('/v1/sessions/' + seg(id))
      .then((s) => {
        setSession(s);
        get<Agent>('/v1/agents/' + seg(s.agent_id))
          .then((a) => setAgentName(a.name))
          .catch(() => {});
      })
      .catch((e) => setError(errorText(e)));
    readMessages();
    get<Page<Run>>(`/v1/sessions/${seg(id)}/runs` + qs({ order: 'desc', limit: 50 }))
      .then((p) => {
        setRuns((list) => {
          let out = p.items;
          for (const r of list) out = upsertRun(out, r);
          return out;
        });
        for (const r of p.items.slice(0, STEPS_FOR_RECENT_RUNS)) loadSteps(r.id);
      })
      .catch(() => {});
    // Guests may not read approvals (the API answers 403): the section is left out.
    if (member)
      getAll<Approval>('/v1/approvals', { status: 'pending' })
        .then((list) => setApprovals(list.filter((a) => a.session_id === id)))
        .catch((e) => {
          if (!(e instanceof ApiError && e.status === 403)) setApprovals([]);
        });
  }, [id]);

  const handlers: Handlers = {
    'message.delta': (d: Delta) => {
      setDeltas((all) => ({ ...all, [d.run_id]: (all[d.run_id] ?? '') + d.text }));
    },
    'message.created@v1': () => readMessages(),
    'session.closed@v1': refetchSession,
    'session.reopened@v1': refetchSession,
    'session.described@v1': refetchSession,
    'tool.call.started@v1': (ev) => ev.run_id && loadSteps(ev.run_id),
    'tool.call.completed@v1': (ev) => ev.run_id && loadSteps(ev.run_id),
    'tool.call.denied@v1': (ev) => ev.run_id && loadSteps(ev.run_id),
    'tool.call.unknown@v1': (ev) => ev.run_id && loadSteps(ev.run_id),
    'approval.requested@v1': (ev) => {
      if (ev.run_id) loadSteps(ev.run_id);
      const aid = ev.payload?.approval_id;
      if (!aid || !member) return;
      get<Approval>('/v1/approvals/' + seg(aid))
        .then((a) => setApprovals((list) => (list && a.status === 'pending' && !list.some((x) => x.id === a.id) ? [...list, a] : list)))
        .catch(() => {});
    },
    'approval.decided@v1': (ev) => {
      if (ev.run_id) loadSteps(ev.run_id);
      const aid = ev.payload?.approval_id;
      setApprovals((list) => list && list.filter((a) => a.id !== aid));
    },
  };
  for (const t of RUN_EVENT_TYPES) {
    handlers[t] = (ev) => {
      if (!ev.run_id) return;
      refetchRun(ev.run_id);
      refetchSession();
      if (t === 'run.step@v1') loadSteps(ev.run_id);
      if (t === 'run.started@v1') setDeltas((d) => dropKeys(d, (k) => k === ev.run_id));
      if (t === 'run.failed@v1' || t === 'run.cancelled@v1') setDeltas((d) => dropKeys(d, (k) => k === ev.run_id));
    };
  }
  const live = useStream({ session_id: id }, handlers);

  // Scroll events of our own scrolling (and of chunks settling to their real height the frame
  // after) do not change `follow`; the reader's do.
  const pinning = useRef(0);
  useEffect(() => {
    const on = () => {
      if (pinning.current === 0) follow.current = nearBottom();
    };
    window.addEventListener('scroll', on, { passive: true });
    return () => window.removeEventListener('scroll', on);
  }, []);
  useLayoutEffect(() => {
    if (!messages || !follow.current) return;
    const bottom = () => window.scrollTo(0, document.documentElement.scrollHeight);
    pinning.current++;
    bottom();
    requestAnimationFrame(() => {
      bottom();
      requestAnimationFrame(() => pinning.current--);
    });
  }, [messages, deltas, approvals]);

  // The long list is built once per change of messages or steps, not per token delta.
  const transcript = useMemo(() => (messages ? <Transcript messages={messages} steps={steps} /> : null), [messages, steps]);

  if (error && !session) {
    return (
      <section>
        <h1>Session</h1>
        <ErrorText error={error} />
      </section>
    );
  }
  function onSent(m: Message, r: Run) {
    follow.current = true;
    setRuns((list) => upsertRun(list, r));
    // Shown at once; the stream's message.created@v1 reads it again from the server.
    if (messages && !msgs.current.some((x) => x.id === m.id)) {
      msgs.current = [...msgs.current, m];
      setMessages(msgs.current);
    }
  }
  const liveRuns = Object.entries(deltas).filter(([, text]) => text);
  return (
    <section aria-labelledby="session-h">
      <p class="crumbs">
        <a href="#/agents">Agents</a> /{' '}
        {session && <a href={href('agents', session.agent_id)}>{agentName ?? 'agent ' + shortId(session.agent_id)}</a>} /
      </p>
      <div class="page-head">
        <h1 id="session-h">{session ? session.title || 'Untitled session' : 'Session'}</h1>
        {session && <Status s={session.status} />}
        <StreamBadge state={live} />
      </div>
      {session?.description && <p class="small">{session.description}</p>}
      <div class="session-layout">
        <div class="transcript-col">
          <h2 class="sr-only">Transcript</h2>
          <ErrorText error={msgError} />
          {!messages && !msgError && <Loading what={`messages (${loaded})`} />}
          {messages && messages.length === 0 && <p class="muted">No messages yet.</p>}
          {transcript}
          {liveRuns.map(([runId, text]) => (
            <article key={runId} class="msg msg-assistant msg-live" data-testid="delta-live" data-run={runId}>
              <div class="msg-meta">
                <span class="who">assistant</span> <span class="muted">streaming…</span>
              </div>
              <div class="msg-text">{text}</div>
            </article>
          ))}
          {approvals && approvals.length > 0 && (
            <div class="inline-approvals">
              <h2>Waiting for approval</h2>
              {approvals.map((a) => (
                <ApprovalCard key={a.id} approval={a} showSession={false} onDecided={(d) => setApprovals((l) => l && l.filter((x) => x.id !== d.id))} />
              ))}
            </div>
          )}
          {session && <Composer session={session} onSent={onSent} onSession={setSession} />}
        </div>
        <aside class="side" aria-labelledby="runs-h">
          <h2 id="runs-h">Runs</h2>
          {runs.length === 0 && <p class="muted small">No runs yet.</p>}
          <ul class="list">
            {runs.map((r) => (
              <RunRow key={r.id} run={r} compact onChange={(x) => setRuns((l) => upsertRun(l, x))} />
            ))}
          </ul>
        </aside>
      </div>
    </section>
  );
}

function nearBottom(): boolean {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 120;
}

function dropKeys<T>(o: Record<string, T>, drop: (k: string) => boolean): Record<string, T> {
  const keys = Object.keys(o).filter(drop);
  if (keys.length === 0) return o;
  const out = { ...o };
  for (const k of keys) delete out[k];
  return out;
}

// Messages are rendered in chunks of CHUNK, each with `content-visibility: auto`: the browser
// skips layout and paint of chunks off screen. (Per message, the browser's visibility tracking of
// 10,000 elements cost more per scrolled frame than it saved.)
const CHUNK = 50;

function Transcript({ messages, steps }: { messages: Message[]; steps: Record<string, Step[]> }) {
  // A chunk keeps its array while its messages are the same objects, so its memo holds.
  const cache = useRef<Message[][]>([]);
  const chunks: Message[][] = [];
  for (let i = 0, c = 0; i < messages.length; i += CHUNK, c++) {
    const end = Math.min(i + CHUNK, messages.length);
    const prev = cache.current[c];
    let same = !!prev && prev.length === end - i;
    for (let j = i; same && j < end; j++) if (prev[j - i] !== messages[j]) same = false;
    chunks.push(same ? prev : messages.slice(i, end));
  }
  cache.current = chunks;
  return (
    <div class="transcript" aria-label="Transcript" role="region">
      {chunks.map((items, c) => (
        <Chunk key={c} items={items} steps={steps} />
      ))}
    </div>
  );
}

const Chunk = memo(function Chunk({ items, steps }: { items: Message[]; steps: Record<string, Step[]> }) {
  return (
    <ol class="chunk">
      {items.map((m) => (
        <MessageItem key={m.id} m={m} steps={m.role !== 'assistant' && m.run_id ? steps[m.run_id] : undefined} />
      ))}
    </ol>
  );
});

const MessageItem = memo(function MessageItem({ m, steps }: { m: Message; steps?: Step[] }) {
  const tools = steps ? steps.filter((s) => s.kind === 'tool') : [];
  const folded = m.role === 'call' || m.role === 'introspection';
  return (
    <li class={'msg msg-' + m.role} data-testid="message" data-role={m.role}>
      <div class="msg-meta">
        <span class="who">{m.role}</span>{' '}
        <time dateTime={m.created_at} title={m.created_at}>
          {m.created_at.slice(11, 19)}
        </time>
        {m.run_id && m.role === 'assistant' && (
          <>
            {' '}
            <a href={href('runs', m.run_id)} class="small">
              run
            </a>
          </>
        )}
      </div>
      {folded ? (
        <details class="fold">
          <summary>{m.role === 'call' ? 'Direct tool call' : 'Introspection'}</summary>
          <pre class="json">{m.content}</pre>
        </details>
      ) : (
        <div class="msg-text">{m.content}</div>
      )}
      {tools.length > 0 && (
        <div class="tools">
          {tools.map((s) => (
            <ToolCall key={s.id} s={s} />
          ))}
        </div>
      )}
    </li>
  );
});

function Composer({
  session,
  onSent,
  onSession,
}: {
  session: Session;
  onSent: (m: Message, r: Run) => void;
  onSession: (s: Session) => void;
}) {
  const [text, setText] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const inactive = session.status === 'inactive';

  async function send() {
    if (!text.trim() || busy) return;
    setBusy(true);
    setError(null);
    try {
      const key = crypto.randomUUID ? crypto.randomUUID() : String(Date.now()) + Math.random();
      const out = await post<{ message: Message; run: Run }>(
        `/v1/sessions/${seg(session.id)}/messages`,
        { content: text },
        { headers: { 'Idempotency-Key': key } },
      );
      setText('');
      onSent(out.message, out.run);
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }

  async function setStatus(status: 'inactive' | 'idle') {
    setError(null);
    try {
      onSession(await patch<Session>('/v1/sessions/' + seg(session.id), { status }));
    } catch (e) {
      setError(errorText(e));
    }
  }

  return (
    <form
      class="composer"
      onSubmit={(e) => {
        e.preventDefault();
        send();
      }}
    >
      <label for="composer-input">Message</label>
      <textarea
        id="composer-input"
        data-testid="composer-input"
        rows={3}
        value={text}
        placeholder={inactive ? 'This session is closed.' : 'Write a message. Enter sends, Shift+Enter adds a line.'}
        onInput={(e) => setText(e.currentTarget.value)}
        onKeyDown={(e) => {
          if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
            e.preventDefault();
            send();
          }
        }}
      />
      <div class="actions">
        <button type="submit" class="primary" data-testid="composer-send" disabled={busy || !text.trim()}>
          Send
        </button>
        <span class="grow" />
        {inactive ? (
          <button type="button" class="small-btn" onClick={() => setStatus('idle')}>
            Reopen session
          </button>
        ) : (
          <button type="button" class="small-btn" onClick={() => setStatus('inactive')}>
            Close session
          </button>
        )}
      </div>
      <ErrorText error={error} />
      <p class="small muted">
        session <span class="mono">{session.id}</span> · agent <IdLink kind="agents" id={session.agent_id} /> · opened{' '}
        <Time t={session.created_at} />
      </p>
    </form>
  );
}
