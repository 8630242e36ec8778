// The event log: the newest events (GET /v1/events?order=desc, filtered by agent, session and
// run on the server and by type here), older ones on request, then followed live over a
// WebSocket from the newest position read.
import { useEffect, useState } from 'preact/hooks';
import { errorText, get, qs, type KeelEvent, type Page } from '../api';
import { ErrorText, IdLink, Json, Loading, StreamBadge, Time, memo } from '../components';
import { hrefQuery, navigate } from '../router';
import { useEventSocket } from '../stream';

// Events shown at first, and kept while new ones arrive (more once older ones are loaded).
const KEEP = 500;
const SCOPES = ['agent_id', 'session_id', 'run_id'] as const;

interface Log {
  items: KeelEvent[]; // newest first
  older: string | null; // the cursor of older events (position < older), or null: none
  keep: number; // how many are kept while new ones arrive
}

export function Events({ query }: { query: URLSearchParams }) {
  const filter: Record<string, string> = {};
  for (const k of SCOPES) {
    const v = query.get(k);
    if (v) filter[k] = v;
  }
  const [log, setLog] = useState<Log | null>(null);
  const [after, setAfter] = useState<number | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [loadingOlder, setLoadingOlder] = useState(false);
  const [type, setType] = useState('');
  const [form, setForm] = useState<Record<string, string>>(filter);

  useEffect(() => {
    (async () => {
      const p = await get<Page<KeelEvent>>('/v1/events' + qs({ ...filter, order: 'desc', limit: KEEP }));
      let last = p.items.length ? p.items[0].position : 0;
      if (!p.items.length && Object.keys(filter).length) {
        // Nothing matches yet: follow from the tenant's newest position.
        const all = await get<Page<KeelEvent>>('/v1/events' + qs({ order: 'desc', limit: 1 }));
        if (all.items.length) last = all.items[0].position;
      }
      setLog({ items: p.items, older: p.next_cursor, keep: KEEP });
      setAfter(last);
    })().catch((e) => setError(errorText(e)));
  }, []);

  async function loadOlder() {
    if (!log?.older) return;
    setLoadingOlder(true);
    try {
      const p = await get<Page<KeelEvent>>('/v1/events' + qs({ ...filter, order: 'desc', limit: KEEP, cursor: log.older }));
      setLog((l) => {
        if (!l) return l;
        const items = l.items.concat(p.items.filter((e) => !l.items.length || e.position < l.items[l.items.length - 1].position));
        return { items, older: p.next_cursor, keep: Math.max(l.keep, items.length) };
      });
    } catch (e) {
      setError(errorText(e));
    } finally {
      setLoadingOlder(false);
    }
  }

  const live = useEventSocket(filter, after, (ev) => {
    setLog((l) => {
      if (!l) return l;
      if (l.items.length && ev.position <= l.items[0].position) return l;
      const items = [ev, ...l.items];
      if (items.length <= l.keep) return { ...l, items };
      // The oldest go; older events then continue below the oldest kept.
      const kept = items.slice(0, l.keep);
      return { ...l, items: kept, older: String(kept[kept.length - 1].position) };
    });
  });

  const events = log?.items ?? null;
  const older = log?.older ?? null;
  const needle = type.trim().toLowerCase();
  const shown = (events ?? []).filter((e) => !needle || e.type.toLowerCase().includes(needle));
  return (
    <section aria-labelledby="events-h">
      <div class="page-head">
        <h1 id="events-h">Events</h1>
        {after !== null && <StreamBadge state={live} />}
      </div>
      <form
        class="filters"
        onSubmit={(e) => {
          e.preventDefault();
          navigate(hrefQuery(['events'], form));
        }}
      >
        <div>
          <label for="ev-type">Type contains</label>
          <input id="ev-type" data-testid="events-type" value={type} onInput={(e) => setType(e.currentTarget.value)} placeholder="run." />
        </div>
        {SCOPES.map((k) => (
          <div key={k}>
            <label for={'ev-' + k}>{k}</label>
            <input
              id={'ev-' + k}
              data-testid={'events-' + k.replace('_id', '')}
              class="mono"
              value={form[k] ?? ''}
              onInput={(e) => setForm({ ...form, [k]: e.currentTarget.value.trim() })}
            />
          </div>
        ))}
        <div class="filters-submit">
          <button type="submit" data-testid="events-apply">
            Apply
          </button>
        </div>
      </form>
      <ErrorText error={error} />
      {!events && !error && <Loading what="events" />}
      {events && (
        <p class="small muted">
          {shown.length} of the latest {events.length} events{needle ? ' match the type' : ''}; newest first.
        </p>
      )}
      <ol class="events">
        {shown.map((e) => (
          <EventRow key={e.position} e={e} />
        ))}
      </ol>
      {events && older && (
        <button type="button" data-testid="events-older" disabled={loadingOlder} onClick={loadOlder}>
          Load older events
        </button>
      )}
    </section>
  );
}

const EventRow = memo(function EventRow({ e }: { e: KeelEvent }) {
  const payload = JSON.stringify(e.payload ?? {});
  return (
    <li class="event" data-testid="event-row" data-type={e.type}>
      <div class="row-head">
        <span class="mono small muted">#{e.position}</span>
        <span class="small muted">
          <Time t={e.occurred_at} />
        </span>
        <strong class="mono">{e.type}</strong>
        {e.agent_id && (
          <span class="small">
            agent <IdLink kind="agents" id={e.agent_id} />
          </span>
        )}
        {e.session_id && (
          <span class="small">
            session <IdLink kind="sessions" id={e.session_id} />
          </span>
        )}
        {e.run_id && (
          <span class="small">
            run <IdLink kind="runs" id={e.run_id} />
          </span>
        )}
      </div>
      {payload.length <= 200 ? (
        <code class="payload">{payload}</code>
      ) : (
        <details class="fold">
          <summary>
            <code class="payload">{payload.slice(0, 160)}…</code>
          </summary>
          <Json value={e.payload} label="Payload" />
        </details>
      )}
    </li>
  );
});
