// An agent's memory: search its long-term memories (the query language of docs/MEMORY.md), add
// and delete them, and edit its working memory. Live from the agent's memory events: a write
// elsewhere runs the search again.
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
  type Agent,
  type Memory,
  type Page,
  type WorkingMemory,
} from '../api';
import { ErrorText, Loading, StreamBadge, Time } from '../components';
import { byteLength, queryProblem } from '../checks';
import { href, hrefQuery, navigate } from '../router';
import { useCoalesce, useStream } from '../stream';
import { parseTools as parseList } from './Agents';

const SEARCH_LIMIT = 50; // a search returns at most 100
const PAGE = 50;
const MAX_TEXT = 16384;

const MAX_TAG = 64;

// A tag's limits (docs/API.md section 18), checked here since a tag the server refuses makes the
// search a refused request; a query is judged by the server's own parser (GET /v1/memory-query).
function tagProblem(tag: string): string | null {
  const n = byteLength(tag);
  if (n > MAX_TAG) return `a tag is 1 to ${MAX_TAG} bytes, got ${n}`;
  if (/[\u0000-\u001f\u007f]/.test(tag)) return 'a tag may not hold control characters';
  return null;
}

export function MemoryPage({ agentId, role }: { agentId: string; role: string }) {
  const [agents, setAgents] = useState<Agent[] | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    getAll<Agent>('/v1/agents')
      .then(setAgents)
      .catch((e) => setError(errorText(e)));
  }, []);

  const agent = agentId || agents?.[0]?.id || '';
  const known = !agents || agents.some((a) => a.id === agent);
  return (
    <section aria-labelledby="memory-h">
      <div class="page-head">
        <h1 id="memory-h">Memory</h1>
      </div>
      <ErrorText error={error} />
      {!agents && !error && <Loading what="agents" />}
      {agents && agents.length === 0 && (
        <p class="muted">
          No agents yet. <a href="#/agents">Create one</a> first.
        </p>
      )}
      {agents && agents.length > 0 && (
        <div class="filters agent-pick">
          <div>
            <label for="memory-agent">Agent</label>
            <select
              id="memory-agent"
              data-testid="memory-agent"
              value={agent}
              onChange={(e) => navigate(hrefQuery(['memory'], { agent_id: e.currentTarget.value }))}
            >
              {!known && <option value={agent}>{agent}</option>}
              {agents.map((a) => (
                <option key={a.id} value={a.id}>
                  {a.name}
                </option>
              ))}
            </select>
          </div>
        </div>
      )}
      {agent && <AgentMemory key={agent} agentId={agent} role={role} />}
    </section>
  );
}

interface Search {
  q: string;
  tag: string;
}

