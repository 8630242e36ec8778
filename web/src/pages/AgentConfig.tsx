// An agent's configuration beyond its settings (owners and users read it; owners change it):
// its policy narrowing, its skills, its plugins, its schedules, its channels and the tools its
// model is offered. The agent page passes `versions`, bumped by the stream's events, so that each part is
// read again when it changed elsewhere.
import { useEffect, useRef, useState } from 'preact/hooks';
import {
  del,
  errorText,
  get,
  getAll,
  post,
  put,
  qs,
  seg,
  type KeelEvent,
  type Page,
  type Plugin,
  type Schedule,
  type SkillSummary,
} from '../api';
import { ErrorText, Json, Loading, Status, Time, formatIn } from '../components';
import { byteLength } from '../checks';
import { href } from '../router';
import { useAgentTools } from '../tools';
import { isOwner, useWho } from '../who';
import { AgentChannels } from './Channels';

export interface ConfigVersions {
  policy: number;
  skills: number;
  plugins: number;
  schedules: number;
  channels: number;
}

export function AgentConfig({ agentId, versions }: { agentId: string; versions: ConfigVersions }) {
  const owner = isOwner(useWho());
  return (
    <div class="config-grid">
      <AgentPolicy agentId={agentId} owner={owner} version={versions.policy} />
      <AgentTools agentId={agentId} />
      <AgentSkills agentId={agentId} owner={owner} version={versions.skills} />
      <AgentPlugins agentId={agentId} owner={owner} version={versions.plugins} />
      <AgentSchedules agentId={agentId} version={versions.schedules} />
      <AgentChannels agentId={agentId} version={versions.channels} />
    </div>
  );
}

// ---- Policy ----

type PolicyState =
  | { state: 'loading' }
  | { state: 'none' }
  | { state: 'set'; doc: unknown }
  | { state: 'unknown' } // the log was too long to tell; the reader may ask
  | { state: 'error'; error: string };

const SCAN_PAGES = 4;

// Whether the agent has a policy, from its events (newest first): GET /v1/agents/{id}/policy
// answers 404 when it has none, which the browser would log as an error on every visit. The
// newest policy.updated@v1 / policy.deleted@v1 of the agent says it; reaching agent.created@v1
// or the start of the log without one means none was ever set.
async function agentPolicyIsSet(agentId: string): Promise<boolean | null> {
  let cursor: string | null = null;
  for (let i = 0; i < SCAN_PAGES; i++) {
    const p: Page<KeelEvent> = await get<Page<KeelEvent>>('/v1/events' + qs({ agent_id: agentId, order: 'desc', limit: 500, cursor }));
    for (const ev of p.items) {
      if (ev.type === 'policy.updated@v1') return true;
      if (ev.type === 'policy.deleted@v1' || ev.type === 'agent.created@v1') return false;
    }
    if (!p.next_cursor) return false;
    cursor = p.next_cursor;
  }
  return null;
}

const POLICY_EXAMPLE = `{
  "rules": [{"tool": "notes.*", "rights": ["read"], "approval": "always"}],
  "deny": ["shell.*"],
  "require_approval": [],
  "separate_approver": false
}`;

