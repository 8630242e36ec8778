// One agent: edit its model, instructions and tools; its sessions, newest first; open a new one.
import { useEffect, useState } from 'preact/hooks';
import { errorText, get, patch, post, qs, seg, type Agent, type Page, type Session } from '../api';
import { ErrorText, Loading, Status, StreamBadge, Time } from '../components';
import { href, hrefQuery, navigate } from '../router';
import { RUN_EVENT_TYPES, useCoalesce, useStream, type Handlers } from '../stream';
import { forgetAgentTools } from '../tools';
import { isMember, useWho } from '../who';
import { AgentConfig, type ConfigVersions } from './AgentConfig';
import { parseTools } from './Agents';

const SCHEDULE_EVENTS = [
  'schedule.created@v1',
  'schedule.paused@v1',
  'schedule.resumed@v1',
  'schedule.deleted@v1',
  'schedule.fired@v1',
  'schedule.refused@v1',
  'schedule.skipped@v1',
  'schedule.suspended@v1',
  'schedule.reassigned@v1',
];

// A channel's status changes with these (a failing poll has no event: the channels page has Refresh).
const CHANNEL_EVENTS = ['channel.created@v1', 'channel.updated@v1', 'channel.deleted@v1', 'channel.delivered@v1'];

export function AgentPage({ id, role }: { id: string; role: string }) {
  const [agent, setAgent] = useState<Agent | null>(null);
  const [deleted, setDeleted] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [sessions, setSessions] = useState<Session[] | null>(null);
  const [cursor, setCursor] = useState<string | null>(null);
  const [listError, setListError] = useState<string | null>(null);
  const [versions, setVersions] = useState<ConfigVersions>({ policy: 0, skills: 0, plugins: 0, schedules: 0, channels: 0 });
  const coalesce = useCoalesce();
  const member = isMember(useWho());
  const bump = (k: keyof ConfigVersions) => coalesce('v-' + k, () => setVersions((v) => ({ ...v, [k]: v[k] + 1 })));

  useEffect(() => {
    get<Agent>('/v1/agents/' + seg(id))
      .then(setAgent)
      .catch((e) => setError(errorText(e)));
    loadSessions(null);
  }, [id]);

  function loadSessions(from: string | null) {
    get<Page<Session>>(`/v1/agents/${seg(id)}/sessions` + qs({ order: 'desc', limit: 100, cursor: from }))
      .then((p) => {
        setSessions((prev) => (from && prev ? [...prev, ...p.items] : p.items));
        setCursor(p.next_cursor);
      })
      .catch((e) => setListError(errorText(e)));
  }

  function refetchSession(sid: string | null) {
    if (!sid) return;
    coalesce('s' + sid, () =>
      get<Session>('/v1/sessions/' + seg(sid))
        .then((s) =>
          setSessions((list) => {
            if (!list) return list;
            const i = list.findIndex((x) => x.id === s.id);
            if (i < 0) return [s, ...list];
            const next = list.slice();
            next[i] = s;
            return next;
          }),
        )
        .catch(() => {}),
    );
  }

  const handlers: Handlers = {
    'agent.updated@v1': () => {
      // Its tools list may have changed, and so the tools its model is offered.
      forgetAgentTools(id);
      coalesce('agent', () =>
        get<Agent>('/v1/agents/' + seg(id))
          .then(setAgent)
          .catch(() => {}),
      );
    },
    'agent.deleted@v1': () => setDeleted(true),
    'session.created@v1': (ev) => refetchSession(ev.session_id),
    'session.closed@v1': (ev) => refetchSession(ev.session_id),
    'session.reopened@v1': (ev) => refetchSession(ev.session_id),
    'session.described@v1': (ev) => refetchSession(ev.session_id),
  };
  for (const t of RUN_EVENT_TYPES) handlers[t] = (ev) => refetchSession(ev.session_id);
  if (member) {
    handlers['policy.updated@v1'] = () => bump('policy');
    handlers['policy.deleted@v1'] = () => bump('policy');
    handlers['skill.assigned@v1'] = () => bump('skills');
    handlers['skill.unassigned@v1'] = () => bump('skills');
    const plugins = () => {
      forgetAgentTools(id); // a plugin's tools come and go with it
      bump('plugins');
    };
    handlers['plugin.enabled@v1'] = plugins;
    handlers['plugin.disabled@v1'] = plugins;
    for (const t of SCHEDULE_EVENTS) handlers[t] = () => bump('schedules');
    for (const t of CHANNEL_EVENTS) handlers[t] = () => bump('channels');
  }
  const live = useStream({ agent_id: id }, handlers);

  if (error) {
    return (
      <section>
        <h1>Agent</h1>
        <ErrorText error={error} />
      </section>
    );
  }
  if (!agent) return <Loading what="agent" />;
  return (
    <section aria-labelledby="agent-h">
      <p class="crumbs">
        <a href="#/agents">Agents</a> /
      </p>
      <div class="page-head">
        <h1 id="agent-h">{agent.name}</h1>
        <StreamBadge state={live} />
      </div>
      <p class="small">
        <span class="mono muted">{agent.id}</span> · <a href={hrefQuery(['memory'], { agent_id: agent.id })}>memory</a> ·{' '}
        <a href={hrefQuery(['events'], { agent_id: agent.id })}>events</a>
      </p>
      {deleted && <p class="notice">This agent was deleted.</p>}
      <div class="cols">
        <div>
          <h2>Sessions</h2>
          <NewSession agentId={id} />
          <ErrorText error={listError} />
          {!sessions && !listError && <Loading what="sessions" />}
          {sessions && sessions.length === 0 && <p class="muted">No sessions yet.</p>}
          {sessions && sessions.length > 0 && (
            <ul class="list">
              {sessions.map((s) => (
                <li key={s.id} class="card" data-testid="session-row">
                  <div class="row-head">
                    <a href={href('sessions', s.id)}>{s.title || 'Untitled session'}</a>
                    <Status s={s.status} />
                    <span class="small muted">
                      <Time t={s.created_at} />
                    </span>
                    <span class="mono small muted">{s.id}</span>
                  </div>
                  {s.description && <p class="small">{s.description}</p>}
                </li>
              ))}
            </ul>
          )}
          {cursor && (
            <button type="button" onClick={() => loadSessions(cursor)}>
              Load older sessions
            </button>
          )}
        </div>
        <EditAgent key={agent.updated_at} agent={agent} role={role} onSaved={setAgent} />
      </div>
      {member ? (
        <AgentConfig agentId={id} versions={versions} />
      ) : (
        <p class="muted small">The agent's policy, tools, skills, plugins, schedules and channels need an owner or user token.</p>
      )}
    </section>
  );
}