function AgentMemory({ agentId, role }: { agentId: string; role: string }) {
  const [query, setQuery] = useState('');
  const [tag, setTag] = useState('');
  const [search, setSearch] = useState<Search>({ q: '', tag: '' });
  const [results, setResults] = useState<Memory[] | null>(null);
  const [cursor, setCursor] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [wmVersion, setWmVersion] = useState(0);
  const [typed, setTyped] = useState<string | null>(null);
  const coalesce = useCoalesce();

  // The query as it is typed, judged by the server's parser 300 ms after the last keystroke.
  useEffect(() => {
    const q = query.trim();
    setTyped(null);
    if (!q) return;
    let live = true;
    const timer = window.setTimeout(() => {
      queryProblem(q)
        .then((p) => live && setTyped(p))
        .catch(() => {});
    }, 300);
    return () => {
      live = false;
      clearTimeout(timer);
    };
  }, [query]);
  const seq = useRef(0);
  const shown = useRef(0);
  shown.current = results?.length ?? 0;

  // Runs `s`: a search (best first, with scores) when it has a query, else the newest memories.
  // `keep` re-reads as many as are shown (a live refresh); `from` reads the next page.
  async function run(s: Search, opts: { from?: string | null; keep?: boolean } = {}) {
    const n = ++seq.current;
    // A query or tag the server would refuse is explained without a refused request: the
    // server's parser judges the query first (an answer kept for the page's life).
    let problem = s.tag ? tagProblem(s.tag) : null;
    if (!problem && s.q) {
      try {
        problem = await queryProblem(s.q);
      } catch (e) {
        problem = errorText(e);
      }
      if (n !== seq.current) return;
    }
    if (problem) {
      setError(problem);
      if (!opts.keep) {
        setResults([]);
        setCursor(null);
      }
      return;
    }
    setBusy(true);
    try {
      let path: string;
      if (s.q) path = qs({ q: s.q, tag: s.tag, limit: SEARCH_LIMIT });
      else {
        const limit = opts.keep ? Math.min(500, Math.max(PAGE, shown.current)) : PAGE;
        path = qs({ tag: s.tag, limit, cursor: opts.from });
      }
      const p = await get<Page<Memory>>(`/v1/agents/${seg(agentId)}/memories` + path);
      if (n !== seq.current) return;
      setResults((prev) => (opts.from && prev ? [...prev, ...p.items] : p.items));
      setCursor(p.next_cursor);
      setError(null);
    } catch (e) {
      if (n !== seq.current) return;
      setError(errorText(e));
      if (!opts.keep) setResults([]);
      setCursor(null);
    } finally {
      if (n === seq.current) setBusy(false);
    }
  }

  useEffect(() => {
    run(search);
  }, []);

  const latest = useRef(search);
  latest.current = search;
  const refresh = () => coalesce('search', () => run(latest.current, { keep: true }));
  const live = useStream(
    { agent_id: agentId },
    {
      'memory.upserted@v1': refresh,
      'memory.deleted@v1': refresh,
      'working_memory.updated@v1': () => setWmVersion((v) => v + 1),
    },
  );

  function submit(e: Event) {
    e.preventDefault();
    const s = { q: query.trim(), tag: tag.trim() };
    setSearch(s);
    // What was shown belongs to the last search: it goes while this one is checked and run.
    setResults(null);
    setCursor(null);
    setError(null);
    run(s);
  }

  const writer = role === 'owner' || role === 'user';
  return (
    <>
      <p class="small">
        <a href={href('agents', agentId)}>The agent's page</a> · <StreamBadge state={live} />
      </p>
      <div class="cols">
        <div>
          <h2>Long-term memories</h2>
          <form class="card search-form" role="search" onSubmit={submit}>
            <div class="search-fields">
              <div class="grow-field">
                <label for="memory-query">Search</label>
                <input
                  id="memory-query"
                  data-testid="memory-query"
                  type="search"
                  maxLength={512}
                  placeholder='kafka "consumer lag" -staging'
                  value={query}
                  aria-describedby="memory-query-help memory-query-check"
                  aria-invalid={typed ? 'true' : 'false'}
                  onInput={(e) => setQuery(e.currentTarget.value)}
                />
              </div>
              <div>
                <label for="memory-tag">Tag</label>
                <input id="memory-tag" data-testid="memory-tag" maxLength={64} value={tag} onInput={(e) => setTag(e.currentTarget.value)} />
              </div>
            </div>
            <div id="memory-query-check" aria-live="polite">
              {typed && (
                <p class="error-text small" data-testid="memory-query-error">
                  {typed}
                </p>
              )}
            </div>
            <p id="memory-query-help" class="muted small help">
              Every word must occur; <code>"a phrase"</code>, <code>a OR b</code>, <code>-excluded</code>, <code>prefix*</code>. Empty: the
              newest memories.
            </p>
            <button type="submit" class="primary" data-testid="memory-search" disabled={busy}>
              Search
            </button>
          </form>
          <ErrorText error={error} />
          {!results && !error && <Loading what="memories" />}
          {results && (
            <p class="small muted" aria-live="polite">
              {search.q
                ? `${results.length} ${results.length === 1 ? 'memory matches' : 'memories match'}, best first.`
                : `${results.length} ${results.length === 1 ? 'memory' : 'memories'}${cursor ? ' so far' : ''}, newest first.`}
              {search.tag ? ` Tag: ${search.tag}.` : ''}
            </p>
          )}
          <ul class="list">
            {results?.map((m) => (
              <MemoryRow key={m.id} m={m} agentId={agentId} writer={writer} onDeleted={() => setResults((l) => l && l.filter((x) => x.id !== m.id))} />
            ))}
          </ul>
          {cursor && !search.q && (
            <button type="button" disabled={busy} onClick={() => run(search, { from: cursor })}>
              Load older memories
            </button>
          )}
        </div>
        <div>
          {!writer && <p class="muted small">Writing memories needs an owner or user token.</p>}
          <AddMemory agentId={agentId} writer={writer} onAdded={refresh} />
          <WorkingMemoryEditor agentId={agentId} writer={writer} version={wmVersion} />
        </div>
      </div>
    </>
  );
}

