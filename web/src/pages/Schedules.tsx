// Schedules: the tenant's schedules with pause, resume, delete and their recent fires, and a
// create form that previews a cron expression's next slots. Live from schedule.* events (a
// fired schedule's run shows on the runs page, which follows run events).
import { useEffect, useRef, useState } from 'preact/hooks';
import {
  ApiError,
  del,
  errorText,
  get,
  getAll,
  post,
  qs,
  seg,
  type Agent,
  type CronPreview,
  type Page,
  type Schedule,
  type Session,
} from '../api';
import { ErrorText, IdLink, Loading, Status, StreamBadge, Time, formatIn, localZone } from '../components';
import { cronPreview } from '../checks';
import { href } from '../router';
import { useCoalesce, useStream, type Handlers } from '../stream';

// Common IANA zones for the time zone field's suggestions (any zone the server knows is taken).
const ZONES = [
  'UTC',
  'Europe/London', 'Europe/Dublin', 'Europe/Lisbon', 'Europe/Paris', 'Europe/Berlin', 'Europe/Madrid',
  'Europe/Rome', 'Europe/Amsterdam', 'Europe/Zurich', 'Europe/Stockholm', 'Europe/Warsaw', 'Europe/Athens',
  'Europe/Helsinki', 'Europe/Kyiv', 'Europe/Istanbul', 'Europe/Moscow',
  'Africa/Cairo', 'Africa/Lagos', 'Africa/Nairobi', 'Africa/Johannesburg',
  'Asia/Dubai', 'Asia/Karachi', 'Asia/Kolkata', 'Asia/Dhaka', 'Asia/Bangkok', 'Asia/Jakarta',
  'Asia/Singapore', 'Asia/Shanghai', 'Asia/Hong_Kong', 'Asia/Taipei', 'Asia/Seoul', 'Asia/Tokyo',
  'Australia/Perth', 'Australia/Adelaide', 'Australia/Brisbane', 'Australia/Sydney', 'Pacific/Auckland',
  'Pacific/Honolulu', 'America/Anchorage', 'America/Los_Angeles', 'America/Denver', 'America/Phoenix',
  'America/Chicago', 'America/Mexico_City', 'America/New_York', 'America/Toronto', 'America/Halifax',
  'America/Bogota', 'America/Lima', 'America/Santiago', 'America/Sao_Paulo', 'America/Argentina/Buenos_Aires',
];

const SCHEDULE_EVENTS = [
  'schedule.created@v1',
  'schedule.paused@v1',
  'schedule.resumed@v1',
  'schedule.fired@v1',
  'schedule.refused@v1',
  'schedule.skipped@v1',
  'schedule.suspended@v1',
  'schedule.reassigned@v1',
];

export function Schedules() {
  const [schedules, setSchedules] = useState<Schedule[] | null>(null);
  const [agents, setAgents] = useState<Agent[]>([]);
  const [error, setError] = useState<string | null>(null);
  const coalesce = useCoalesce();

  useEffect(() => {
    getAll<Schedule>('/v1/schedules')
      .then(setSchedules)
      .catch((e) => setError(errorText(e)));
    getAll<Agent>('/v1/agents')
      .then(setAgents)
      .catch(() => {});
  }, []);

  function upsert(s: Schedule) {
    setSchedules((list) => {
      if (!list) return list;
      const i = list.findIndex((x) => x.id === s.id);
      if (i < 0) return [...list, s];
      const next = list.slice();
      // A list answer has no recent fires: keep the ones read before.
      next[i] = { ...s, recent_fires: s.recent_fires ?? list[i].recent_fires };
      return next;
    });
  }
  function remove(id: string) {
    setSchedules((list) => list && list.filter((x) => x.id !== id));
  }
  // The schedule with its recent fires, as it is now.
  function refetch(id: string | undefined | null) {
    if (!id) return;
    coalesce(id, () =>
      get<Schedule>('/v1/schedules/' + seg(id))
        .then(upsert)
        .catch((e) => {
          if (e instanceof ApiError && e.status === 404) remove(id);
        }),
    );
  }

  const handlers: Handlers = {
    'schedule.deleted@v1': (ev) => remove(ev.payload?.schedule_id),
    // A deleted agent's schedules end (status done) without an event of their own.
    'agent.deleted@v1': (ev) => {
      setAgents((list) => list.filter((a) => a.id !== ev.agent_id));
      for (const s of schedules ?? []) if (s.agent_id === ev.agent_id) refetch(s.id);
    },
    'agent.created@v1': (ev) => {
      if (!ev.agent_id) return;
      get<Agent>('/v1/agents/' + seg(ev.agent_id))
        .then((a) => setAgents((list) => (list.some((x) => x.id === a.id) ? list : [...list, a])))
        .catch(() => {});
    },
  };
  for (const t of SCHEDULE_EVENTS) handlers[t] = (ev) => refetch(ev.payload?.schedule_id);
  const live = useStream({}, handlers);

  const names = new Map(agents.map((a) => [a.id, a.name]));
  return (
    <section aria-labelledby="schedules-h">
      <div class="page-head">
        <h1 id="schedules-h">Schedules</h1>
        <StreamBadge state={live} />
      </div>
      <div class="cols">
        <div>
          <ErrorText error={error} />
          {!schedules && !error && <Loading what="schedules" />}
          {schedules && schedules.length === 0 && <p class="muted">No schedules yet.</p>}
          {schedules && schedules.length > 0 && (
            <ul class="list">
              {schedules.map((s) => (
                <ScheduleRow key={s.id} s={s} agentName={names.get(s.agent_id)} onChange={upsert} onDeleted={() => remove(s.id)} onOpen={() => refetch(s.id)} />
              ))}
            </ul>
          )}
        </div>
        <CreateSchedule agents={agents} onCreated={upsert} />
      </div>
    </section>
  );
}