function AgentPolicy({ agentId, owner, version }: { agentId: string; owner: boolean; version: number }) {
  const [p, setP] = useState<PolicyState>({ state: 'loading' });
  const [text, setText] = useState('');
  const [base, setBase] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [saved, setSaved] = useState<string | null>(null);
  const dirty = text !== base;
  const dirtyRef = useRef(dirty);
  dirtyRef.current = dirty;

  function show(doc: unknown | null) {
    const t = doc === null ? '' : JSON.stringify(doc, null, 2);
    setP(doc === null ? { state: 'none' } : { state: 'set', doc });
    // Unsaved edits are kept when the policy changes elsewhere.
    if (!dirtyRef.current) setText(t);
    setBase(t);
  }

  async function readDoc() {
    try {
      show(await get<unknown>(`/v1/agents/${seg(agentId)}/policy`));
    } catch (e) {
      setP({ state: 'error', error: errorText(e) });
    }
  }

  async function load() {
    try {
      const set = await agentPolicyIsSet(agentId);
      if (set === null) setP({ state: 'unknown' });
      else if (set) await readDoc();
      else show(null);
    } catch (e) {
      setP({ state: 'error', error: errorText(e) });
    }
  }
  useEffect(() => {
    load();
  }, [agentId, version]);

  let parsed: Record<string, unknown> | null = null;
  let problem: string | null = null;
  if (text.trim()) {
    try {
      const v = JSON.parse(text);
      if (v === null || typeof v !== 'object' || Array.isArray(v)) problem = 'A policy is a JSON object.';
      else parsed = v as Record<string, unknown>;
    } catch (e) {
      problem = 'Not valid JSON: ' + errorText(e);
    }
  } else if (dirty) problem = 'Write the policy as a JSON object, or delete it.';

  async function save(e: Event) {
    e.preventDefault();
    if (!parsed) return;
    setBusy(true);
    setError(null);
    setSaved(null);
    try {
      const doc = await put<unknown>(`/v1/agents/${seg(agentId)}/policy`, parsed);
      const t = JSON.stringify(doc, null, 2);
      setP({ state: 'set', doc });
      setBase(t);
      setText(t);
      setSaved('Saved (as the server wrote it).');
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }
  async function remove() {
    setBusy(true);
    setError(null);
    setSaved(null);
    try {
      await del(`/v1/agents/${seg(agentId)}/policy`);
      setP({ state: 'none' });
      setBase('');
      setText('');
      setSaved('Deleted: the agent has the tenant policy\u2019s rights.');
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  return (
    <section class="card form" aria-labelledby="agent-policy-h">
      <h2 id="agent-policy-h">Policy narrowing</h2>
      <p class="muted small">
        An agent policy can only take away from the tenant policy: its rules, <code>deny</code> and <code>require_approval</code> apply on top
        of the tenant's (docs/API.md section 12).
      </p>
      {p.state === 'loading' && <Loading what="the policy" />}
      {p.state === 'error' && <ErrorText error={p.error} />}
      {p.state === 'unknown' && (
        <p class="notice small">
          The agent's event log is long, so whether it has a policy is not known yet.{' '}
          <button type="button" class="small-btn" onClick={readDoc}>
            Read its policy
          </button>
        </p>
      )}
      {p.state === 'none' && <p class="small">No agent policy is set: the agent has the tenant policy's rights.</p>}
      {p.state === 'set' && <p class="small">An agent policy is set{dirty ? ' (you have unsaved changes)' : ''}.</p>}
      {p.state !== 'loading' && (owner || p.state === 'set') && (
        <form onSubmit={save}>
          <label for="agent-policy">{owner ? 'Policy (JSON)' : 'Policy (JSON, read-only)'}</label>
          <textarea
            id="agent-policy"
            data-testid="agent-policy"
            class="mono"
            rows={Math.min(18, Math.max(6, text.split('\n').length + 1))}
            spellcheck={false}
            readOnly={!owner}
            placeholder={owner ? POLICY_EXAMPLE : ''}
            value={text}
            aria-invalid={problem ? 'true' : 'false'}
            aria-describedby="agent-policy-check"
            onInput={(e) => {
              setText(e.currentTarget.value);
              setSaved(null);
            }}
          />
          <div id="agent-policy-check" aria-live="polite">
            {problem && <p class="error-text small">{problem}</p>}
            {!problem && <p class="muted small">{byteLength(text)} bytes</p>}
          </div>
          {owner && (
            <div class="actions">
              <button type="submit" class="primary" data-testid="agent-policy-save" disabled={busy || !parsed || (!dirty && p.state === 'set')}>
                Save policy
              </button>
              {p.state === 'set' && (
                <button type="button" class="danger" data-testid="agent-policy-delete" disabled={busy} onClick={remove}>
                  Delete policy
                </button>
              )}
            </div>
          )}
        </form>
      )}
      {!owner && <p class="muted small">Changing it needs an owner token.</p>}
      {saved && (
        <p class="small muted" role="status">
          {saved}
        </p>
      )}
      <ErrorText error={error} />
    </section>
  );
}

// ---- Tools ----

function AgentTools({ agentId }: { agentId: string }) {
  const tools = useAgentTools(agentId);
  return (
    <section class="card" aria-labelledby="agent-tools-h">
      <h2 id="agent-tools-h">Tools offered {tools.state === 'ok' && <span class="muted small">({tools.tools.length})</span>}</h2>
      <p class="muted small">What the model is offered as the agent's tools list resolves now (MCP servers that cannot be reached add nothing).</p>
      {tools.state === 'loading' && <Loading what="tools" />}
      {tools.state === 'error' && <ErrorText error={tools.error} />}
      {tools.state === 'ok' && tools.tools.length === 0 && <p class="muted small">No tools: the agent's list is empty.</p>}
      {tools.state === 'ok' && tools.tools.length > 0 && (
        <ul class="list">
          {tools.tools.map((t) => (
            <li key={t.name} data-testid="agent-tool-row" data-name={t.name}>
              <details class="tool">
                <summary>
                  <span class="mono">{t.name}</span>{' '}
                  <span class="small muted">
                    {t.rights.length ? t.rights.join(', ') : 'no rights'} · {t.effect_class}
                  </span>
                </summary>
                {t.description && <p class="small">{t.description}</p>}
                <p class="label">Arguments (JSON Schema)</p>
                <Json value={t.parameters} label={`Schema of ${t.name}`} />
              </details>
            </li>
          ))}
        </ul>
      )}
    </section>
  );
}

// ---- Skills ----

function AgentSkills({ agentId, owner, version }: { agentId: string; owner: boolean; version: number }) {
  const [skills, setSkills] = useState<SkillSummary[] | null>(null);
  const [catalog, setCatalog] = useState<SkillSummary[]>([]);
  const [pick, setPick] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    get<Page<SkillSummary>>(`/v1/agents/${seg(agentId)}/skills`)
      .then((p) => setSkills(p.items))
      .catch((e) => setError(errorText(e)));
    if (owner)
      get<Page<SkillSummary>>('/v1/skills')
        .then((p) => setCatalog(p.items))
        .catch(() => {});
  }, [agentId, version]);

  async function assign(e: Event) {
    e.preventDefault();
    const name = pick || free[0]?.name;
    if (!name) return;
    setBusy(true);
    setError(null);
    try {
      const p = await post<Page<SkillSummary>>(`/v1/agents/${seg(agentId)}/skills`, { name });
      setSkills(p.items);
      setPick('');
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }
  async function unassign(name: string) {
    setBusy(true);
    setError(null);
    try {
      await del(`/v1/agents/${seg(agentId)}/skills/${seg(name)}`);
      setSkills((l) => l && l.filter((s) => s.name !== name));
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  const assigned = new Set((skills ?? []).map((s) => s.name));
  const free = catalog.filter((s) => !assigned.has(s.name));
  return (
    <section class="card" aria-labelledby="agent-skills-h">
      <h2 id="agent-skills-h">Skills</h2>
      {!skills && !error && <Loading what="skills" />}
      {skills && skills.length === 0 && <p class="muted small">No skills assigned.</p>}
      {skills && skills.length > 0 && (
        <ul class="list">
          {skills.map((s) => (
            <li key={s.name} class="item" data-testid="agent-skill-row" data-name={s.name}>
              <div class="row-head">
                <strong class="mono">{s.name}</strong>
                <span class="small muted">{s.bytes} bytes</span>
                <span class="small muted">
                  <Time t={s.updated_at} />
                </span>
                <span class="grow" />
                {owner && (
                  <button type="button" class="small-btn" data-testid="agent-skill-unassign" disabled={busy} onClick={() => unassign(s.name)} aria-label={'Unassign ' + s.name}>
                    Unassign
                  </button>
                )}
              </div>
              {s.description && <p class="small">{s.description}</p>}
            </li>
          ))}
        </ul>
      )}
      {owner && free.length > 0 && (
        <form class="inline-form" onSubmit={assign}>
          <label for="agent-skill-pick">Assign a skill</label>
          <select id="agent-skill-pick" data-testid="agent-skill-assign-name" value={pick || free[0].name} onChange={(e) => setPick(e.currentTarget.value)}>
            {free.map((s) => (
              <option key={s.name} value={s.name}>
                {s.name}
              </option>
            ))}
          </select>
          <button type="submit" class="small-btn" data-testid="agent-skill-assign" disabled={busy}>
            Assign
          </button>
        </form>
      )}
      {owner && skills && free.length === 0 && catalog.length > 0 && <p class="muted small">Every registered skill is assigned.</p>}
      {owner && catalog.length === 0 && (
        <p class="muted small">
          No skills registered (<code>keel skills register DIR</code>).
        </p>
      )}
      {!owner && <p class="muted small">Assigning skills needs an owner token.</p>}
      <ErrorText error={error} />
    </section>
  );
}

// ---- Plugins ----

function AgentPlugins({ agentId, owner, version }: { agentId: string; owner: boolean; version: number }) {
  const [plugins, setPlugins] = useState<Plugin[] | null>(null);
  const [pick, setPick] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    getAll<Plugin>('/v1/plugins')
      .then(setPlugins)
      .catch((e) => setError(errorText(e)));
  }, [agentId, version]);

  async function act(what: 'enable' | 'disable', id: string) {
    setBusy(true);
    setError(null);
    try {
      const p = await post<Plugin>(`/v1/plugins/${seg(id)}/${what}`, { agent_id: agentId });
      setPlugins((l) => l && l.map((x) => (x.id === p.id ? { ...x, ...p } : x)));
      setPick('');
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  const mine = (plugins ?? []).filter((p) => p.enabled_for.includes(agentId) || p.enabled_for.includes('*'));
  const others = (plugins ?? []).filter((p) => !p.enabled_for.includes(agentId) && !p.enabled_for.includes('*'));
  return (
    <section class="card" aria-labelledby="agent-plugins-h">
      <h2 id="agent-plugins-h">Plugins</h2>
      {!plugins && !error && <Loading what="plugins" />}
      {plugins && mine.length === 0 && <p class="muted small">No plugin is enabled for this agent.</p>}
      {mine.length > 0 && (
        <ul class="list">
          {mine.map((p) => {
            const direct = p.enabled_for.includes(agentId);
            return (
              <li key={p.id} class="item" data-testid="agent-plugin-row" data-id={p.id}>
                <div class="row-head">
                  <strong>{p.name}</strong>
                  <span class="mono small">{p.id}</span>
                  <span class="tag">{p.kind}</span>
                  <span class="small muted">v{p.version}</span>
                  {p.enabled_for.includes('*') && <span class="small muted">enabled for all agents</span>}
                  <span class="grow" />
                  {owner && direct && (
                    <button type="button" class="small-btn" data-testid="agent-plugin-disable" disabled={busy} onClick={() => act('disable', p.id)} aria-label={`Disable ${p.name} for this agent`}>
                      Disable
                    </button>
                  )}
                </div>
              </li>
            );
          })}
        </ul>
      )}
      {owner && others.length > 0 && (
        <form
          class="inline-form"
          onSubmit={(e) => {
            e.preventDefault();
            act('enable', pick || others[0].id);
          }}
        >
          <label for="agent-plugin-pick">Enable a plugin for this agent</label>
          <select id="agent-plugin-pick" data-testid="agent-plugin-enable-name" value={pick || others[0].id} onChange={(e) => setPick(e.currentTarget.value)}>
            {others.map((p) => (
              <option key={p.id} value={p.id}>
                {p.name} ({p.id})
              </option>
            ))}
          </select>
          <button type="submit" class="small-btn" data-testid="agent-plugin-enable" disabled={busy}>
            Enable
          </button>
        </form>
      )}
      <p class="small">
        <a href="#/plugins">All plugins and their deliveries</a>
        {owner && mine.some((p) => p.enabled_for.includes('*')) ? ' (a plugin enabled for all agents is disabled there)' : ''}
      </p>
      {!owner && <p class="muted small">Enabling and disabling need an owner token.</p>}
      <ErrorText error={error} />
    </section>
  );
}

// ---- Schedules ----

function AgentSchedules({ agentId, version }: { agentId: string; version: number }) {
  const [schedules, setSchedules] = useState<Schedule[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    getAll<Schedule>(`/v1/agents/${seg(agentId)}/schedules`)
      .then(setSchedules)
      .catch((e) => setError(errorText(e)));
  }, [agentId, version]);
  return (
    <section class="card" aria-labelledby="agent-schedules-h">
      <h2 id="agent-schedules-h">Schedules</h2>
      <ErrorText error={error} />
      {!schedules && !error && <Loading what="schedules" />}
      {schedules && schedules.length === 0 && <p class="muted small">No schedules post to this agent.</p>}
      {schedules && schedules.length > 0 && (
        <ul class="list">
          {schedules.map((s) => (
            <li key={s.id} class="item" data-testid="agent-schedule-row" data-status={s.status} data-id={s.id}>
              <div class="row-head">
                <strong>{s.name}</strong>
                <Status s={s.status} />
                <span class="mono small">{s.kind === 'cron' ? `${s.cron} (${s.timezone})` : 'once'}</span>
              </div>
              <p class="small muted">
                {s.next_fire_at ? (
                  <>
                    next <Time t={s.next_fire_at} /> UTC
                    {s.timezone !== 'UTC' && formatIn(s.next_fire_at, s.timezone) ? ` · ${formatIn(s.next_fire_at, s.timezone)} ${s.timezone}` : ''}
                  </>
                ) : (
                  'no next slot'
                )}
                {s.session_id ? (
                  <>
                    {' '}
                    · into <a href={href('sessions', s.session_id)}>a session</a>
                  </>
                ) : (
                  ' · a new session each time'
                )}
              </p>
            </li>
          ))}
        </ul>
      )}
      <p class="small">
        <a href="#/schedules">Manage schedules</a>
      </p>
    </section>
  );
}