function MemoryRow({ m, agentId, writer, onDeleted }: { m: Memory; agentId: string; writer: boolean; onDeleted: () => void }) {
  const [confirm, setConfirm] = useState(false);
  const [error, setError] = useState<string | null>(null);
  async function remove() {
    setError(null);
    try {
      await del(`/v1/agents/${seg(agentId)}/memories/${seg(m.id)}`);
      onDeleted();
    } catch (e) {
      setError(errorText(e));
      setConfirm(false);
    }
  }
  return (
    <li class="card" data-testid="memory-row" data-id={m.id}>
      <div class="msg-text">{m.text}</div>
      <div class="row-head small">
        {m.tags.map((t) => (
          <span key={t} class="tag">
            {t}
          </span>
        ))}
        {typeof m.score === 'number' && <span class="muted">score {m.score.toPrecision(3)}</span>}
        <span class="muted">source {m.source}</span>
        <span class="muted">
          <Time t={m.updated_at} />
        </span>
        <span class="mono muted" title="Memory id">
          {m.id}
        </span>
        <span class="grow" />
        {!confirm && writer && (
          <button type="button" class="small-btn" data-testid="memory-delete" onClick={() => setConfirm(true)}>
            Delete
          </button>
        )}
        {confirm && (
          <span class="confirm">
            Delete this memory?{' '}
            <button type="button" class="danger small-btn" data-testid="memory-delete-yes" onClick={remove}>
              Yes, delete
            </button>{' '}
            <button type="button" class="small-btn" data-testid="memory-delete-no" onClick={() => setConfirm(false)}>
              No
            </button>
          </span>
        )}
      </div>
      <ErrorText error={error} />
    </li>
  );
}