function When({ t, zone }: { t: string | null; zone: string }) {
  if (!t) return <span class="muted">—</span>;
  const there = zone !== 'UTC' ? formatIn(t, zone) : null;
  return (
    <>
      <Time t={t} /> UTC{there && <span class="muted"> · {there} {zone}</span>}
    </>
  );
}

function ScheduleRow({
  s,
  agentName,
  onChange,
  onDeleted,
  onOpen,
}: {
  s: Schedule;
  agentName?: string;
  onChange: (s: Schedule) => void;
  onDeleted: () => void;
  onOpen: () => void;
}) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  async function act(what: 'pause' | 'resume' | 'delete') {
    setBusy(true);
    setError(null);
    try {
      if (what === 'delete') {
        await del('/v1/schedules/' + seg(s.id));
        onDeleted();
        return;
      }
      onChange(await post<Schedule>(`/v1/schedules/${seg(s.id)}/${what}`));
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }

  return (
    <li class="card" data-testid="schedule-row" data-status={s.status} data-id={s.id}>
      <div class="row-head">
        <strong class="name">{s.name}</strong>
        <Status s={s.status} />
        <span class="small">
          agent{' '}
          <a href={href('agents', s.agent_id)} title={s.agent_id}>
            {agentName ?? s.agent_id.slice(-8)}
          </a>
        </span>
        <span class="grow" />
        {s.status === 'active' && (
          <button type="button" class="small-btn" data-testid="schedule-pause" disabled={busy} onClick={() => act('pause')}>
            Pause
          </button>
        )}
        {s.status === 'paused' && (
          <button type="button" class="small-btn" data-testid="schedule-resume" disabled={busy} onClick={() => act('resume')}>
            Resume
          </button>
        )}
        <button type="button" class="danger small-btn" data-testid="schedule-delete" disabled={busy} onClick={() => act('delete')} aria-label={'Delete schedule ' + s.name}>
          Delete
        </button>
      </div>
      <dl class="facts small">
        <dt>{s.kind === 'once' ? 'once at' : 'cron'}</dt>
        <dd>
          {s.kind === 'once' ? (
            <When t={s.at} zone={localZone()} />
          ) : (
            <>
              <code>{s.cron}</code> in {s.timezone}
            </>
          )}
        </dd>
        <dt>next</dt>
        <dd>
          <When t={s.next_fire_at} zone={s.kind === 'once' ? localZone() : s.timezone} />
        </dd>
        <dt>last fired</dt>
        <dd>
          <When t={s.last_fired_at} zone={s.kind === 'once' ? localZone() : s.timezone} />
        </dd>
        <dt>session</dt>
        <dd>{s.session_id ? <IdLink kind="sessions" id={s.session_id} /> : 'a new one each time'}</dd>
        <dt>missed</dt>
        <dd>{s.missed.replace(/_/g, ' ')}</dd>
      </dl>
      {s.suspended_reason && <p class="notice small">{s.suspended_reason}</p>}
      <details class="fold" onToggle={(e) => (e.currentTarget as HTMLDetailsElement).open && !s.recent_fires && onOpen()}>
        <summary>Prompt and recent fires</summary>
        <p class="label">Prompt</p>
        <div class="msg-text small">{s.prompt}</div>
        <p class="label">Recent fires (newest first)</p>
        {!s.recent_fires && <Loading what="fires" />}
        {s.recent_fires && s.recent_fires.length === 0 && <p class="muted small">None yet.</p>}
        {s.recent_fires && s.recent_fires.length > 0 && (
          <ul class="fires">
            {s.recent_fires.map((f) => (
              <li key={f.slot} data-testid="schedule-fire" data-outcome={f.outcome}>
                <Time t={f.slot} /> <Status s={f.outcome} />
                {f.run_id && (
                  <>
                    {' '}
                    run <IdLink kind="runs" id={f.run_id} />
                  </>
                )}
                {f.session_id && (
                  <>
                    {' '}
                    session <IdLink kind="sessions" id={f.session_id} />
                  </>
                )}
                {f.error && <span class="error-text small"> {f.error}</span>}
              </li>
            ))}
          </ul>
        )}
      </details>
      <ErrorText error={error} />
    </li>
  );
}

