// Agents: the list, a create form and inline delete. Live from agent.* events.
import { useEffect, useState } from 'preact/hooks';
import { ApiError, del, errorText, get, getAll, post, seg, type Agent } from '../api';
import { ErrorText, Loading, StreamBadge } from '../components';
import { href } from '../router';
import { useStream } from '../stream';

export function parseTools(text: string): string[] {
  return text
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
}

export function Agents({ role }: { role: string }) {
  const [agents, setAgents] = useState<Agent[] | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    getAll<Agent>('/v1/agents')
      .then(setAgents)
      .catch((e) => setError(errorText(e)));
  }, []);

  function upsert(a: Agent) {
    setAgents((list) => {
      if (!list) return list;
      const i = list.findIndex((x) => x.id === a.id);
      if (i < 0) return [...list, a];
      const next = list.slice();
      next[i] = a;
      return next;
    });
  }
  function remove(id: string) {
    setAgents((list) => list && list.filter((x) => x.id !== id));
  }
  function refetch(id: string | null) {
    if (!id) return;
    get<Agent>('/v1/agents/' + seg(id))
      .then(upsert)
      .catch((e) => {
        if (e instanceof ApiError && e.status === 404) remove(id);
      });
  }

  const live = useStream(
    {},
    {
      'agent.created@v1': (ev) => refetch(ev.agent_id),
      'agent.updated@v1': (ev) => refetch(ev.agent_id),
      'agent.deleted@v1': (ev) => ev.agent_id && remove(ev.agent_id),
    },
  );

  return (
    <section aria-labelledby="agents-h">
      <div class="page-head">
        <h1 id="agents-h">Agents</h1>
        <StreamBadge state={live} />
      </div>
      <div class="cols">
        <div>
          <ErrorText error={error} />
          {!agents && !error && <Loading what="agents" />}
          {agents && agents.length === 0 && <p class="muted">No agents yet.</p>}
          {agents && agents.length > 0 && (
            <ul class="list">
              {agents.map((a) => (
                <AgentRow key={a.id} agent={a} owner={role === 'owner'} onDeleted={() => remove(a.id)} />
              ))}
            </ul>
          )}
        </div>
        <CreateAgent role={role} onCreated={upsert} />
      </div>
    </section>
  );
}

function AgentRow({ agent: a, owner, onDeleted }: { agent: Agent; owner: boolean; onDeleted: () => void }) {
  const [confirm, setConfirm] = useState(false);
  const [error, setError] = useState<string | null>(null);
  async function remove() {
    setError(null);
    try {
      await del('/v1/agents/' + seg(a.id));
      onDeleted();
    } catch (e) {
      setError(errorText(e));
      setConfirm(false);
    }
  }
  return (
    <li class="card" data-testid="agent-row">
      <div class="row-head">
        <a href={href('agents', a.id)} class="name">
          {a.name}
        </a>
        <span class="mono small">{a.model}</span>
        <span class="mono small muted" title="Agent id">
          {a.id}
        </span>
        <span class="grow" />
        {!confirm && owner && (
          <button type="button" class="small-btn" data-testid="agent-delete" onClick={() => setConfirm(true)}>
            Delete
          </button>
        )}
        {confirm && (
          <span class="confirm">
            Delete {a.name}?{' '}
            <button type="button" class="danger small-btn" data-testid="agent-delete-yes" onClick={remove}>
              Yes, delete
            </button>{' '}
            <button type="button" class="small-btn" data-testid="agent-delete-no" onClick={() => setConfirm(false)}>
              No
            </button>
          </span>
        )}
      </div>
      {a.tools.length > 0 && <p class="small muted">tools: {a.tools.join(', ')}</p>}
      <ErrorText error={error} />
    </li>
  );
}

function CreateAgent({ role, onCreated }: { role: string; onCreated: (a: Agent) => void }) {
  const [name, setName] = useState('');
  const [model, setModel] = useState('local');
  const [instructions, setInstructions] = useState('');
  const [tools, setTools] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  async function submit(e: Event) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const a = await post<Agent>('/v1/agents', {
        name: name.trim(),
        model: model.trim() || 'local',
        instructions,
        tools: parseTools(tools),
      });
      onCreated(a);
      setName('');
      setInstructions('');
      setTools('');
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  return (
    <form class="card form" onSubmit={submit} aria-labelledby="create-h">
      <h2 id="create-h">New agent</h2>
      {role !== 'owner' && <p class="muted small">Creating agents needs an owner token.</p>}
      <fieldset class="plain" disabled={role !== 'owner'}>
      <label for="agent-name">Name</label>
      <input
        id="agent-name"
        data-testid="agent-create-name"
        maxLength={100}
        value={name}
        onInput={(e) => setName(e.currentTarget.value)}
      />
      <label for="agent-model">Model</label>
      <input id="agent-model" data-testid="agent-create-model" value={model} onInput={(e) => setModel(e.currentTarget.value)} />
      <label for="agent-instructions">Instructions</label>
      <textarea
        id="agent-instructions"
        data-testid="agent-create-instructions"
        rows={4}
        value={instructions}
        onInput={(e) => setInstructions(e.currentTarget.value)}
      />
      <label for="agent-tools">Tools (comma-separated)</label>
      <input
        id="agent-tools"
        data-testid="agent-create-tools"
        placeholder="time.now, notes.append"
        value={tools}
        onInput={(e) => setTools(e.currentTarget.value)}
      />
      <button type="submit" class="primary" data-testid="agent-create-submit" disabled={busy}>
        Create agent
      </button>
      </fieldset>
      <ErrorText error={error} />
    </form>
  );
}
