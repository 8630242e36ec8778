// Plugins and MCP servers (owners and users; the API refuses guests). Plugins: what each is,
// which agents it is enabled for (owners enable and disable it), and a webhook plugin's
// deliveries, dead letters first in the eye, with Replay for owners. MCP servers: how each is
// reached, its status on this node and, on request, its tools. Live from the plugin.* and
// mcp_server.* events.
import { useEffect, useState } from 'preact/hooks';
import {
  ApiError,
  errorText,
  get,
  getAll,
  post,
  qs,
  seg,
  type Agent,
  type Delivery,
  type McpServer,
  type Page,
  type Plugin,
} from '../api';
import { ErrorText, Fold, Json, Loading, Status, StreamBadge, Time, shortId } from '../components';
import { href } from '../router';
import { useCoalesce, useStream } from '../stream';
import { isOwner, useWho } from '../who';

const DELIVERY_PAGE = 20;

export function PluginsPage() {
  const owner = isOwner(useWho());
  const [plugins, setPlugins] = useState<Plugin[] | null>(null);
  const [servers, setServers] = useState<McpServer[] | null>(null);
  const [agents, setAgents] = useState<Agent[]>([]);
  const [error, setError] = useState<string | null>(null);
  const [mcpError, setMcpError] = useState<string | null>(null);
  // Bumped per plugin when its deliveries changed (replayed, dead), so its list is read again.
  const [deliveryVersions, setDeliveryVersions] = useState<Record<string, number>>({});
  // plugin.error@v1 seen while the page is open, per plugin: the latest.
  const [errors, setErrors] = useState<Record<string, { message: string; event: string; agent_id: string | null; at: string }>>({});
  const coalesce = useCoalesce();

  function readPlugins() {
    getAll<Plugin>('/v1/plugins')
      .then((list) => {
        setPlugins(list);
        setError(null);
      })
      .catch((e) => setError(errorText(e)));
  }
  function readServers() {
    getAll<McpServer>('/v1/mcp-servers')
      .then((list) => {
        setServers(list);
        setMcpError(null);
      })
      .catch((e) => setMcpError(errorText(e)));
  }
  function readAgents() {
    getAll<Agent>('/v1/agents')
      .then(setAgents)
      .catch(() => {});
  }
  useEffect(() => {
    readPlugins();
    readServers();
    readAgents();
  }, []);

  const bump = (id: string | undefined) => id && setDeliveryVersions((v) => ({ ...v, [id]: (v[id] ?? 0) + 1 }));
  const plugin = () => coalesce('plugins', readPlugins);
  const live = useStream(
    {},
    {
      'plugin.registered@v1': plugin,
      'plugin.deleted@v1': plugin,
      'plugin.enabled@v1': plugin,
      'plugin.disabled@v1': plugin,
      'plugin.delivery_replayed@v1': (ev) => bump(ev.payload?.plugin_id),
      'plugin.delivery_dead@v1': (ev) => bump(ev.payload?.plugin_id),
      'plugin.error@v1': (ev) => {
        const id = ev.payload?.plugin_id;
        if (!id) return;
        setErrors((all) => ({ ...all, [id]: { message: String(ev.payload?.message ?? ''), event: String(ev.payload?.event ?? ''), agent_id: ev.agent_id, at: ev.occurred_at } }));
      },
      'mcp_server.registered@v1': () => coalesce('mcp', readServers),
      'mcp_server.deleted@v1': () => coalesce('mcp', readServers),
      'agent.created@v1': () => coalesce('agents', readAgents),
      'agent.deleted@v1': () => coalesce('agents', readAgents),
    },
  );

  const names = new Map(agents.map((a) => [a.id, a.name]));
  return (
    <section aria-labelledby="plugins-h">
      <div class="page-head">
        <h1 id="plugins-h">Plugins and MCP servers</h1>
        <StreamBadge state={live} />
      </div>
      {!owner && <p class="muted small">Enabling, disabling and replaying need an owner token: this page is read-only for you.</p>}

      <h2 id="plugin-list-h">Plugins</h2>
      <p class="muted small">
        Plugins handle the events of an agent's life; one does nothing until it is enabled for an agent or for all agents. Register them with{' '}
        <code>keel plugins register DIR</code>.
      </p>
      <ErrorText error={error} />
      {!plugins && !error && <Loading what="plugins" />}
      {plugins && plugins.length === 0 && <p class="muted">No plugins registered.</p>}
      {plugins && plugins.length > 0 && (
        <ul class="list" aria-labelledby="plugin-list-h">
          {plugins.map((p) => (
            <PluginRow
              key={p.id}
              p={p}
              owner={owner}
              agents={agents}
              names={names}
              lastError={errors[p.id]}
              deliveriesVersion={deliveryVersions[p.id] ?? 0}
              onChange={(next) => setPlugins((l) => l && l.map((x) => (x.id === next.id ? { ...x, ...next } : x)))}
            />
          ))}
        </ul>
      )}

      <h2 id="mcp-h">MCP servers</h2>
      <p class="muted small">
        Servers whose tools the tenant's agents call as <code>mcp__SERVER__TOOL</code>. The status is this node's.
      </p>
      <ErrorText error={mcpError} />
      {!servers && !mcpError && <Loading what="MCP servers" />}
      {servers && servers.length === 0 && <p class="muted">No MCP servers registered.</p>}
      {servers && servers.length > 0 && (
        <ul class="list" aria-labelledby="mcp-h">
          {servers.map((s) => (
            <McpRow key={s.id} s={s} onChange={(next) => setServers((l) => l && l.map((x) => (x.id === next.id ? next : x)))} />
          ))}
        </ul>
      )}
    </section>
  );
}