function NewSession({ agentId }: { agentId: string }) {
  const [title, setTitle] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  async function submit(e: Event) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const body = title.trim() ? { title: title.trim() } : {};
      const s = await post<Session>(`/v1/agents/${seg(agentId)}/sessions`, body);
      navigate(href('sessions', s.id));
    } catch (err) {
      setError(errorText(err));
      setBusy(false);
    }
  }
  return (
    <form class="inline-form" onSubmit={submit}>
      <label for="session-title">Title (optional)</label>
      <input id="session-title" maxLength={1000} value={title} onInput={(e) => setTitle(e.currentTarget.value)} />
      <button type="submit" class="primary" data-testid="new-session" disabled={busy}>
        New session
      </button>
      <ErrorText error={error} />
    </form>
  );
}

function EditAgent({ agent, role, onSaved }: { agent: Agent; role: string; onSaved: (a: Agent) => void }) {
  const [model, setModel] = useState(agent.model);
  const [instructions, setInstructions] = useState(agent.instructions);
  const [tools, setTools] = useState(agent.tools.join(', '));
  // The double-text mode (config.busy) has a control of its own; the rest of config is JSON.
  const { busy: busyMode, ...others } = agent.config ?? {};
  const initialMode = busyMode === 'reject' ? 'reject' : 'queue';
  const initialOthers = JSON.stringify(others, null, 2);
  const [mode, setMode] = useState<string>(initialMode);
  const [configText, setConfigText] = useState(initialOthers);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [saved, setSaved] = useState(false);
  const owner = role === 'owner';

  async function submit(e: Event) {
    e.preventDefault();
    if (!owner) return;
    const body: Record<string, unknown> = {};
    if (model.trim() !== agent.model) body.model = model.trim();
    if (instructions !== agent.instructions) body.instructions = instructions;
    const t = parseTools(tools);
    if (t.join(',') !== agent.tools.join(',')) body.tools = t;
    if (mode !== initialMode || configText !== initialOthers) {
      let parsed: unknown;
      try {
        parsed = JSON.parse(configText);
      } catch {
        setError('Other settings: not valid JSON.');
        return;
      }
      if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
        setError('Other settings: a JSON object, e.g. {"max_steps": 8}.');
        return;
      }
      body.config = { ...(parsed as Record<string, unknown>), busy: mode };
    }
    if (Object.keys(body).length === 0) {
      setSaved(true);
      return;
    }
    setBusy(true);
    setError(null);
    setSaved(false);
    try {
      onSaved(await patch<Agent>('/v1/agents/' + seg(agent.id), body));
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  return (
    <form class="card form" onSubmit={submit} aria-labelledby="edit-h">
      <h2 id="edit-h">Settings</h2>
      {role !== 'owner' && <p class="muted small">Changing an agent needs an owner token: these are read-only for you.</p>}
      <label for="edit-model">Model</label>
      <input id="edit-model" data-testid="agent-edit-model" readOnly={!owner} value={model} onInput={(e) => setModel(e.currentTarget.value)} />
      <label for="edit-instructions">Instructions</label>
      <textarea
        id="edit-instructions"
        data-testid="agent-edit-instructions"
        rows={6}
        readOnly={!owner}
        value={instructions}
        onInput={(e) => setInstructions(e.currentTarget.value)}
      />
      <label for="edit-tools">Tools (comma-separated)</label>
      <input id="edit-tools" data-testid="agent-edit-tools" readOnly={!owner} value={tools} onInput={(e) => setTools(e.currentTarget.value)} />
      <label for="edit-busy">A message while a run is in flight (double-texting)</label>
      <select id="edit-busy" data-testid="agent-edit-busy" disabled={!owner} value={mode} onChange={(e) => setMode(e.currentTarget.value)}>
        <option value="queue">queue it: a run behind the current one</option>
        <option value="reject">reject it (409)</option>
      </select>
      <label for="edit-config">Other settings (config, JSON)</label>
      <textarea
        id="edit-config"
        data-testid="agent-edit-config"
        class="mono"
        rows={4}
        readOnly={!owner}
        spellcheck={false}
        value={configText}
        onInput={(e) => setConfigText(e.currentTarget.value)}
      />
      <button type="submit" class="primary" data-testid="agent-edit-submit" disabled={busy || !owner}>
        Save
      </button>
      {saved && <p class="muted small">No changes.</p>}
      <ErrorText error={error} />
    </form>
  );
}
