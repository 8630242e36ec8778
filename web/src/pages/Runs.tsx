// Runs, newest first, filtered by status and agent on the server, live from run events.
import { useEffect, useRef, useState } from 'preact/hooks';
import { errorText, get, getAll, isFinished, post, qs, seg, upsertRun, type Agent, type Page, type Run } from '../api';
import { ErrorText, IdLink, Loading, Status, StreamBadge, Time, shortId } from '../components';
import { href } from '../router';
import { RUN_EVENT_TYPES, useCoalesce, useStream, type Handlers } from '../stream';

const STATUSES = ['queued', 'running', 'waiting_for_approval', 'done', 'failed', 'cancelled'];

export function Runs() {
  const [runs, setRuns] = useState<Run[] | null>(null);
  const [cursor, setCursor] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [agents, setAgents] = useState<Agent[]>([]);
  const [status, setStatus] = useState('');
  const [agent, setAgent] = useState('');
  const [loading, setLoading] = useState(false);
  const coalesce = useCoalesce();
  const filter = { agent_id: agent, status };
  const key = qs(filter);
  // The filters in force, for answers and events that arrive after a change.
  const current = useRef(filter);
  current.current = filter;

  // A live update places a run by the filters in force: it joins the list when it matches
  // them and leaves it when it no longer does (a running run that ends, under "running").
  function place(r: Run) {
    const f = current.current;
    const matches = (!f.status || r.status === f.status) && (!f.agent_id || r.agent_id === f.agent_id);
    setRuns((list) => {
      if (!list) return list;
      if (matches) return upsertRun(list, r);
      return list.some((x) => x.id === r.id) ? list.filter((x) => x.id !== r.id) : list;
    });
  }

  function load(from: string | null) {
    const wanted = key;
    setLoading(true);
    get<Page<Run>>('/v1/runs' + qs({ ...filter, order: 'desc', limit: 100, cursor: from }))
      .then((p) => {
        if (wanted !== qs(current.current)) return; // the filters changed meanwhile
        setRuns((prev) => (from && prev ? [...prev, ...p.items] : p.items));
        setCursor(p.next_cursor);
        setError(null);
      })
      .catch((e) => setError(errorText(e)))
      .finally(() => setLoading(false));
  }

  useEffect(() => {
    setRuns(null);
    setCursor(null);
    load(null);
  }, [key]);

  useEffect(() => {
    getAll<Agent>('/v1/agents')
      .then(setAgents)
      .catch(() => {});
  }, []);

  const handlers: Handlers = {};
  for (const t of RUN_EVENT_TYPES) {
    handlers[t] = (ev) => {
      const id: string | null = ev.run_id;
      if (!id) return;
      coalesce(id, () =>
        get<Run>('/v1/runs/' + seg(id))
          .then(place)
          .catch(() => {}),
      );
    };
  }
  const live = useStream(agent ? { agent_id: agent } : {}, handlers);

  const names = new Map(agents.map((a) => [a.id, a.name]));
  const shown = runs ?? [];
  return (
    <section aria-labelledby="runs-h">
      <div class="page-head">
        <h1 id="runs-h">Runs</h1>
        <StreamBadge state={live} />
      </div>
      <div class="filters">
        <div>
          <label for="runs-status">Status</label>
          <select id="runs-status" data-testid="runs-status" value={status} onChange={(e) => setStatus(e.currentTarget.value)}>
            <option value="">any</option>
            {STATUSES.map((s) => (
              <option key={s} value={s}>
                {s.replace(/_/g, ' ')}
              </option>
            ))}
          </select>
        </div>
        <div>
          <label for="runs-agent">Agent</label>
          <select id="runs-agent" data-testid="runs-agent" value={agent} onChange={(e) => setAgent(e.currentTarget.value)}>
            <option value="">any</option>
            {agents.map((a) => (
              <option key={a.id} value={a.id}>
                {a.name}
              </option>
            ))}
          </select>
        </div>
      </div>
      <ErrorText error={error} />
      {!runs && !error && loading && <Loading what="runs" />}
      {runs && shown.length === 0 && <p class="muted">No runs{status || agent ? ' match these filters' : ''}.</p>}
      <ul class="list">
        {shown.map((r) => (
          <RunRow key={r.id} run={r} agentName={names.get(r.agent_id)} onChange={(x) => setRuns((l) => upsertRun(l ?? [], x))} />
        ))}
      </ul>
      {cursor && (
        <button type="button" disabled={loading} onClick={() => load(cursor)}>
          Load older runs
        </button>
      )}
    </section>
  );
}

export function RunRow({
  run: r,
  agentName,
  compact,
  onChange,
}: {
  run: Run;
  agentName?: string;
  compact?: boolean;
  onChange: (r: Run) => void;
}) {
  return (
    <li class="card" data-testid="run-row" data-status={r.status}>
      <div class="row-head">
        <a href={href('runs', r.id)} class="mono" title={r.id}>
          run {shortId(r.id)}
        </a>
        <Status s={r.status} />
        {r.cancel_requested && !isFinished(r.status) && <span class="small muted">cancel requested</span>}
        <span class="small muted">
          <Time t={r.created_at} />
        </span>
        {!compact && (
          <>
            <span class="small">
              agent {agentName ?? ''} <IdLink kind="agents" id={r.agent_id} />
            </span>
            <span class="small">
              session <IdLink kind="sessions" id={r.session_id} />
            </span>
          </>
        )}
        {r.usage && (
          <span class="small muted">
            {r.usage.input_tokens ?? 0}/{r.usage.output_tokens ?? 0} tokens
          </span>
        )}
        <span class="grow" />
        {!isFinished(r.status) && <CancelButton run={r} onChange={onChange} />}
      </div>
      {r.error && (
        <p class="small error-text">
          {r.error.code}: {r.error.message}
        </p>
      )}
    </li>
  );
}

export function CancelButton({ run, onChange }: { run: Run; onChange: (r: Run) => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  async function cancel() {
    setBusy(true);
    setError(null);
    try {
      onChange(await post<Run>(`/v1/runs/${seg(run.id)}/cancel`));
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }
  return (
    <>
      <button type="button" class="danger small-btn" data-testid="run-cancel" disabled={busy || run.cancel_requested} onClick={cancel}>
        Cancel run
      </button>
      <ErrorText error={error} />
    </>
  );
}