function enabledText(p: Plugin): string {
  if (p.enabled_for.includes('*')) return 'enabled for all agents';
  if (p.enabled_for.length === 0) return 'not enabled';
  return `enabled for ${p.enabled_for.length} ${p.enabled_for.length === 1 ? 'agent' : 'agents'}`;
}

function PluginRow({
  p,
  owner,
  agents,
  names,
  lastError,
  deliveriesVersion,
  onChange,
}: {
  p: Plugin;
  owner: boolean;
  agents: Agent[];
  names: Map<string, string>;
  lastError?: { message: string; event: string; agent_id: string | null; at: string };
  deliveriesVersion: number;
  onChange: (p: Plugin) => void;
}) {
  const [target, setTarget] = useState('*');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const idp = 'plugin-' + p.id.replace(/[^A-Za-z0-9_-]/g, '_');

  async function act(what: 'enable' | 'disable', agentId: string) {
    setBusy(true);
    setError(null);
    try {
      onChange(await post<Plugin>(`/v1/plugins/${seg(p.id)}/${what}`, { agent_id: agentId }));
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }

  const candidates = [
    ...(p.enabled_for.includes('*') ? [] : [['*', 'all agents, present and future']]),
    ...agents.filter((a) => !p.enabled_for.includes(a.id)).map((a) => [a.id, a.name]),
  ];
  const status = p.enabled_for.length ? 'enabled' : 'disabled';
  return (
    <li class="card" data-testid="plugin-row" data-id={p.id} data-kind={p.kind}>
      <div class="row-head">
        <strong class="name">{p.name}</strong>
        <span class="mono small">{p.id}</span>
        <span class="small">v{p.version}</span>
        <span class="tag">{p.kind}</span>
        <Status s={status} />
        <span class="small muted">{enabledText(p)}</span>
      </div>
      {p.manifest?.description && <p class="small">{p.manifest.description}</p>}
      <p class="small muted">
        {p.manifest?.events?.length ? <>handles {p.manifest.events.join(', ')}</> : 'handles no events'}
        {p.manifest?.failure_mode && <> · on failure: {p.manifest.failure_mode}</>} · registered <Time t={p.updated_at} />
      </p>
      {lastError && (
        <p class="error small" role="status">
          Failed <Time t={lastError.at} />
          {lastError.agent_id && <> for agent {names.get(lastError.agent_id) ?? shortId(lastError.agent_id)}</>}
          {lastError.event && <> handling {lastError.event}</>}: {lastError.message}
        </p>
      )}
      <div class="enabled-for">
        <p class="label" id={idp + '-for'}>
          Enabled for
        </p>
        {p.enabled_for.length === 0 && <p class="muted small">no agent</p>}
        {p.enabled_for.length > 0 && (
          <ul class="chips" aria-labelledby={idp + '-for'}>
            {p.enabled_for.map((a) => {
              const label = a === '*' ? 'all agents' : names.get(a) ?? 'agent ' + shortId(a);
              return (
                <li key={a}>
                  {a === '*' ? label : <a href={href('agents', a)}>{label}</a>}
                  {owner && (
                    <button
                      type="button"
                      class="small-btn"
                      data-testid="plugin-disable"
                      disabled={busy}
                      onClick={() => act('disable', a)}
                      aria-label={`Disable ${p.name} for ${label}`}
                    >
                      Disable
                    </button>
                  )}
                </li>
              );
            })}
          </ul>
        )}
        {owner && candidates.length > 0 && (
          <form
            class="inline-form"
            onSubmit={(e) => {
              e.preventDefault();
              act('enable', candidates.some(([id]) => id === target) ? target : candidates[0][0]);
            }}
          >
            <label for={idp + '-enable'}>Enable {p.name} for</label>
            <select
              id={idp + '-enable'}
              data-testid="plugin-enable-agent"
              value={candidates.some(([id]) => id === target) ? target : candidates[0][0]}
              onChange={(e) => setTarget(e.currentTarget.value)}
            >
              {candidates.map(([id, name]) => (
                <option key={id} value={id}>
                  {name}
                </option>
              ))}
            </select>
            <button type="submit" class="small-btn" data-testid="plugin-enable" disabled={busy}>
              Enable
            </button>
          </form>
        )}
      </div>
      <ErrorText error={error} />
      {p.kind === 'webhook' && <Deliveries plugin={p} owner={owner} names={names} version={deliveriesVersion} />}
      <Fold summary="Manifest and config">
        <p class="label">Manifest</p>
        <Json value={p.manifest} label={`Manifest of ${p.name}`} />
        <p class="label">Config</p>
        <Json value={p.config} label={`Config of ${p.name}`} />
      </Fold>
    </li>
  );
}

// A webhook plugin's deliveries, newest first, `status` filtered on the server.
function Deliveries({ plugin, owner, names, version }: { plugin: Plugin; owner: boolean; names: Map<string, string>; version: number }) {
  const [status, setStatus] = useState('');
  const [items, setItems] = useState<Delivery[] | null>(null);
  const [cursor, setCursor] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const idp = 'dl-' + plugin.id.replace(/[^A-Za-z0-9_-]/g, '_');

  function read(from: string | null, keep = 0) {
    setBusy(true);
    const limit = Math.min(500, Math.max(DELIVERY_PAGE, keep));
    get<Page<Delivery>>(`/v1/plugins/${seg(plugin.id)}/deliveries` + qs({ status, limit, cursor: from }))
      .then((p) => {
        setItems((prev) => (from && prev ? [...prev, ...p.items] : p.items));
        setCursor(p.next_cursor);
        setError(null);
      })
      .catch((e) => setError(errorText(e)))
      .finally(() => setBusy(false));
  }
  useEffect(() => {
    setItems(null);
    read(null);
  }, [status]);
  useEffect(() => {
    if (version > 0) read(null, items?.length ?? 0);
  }, [version]);

  const dead = items?.filter((d) => d.status === 'dead').length ?? 0;
  return (
    <div class="deliveries">
      <div class="row-head">
        <h3 id={idp + '-h'} class="h-small">
          Webhook deliveries
        </h3>
        {dead > 0 && <span class="status status-dead">{dead} dead</span>}
        <span class="grow" />
        <label for={idp + '-status'} class="inline-label">
          Status
        </label>
        <select id={idp + '-status'} class="narrow" value={status} onChange={(e) => setStatus(e.currentTarget.value)}>
          <option value="">any</option>
          <option value="dead">dead</option>
          <option value="pending">pending</option>
          <option value="delivered">delivered</option>
        </select>
        <button type="button" class="small-btn" disabled={busy} onClick={() => read(null, items?.length ?? 0)} aria-label={`Refresh the deliveries of ${plugin.name}`}>
          Refresh
        </button>
      </div>
      <ErrorText error={error} />
      {!items && !error && <Loading what="deliveries" />}
      {items && items.length === 0 && <p class="muted small">No deliveries{status ? ' with this status' : ''}.</p>}
      {items && items.length > 0 && (
        <ul class="list" aria-labelledby={idp + '-h'}>
          {items.map((d) => (
            <DeliveryRow
              key={d.id}
              d={d}
              plugin={plugin}
              owner={owner}
              agentName={d.agent_id ? names.get(d.agent_id) : undefined}
              onChange={(next) => setItems((l) => l && l.map((x) => (x.id === next.id ? next : x)))}
            />
          ))}
        </ul>
      )}
      {cursor && (
        <button type="button" class="small-btn" disabled={busy} onClick={() => read(cursor)}>
          Load older deliveries
        </button>
      )}
    </div>
  );
}

function DeliveryRow({ d, plugin, owner, agentName, onChange }: { d: Delivery; plugin: Plugin; owner: boolean; agentName?: string; onChange: (d: Delivery) => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  async function replay() {
    setBusy(true);
    setError(null);
    try {
      onChange(await post<Delivery>(`/v1/plugins/${seg(plugin.id)}/deliveries/${seg(d.id)}/replay`));
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }
  return (
    <li class={'delivery' + (d.status === 'dead' ? ' delivery-dead' : '')} data-testid="plugin-delivery" data-status={d.status} data-id={d.id}>
      <div class="row-head small">
        <span class="mono">{d.event}</span>
        <Status s={d.status} />
        <span>
          {d.attempts} {d.attempts === 1 ? 'attempt' : 'attempts'}
        </span>
        {d.last_status > 0 && <span class="muted">last answer HTTP {d.last_status}</span>}
        <span class="muted">
          <Time t={d.created_at} />
        </span>
        {d.agent_id && (
          <span class="muted">
            agent <a href={href('agents', d.agent_id)}>{agentName ?? shortId(d.agent_id)}</a>
          </span>
        )}
        <span class="grow" />
        {owner && d.status !== 'pending' && (
          <button type="button" class="small-btn" data-testid="delivery-replay" disabled={busy} onClick={replay} aria-label={`Replay delivery ${shortId(d.id)} of ${d.event}`}>
            Replay
          </button>
        )}
      </div>
      {d.last_error && <p class="small error-text">{d.last_error}</p>}
      <p class="small muted">
        {d.status === 'pending' && d.next_attempt_at && (
          <>
            next attempt <Time t={d.next_attempt_at} /> ·{' '}
          </>
        )}
        {d.delivered_at && (
          <>
            delivered <Time t={d.delivered_at} /> ·{' '}
          </>
        )}
        <span class="mono">{d.id}</span>
      </p>
      <Fold summary="Payload">
        <Json value={d.payload} label="Payload" />
      </Fold>
      <ErrorText error={error} />
    </li>
  );
}

function McpRow({ s, onChange }: { s: McpServer; onChange: (s: McpServer) => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  // GET /v1/mcp-servers/{id} starts the server on this node when it is not running, so the
  // tools are read when asked for, not on every visit.
  async function readTools() {
    setBusy(true);
    setError(null);
    try {
      onChange(await get<McpServer>('/v1/mcp-servers/' + seg(s.id)));
    } catch (e) {
      if (e instanceof ApiError && e.status === 404) setError('This server is no longer registered.');
      else setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }
  const where = s.transport === 'http' ? s.url : s.command?.join(' ');
  return (
    <li class="card" data-testid="mcp-server-row" data-status={s.status} data-id={s.id}>
      <div class="row-head">
        <strong class="name mono">{s.name}</strong>
        <span class="tag">{s.transport}</span>
        <Status s={s.status} />
        {s.timeout_ms !== undefined && <span class="small muted">timeout {s.timeout_ms} ms</span>}
        <span class="small muted">
          registered <Time t={s.created_at} />
        </span>
      </div>
      {where && <p class="mono small">{where}</p>}
      {s.error && <p class="small error-text">{s.error}</p>}
      {s.tools === undefined ? (
        <div class="actions">
          <button type="button" class="small-btn" data-testid="mcp-server-tools" disabled={busy} onClick={readTools} aria-describedby={'mcp-note-' + s.id}>
            {busy ? 'Connecting…' : 'List its tools'}
          </button>
          <span id={'mcp-note-' + s.id} class="small muted">
            starts the server on this node if it is not running
          </span>
        </div>
      ) : (
        <>
          <p class="label">
            {s.tools.length} {s.tools.length === 1 ? 'tool' : 'tools'}
          </p>
          {s.tools.length > 0 && (
            <ul class="tool-list">
              {s.tools.map((t) => (
                <li key={t.name}>
                  <span class="mono">{t.name}</span> <span class="small muted">rights {t.rights.join(', ') || 'none'} · {t.effect_class}</span>
                  {t.description && <p class="small">{t.description}</p>}
                </li>
              ))}
            </ul>
          )}
        </>
      )}
      <ErrorText error={error} />
    </li>
  );
}