// "2026-12-01T10:00" (datetime-local, the browser's time) -> RFC 3339 UTC, or null.
function localToUtc(value: string): string | null {
  if (!value) return null;
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? null : d.toISOString();
}

function CreateSchedule({ agents, onCreated }: { agents: Agent[]; onCreated: (s: Schedule) => void }) {
  const here = localZone();
  const [agentId, setAgentId] = useState('');
  const [name, setName] = useState('');
  const [prompt, setPrompt] = useState('');
  const [kind, setKind] = useState<'cron' | 'once'>('cron');
  const [cron, setCron] = useState('');
  const [timezone, setTimezone] = useState(here);
  const [at, setAt] = useState('');
  const [sessionId, setSessionId] = useState('');
  const [missed, setMissed] = useState('skip');
  const [sessions, setSessions] = useState<Session[]>([]);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  // The preview's last verdict on an expression and zone.
  const checked = useRef<Checked | null>(null);
  const agent = agentId || agents[0]?.id || '';

  useEffect(() => {
    setSessions([]);
    setSessionId('');
    if (!agent) return;
    get<Page<Session>>(`/v1/agents/${seg(agent)}/sessions` + qs({ order: 'desc', limit: 50 }))
      .then((p) => setSessions(p.items.filter((s) => s.status !== 'inactive')))
      .catch(() => {});
  }, [agent]);

  async function submit(e: Event) {
    e.preventDefault();
    setError(null);
    if (!agent) return setError('Choose an agent (create one on the agents page first).');
    if (!prompt.trim()) return setError('Write the prompt the schedule posts.');
    const body: Record<string, unknown> = { agent_id: agent, prompt, missed };
    if (name.trim()) body.name = name.trim();
    if (sessionId) body.session_id = sessionId;
    if (kind === 'cron') {
      if (!cron.trim()) return setError('Write a cron expression, e.g. 0 9 * * MON-FRI.');
      body.cron = cron.trim();
      body.timezone = timezone.trim() || 'UTC';
      // The server's parser says whether it takes them (an answer, not a refused request); the
      // preview asked it already unless the form is sent within 300 ms of the last keystroke.
      setBusy(true);
      let problem: string | null;
      try {
        const known = checked.current;
        if (known && known.cron === body.cron && known.timezone === body.timezone) {
          // The preview shows the message already.
          problem = known.error && 'Not sent: the expression or time zone cannot be used (see the preview above).';
        } else problem = (await cronPreview(body.cron as string, body.timezone as string, 1)).error;
      } catch (err) {
        problem = errorText(err);
      }
      setBusy(false);
      if (problem) return setError(problem);
    } else {
      const utc = localToUtc(at);
      if (!utc) return setError('Choose the date and time to fire at.');
      body.at = utc;
    }
    setBusy(true);
    try {
      onCreated(await post<Schedule>('/v1/schedules', body));
      setName('');
      setPrompt('');
      setCron('');
      setAt('');
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  const zones = ZONES.includes(here) ? ZONES : [here, ...ZONES];
  return (
    <form class="card form" onSubmit={submit} aria-labelledby="sched-create-h">
      <h2 id="sched-create-h">New schedule</h2>
      <label for="sched-agent">Agent</label>
      <select id="sched-agent" data-testid="schedule-create-agent" value={agent} onChange={(e) => setAgentId(e.currentTarget.value)}>
        {agents.length === 0 && <option value="">no agents</option>}
        {agents.map((a) => (
          <option key={a.id} value={a.id}>
            {a.name}
          </option>
        ))}
      </select>
      <label for="sched-name">Name (optional)</label>
      <input id="sched-name" data-testid="schedule-create-name" maxLength={200} value={name} onInput={(e) => setName(e.currentTarget.value)} />
      <label for="sched-prompt">Prompt</label>
      <textarea id="sched-prompt" data-testid="schedule-create-prompt" rows={3} value={prompt} onInput={(e) => setPrompt(e.currentTarget.value)} />
      <label for="sched-kind">When</label>
      <select id="sched-kind" data-testid="schedule-create-kind" value={kind} onChange={(e) => setKind(e.currentTarget.value === 'once' ? 'once' : 'cron')}>
        <option value="cron">repeatedly (cron)</option>
        <option value="once">once</option>
      </select>
      {kind === 'cron' ? (
        <>
          <label for="sched-cron">Cron expression</label>
          <input
            id="sched-cron"
            data-testid="schedule-create-cron"
            class="mono"
            placeholder="0 9 * * MON-FRI"
            spellcheck={false}
            autocomplete="off"
            value={cron}
            aria-describedby="sched-cron-help sched-preview"
            onInput={(e) => setCron(e.currentTarget.value)}
          />
          <p id="sched-cron-help" class="muted small">
            minute hour day-of-month month day-of-week, or @hourly, @daily, @weekly, @monthly, @yearly
          </p>
          <label for="sched-tz">Time zone</label>
          <input
            id="sched-tz"
            data-testid="schedule-create-timezone"
            list="sched-tz-list"
            spellcheck={false}
            autocomplete="off"
            value={timezone}
            onInput={(e) => setTimezone(e.currentTarget.value)}
          />
          <datalist id="sched-tz-list">
            {zones.map((z) => (
              <option key={z} value={z} />
            ))}
          </datalist>
          <Preview cron={cron.trim()} timezone={timezone.trim() || 'UTC'} onChecked={(c) => (checked.current = c)} />
        </>
      ) : (
        <>
          <label for="sched-at">Date and time (your time, {here})</label>
          <input id="sched-at" data-testid="schedule-create-at" type="datetime-local" value={at} onInput={(e) => setAt(e.currentTarget.value)} />
        </>
      )}
      <label for="sched-session">Session</label>
      <select id="sched-session" data-testid="schedule-create-session" value={sessionId} onChange={(e) => setSessionId(e.currentTarget.value)}>
        <option value="">a new session each time</option>
        {sessions.map((s) => (
          <option key={s.id} value={s.id}>
            {(s.title || 'Untitled session') + ' · ' + s.id.slice(-8)}
          </option>
        ))}
      </select>
      <label for="sched-missed">Slots missed while no server was firing</label>
      <select id="sched-missed" data-testid="schedule-create-missed" value={missed} onChange={(e) => setMissed(e.currentTarget.value)}>
        <option value="skip">skip them</option>
        <option value="catch_up_one">catch up one</option>
      </select>
      <button type="submit" class="primary" data-testid="schedule-create-submit" disabled={busy}>
        Create schedule
      </button>
      <ErrorText error={error} />
    </form>
  );
}

type PreviewState = { state: 'idle' } | { state: 'loading' } | { state: 'ok'; preview: CronPreview } | { state: 'error'; error: string };

interface Checked {
  cron: string;
  timezone: string;
  error: string | null;
}

// The next five slots of the expression, asked 300 ms after the last keystroke, in the chosen
// zone and in the browser's. The server answers 200 for any expression and zone, with its
// parser's message in `error` for one it cannot take: the page has no cron grammar of its own.
function Preview({ cron, timezone, onChecked }: { cron: string; timezone: string; onChecked: (c: Checked) => void }) {
  const [p, setP] = useState<PreviewState>({ state: 'idle' });
  const seq = useRef(0);
  const report = useRef(onChecked);
  report.current = onChecked;
  useEffect(() => {
    const n = ++seq.current;
    if (!cron) {
      setP({ state: 'idle' });
      return;
    }
    setP({ state: 'loading' });
    const timer = window.setTimeout(() => {
      cronPreview(cron, timezone, 5)
        .then((preview) => {
          if (n !== seq.current) return;
          report.current({ cron, timezone, error: preview.error });
          setP(preview.error ? { state: 'error', error: preview.error } : { state: 'ok', preview });
        })
        .catch((e) => n === seq.current && setP({ state: 'error', error: errorText(e) }));
    }, 300);
    return () => clearTimeout(timer);
  }, [cron, timezone]);

  const here = localZone();
  return (
    <div id="sched-preview" class="preview" aria-live="polite">
      {p.state === 'loading' && <p class="muted small">Working out the next slots…</p>}
      {p.state === 'error' && (
        <p class="error" data-testid="cron-error">
          {p.error}
        </p>
      )}
      {p.state === 'ok' && (
        <>
          <p class="label">
            Next {p.preview.slots.length} slots in {p.preview.timezone}
            {p.preview.timezone !== here ? ` (and in your time, ${here})` : ' (your time)'}
          </p>
          {p.preview.slots.length === 0 && <p class="muted small">It never fires.</p>}
          <ol class="slots" data-testid="cron-preview">
            {p.preview.slots.map((slot) => {
              const there = formatIn(slot, p.preview.timezone) ?? slot.slice(0, 16).replace('T', ' ') + ' UTC';
              const mine = formatIn(slot);
              return (
                <li key={slot}>
                  <time dateTime={slot} title={slot}>
                    {there}
                  </time>
                  {p.preview.timezone !== here && mine && <span class="muted"> · {mine} your time</span>}
                </li>
              );
            })}
          </ol>
        </>
      )}
    </div>
  );
}