function AddMemory({ agentId, writer, onAdded }: { agentId: string; writer: boolean; onAdded: () => void }) {
  const [text, setText] = useState('');
  const [tags, setTags] = useState('');
  const [id, setId] = useState('');
  const [source, setSource] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [done, setDone] = useState<string | null>(null);

  async function submit(e: Event) {
    e.preventDefault();
    setError(null);
    setDone(null);
    if (!text.trim()) return setError('Write the text to remember.');
    const body: Record<string, unknown> = { text, tags: parseList(tags) };
    if (id.trim()) body.id = id.trim();
    if (source.trim()) body.source = source.trim();
    setBusy(true);
    try {
      const m = await post<Memory>(`/v1/agents/${seg(agentId)}/memories`, body);
      setDone(`Saved memory ${m.id}.`);
      setText('');
      setTags('');
      setId('');
      onAdded();
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  const n = byteLength(text);
  return (
    <form class="card form" onSubmit={submit} aria-labelledby="memory-add-h">
      <h2 id="memory-add-h">Add a memory</h2>
      <label for="memory-add-text">Text</label>
      <textarea
        id="memory-add-text"
        data-testid="memory-add-text"
        rows={4}
        value={text}
        aria-describedby="memory-add-count"
        onInput={(e) => setText(e.currentTarget.value)}
      />
      <p id="memory-add-count" class={n > MAX_TEXT ? 'error-text small' : 'muted small'}>
        {n} of {MAX_TEXT} bytes
      </p>
      <label for="memory-add-tags">Tags (comma-separated, optional)</label>
      <input id="memory-add-tags" data-testid="memory-add-tags" placeholder="ops, infra" value={tags} onInput={(e) => setTags(e.currentTarget.value)} />
      <details class="fold">
        <summary>Id and source</summary>
        <label for="memory-add-id">Id (optional: the same id replaces that memory)</label>
        <input id="memory-add-id" data-testid="memory-add-id" class="mono" maxLength={128} value={id} onInput={(e) => setId(e.currentTarget.value)} />
        <label for="memory-add-source">Source (optional, default api)</label>
        <input id="memory-add-source" data-testid="memory-add-source" maxLength={32} value={source} onInput={(e) => setSource(e.currentTarget.value)} />
      </details>
      <button type="submit" class="primary" data-testid="memory-add-submit" disabled={busy || !writer}>
        Add memory
      </button>
      {done && (
        <p class="small muted" role="status">
          {done}
        </p>
      )}
      <ErrorText error={error} />
    </form>
  );
}

// The working memory: one text the model sees at the top of every prompt. `version` changes when
// it was written (working_memory.updated@v1): it is read again, unless the text here has unsaved
// changes, which are kept and the reader told.
function WorkingMemoryEditor({ agentId, writer, version }: { agentId: string; writer: boolean; version: number }) {
  const [wm, setWm] = useState<WorkingMemory | null>(null);
  const [text, setText] = useState('');
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [saved, setSaved] = useState(false);
  const [changedElsewhere, setChangedElsewhere] = useState(false);
  const dirty = wm !== null && text !== wm.text;
  const dirtyRef = useRef(dirty);
  dirtyRef.current = dirty;

  function read(force: boolean) {
    get<WorkingMemory>(`/v1/agents/${seg(agentId)}/working-memory`)
      .then((w) => {
        setWm(w);
        if (force || !dirtyRef.current) {
          setText(w.text);
          setChangedElsewhere(false);
        } else setChangedElsewhere(true);
      })
      .catch((e) => setError(errorText(e)));
  }

  useEffect(() => read(true), []);
  useEffect(() => {
    if (version > 0) read(false);
  }, [version]);

  async function save(e: Event) {
    e.preventDefault();
    setBusy(true);
    setError(null);
    setSaved(false);
    try {
      const w = await put<WorkingMemory>(`/v1/agents/${seg(agentId)}/working-memory`, { text });
      setWm(w);
      setText(w.text);
      setSaved(true);
      setChangedElsewhere(false);
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  const n = byteLength(text);
  return (
    <form class="card form" onSubmit={save} aria-labelledby="wm-h">
      <h2 id="wm-h">Working memory</h2>
      <p class="muted small">The model sees this text at the top of every prompt. Empty: none.</p>
      {!wm && !error && <Loading what="the working memory" />}
      <label for="working-memory">Text</label>
      <textarea
        id="working-memory"
        data-testid="working-memory"
        rows={8}
        value={text}
        disabled={!wm}
        aria-describedby="wm-info"
        onInput={(e) => {
          setText(e.currentTarget.value);
          setSaved(false);
        }}
      />
      <p id="wm-info" class={n > MAX_TEXT ? 'error-text small' : 'muted small'}>
        {n} of {MAX_TEXT} bytes
        {wm?.updated_at ? (
          <>
            {' '}
            · saved <Time t={wm.updated_at} />
          </>
        ) : (
          ' · never set'
        )}
        {dirty && ' · unsaved changes'}
      </p>
      {changedElsewhere && (
        <p class="notice small">
          It was changed elsewhere since you started editing.{' '}
          <button type="button" class="small-btn" onClick={() => read(true)}>
            Load that version
          </button>
        </p>
      )}
      <button type="submit" class="primary" data-testid="working-memory-save" disabled={busy || !wm || !writer}>
        Save
      </button>
      {saved && (
        <p class="small muted" role="status">
          Saved.
        </p>
      )}
      <ErrorText error={error} />
    </form>
  );
}
