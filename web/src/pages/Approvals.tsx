// Approvals inbox: pending first (oldest first, as they expire), then the latest decided ones.
// Live from approval.* events, so a decision made elsewhere shows without reload.
import { useEffect, useState } from 'preact/hooks';
import { errorText, get, getAll, seg, type Agent, type Approval, type Page } from '../api';
import { ApprovalCard } from '../approval';
import { ErrorText, Loading, StreamBadge } from '../components';
import { useStream } from '../stream';
import { forgetAgentTools } from '../tools';

const RECENT = 50;

export function Approvals() {
  const [pending, setPending] = useState<Approval[] | null>(null);
  const [decided, setDecided] = useState<Approval[]>([]);
  const [agents, setAgents] = useState<Map<string, string>>(new Map());
  const [error, setError] = useState<string | null>(null);

  useEffect(() => {
    getAll<Approval>('/v1/approvals', { status: 'pending' })
      .then(setPending)
      .catch((e) => setError(errorText(e)));
    // The newest page (newest first): its latest decided ones.
    get<Page<Approval>>('/v1/approvals?order=desc&limit=500')
      .then((page) => setDecided(page.items.filter((a) => a.status !== 'pending').slice(0, RECENT)))
      .catch(() => {});
    getAll<Agent>('/v1/agents')
      .then((list) => setAgents(new Map(list.map((a) => [a.id, a.name]))))
      .catch(() => {});
  }, []);

  function place(a: Approval) {
    if (a.status === 'pending') {
      setPending((l) => (l && !l.some((x) => x.id === a.id) ? [...l, a] : l));
    } else {
      setPending((l) => l && l.filter((x) => x.id !== a.id));
      setDecided((l) => [a, ...l.filter((x) => x.id !== a.id)].slice(0, RECENT));
    }
  }

  function refetch(ev: { payload?: { approval_id?: string } }) {
    const id = ev.payload?.approval_id;
    if (!id) return;
    get<Approval>('/v1/approvals/' + seg(id))
      .then(place)
      .catch(() => {});
  }

  const live = useStream(
    {},
    {
      'approval.requested@v1': refetch,
      'approval.decided@v1': refetch,
      // The agent's tools (and so their schemas) may have changed.
      'agent.updated@v1': (ev: { agent_id?: string | null }) => ev.agent_id && forgetAgentTools(ev.agent_id),
    },
  );

  return (
    <section aria-labelledby="approvals-h">
      <div class="page-head">
        <h1 id="approvals-h">Approvals</h1>
        <StreamBadge state={live} />
      </div>
      <ErrorText error={error} />
      {!(error && !pending) && (
        <>
          <h2>Pending {pending ? `(${pending.length})` : ''}</h2>
          {!pending && <Loading what="approvals" />}
          {pending && pending.length === 0 && <p class="muted">Nothing waits for a decision.</p>}
          {pending?.map((a) => (
            <ApprovalCard key={a.id} approval={a} agentName={agents.get(a.agent_id)} onDecided={place} />
          ))}
          <h2>Recently decided</h2>
          {decided.length === 0 && <p class="muted">None yet.</p>}
          {decided.map((a) => (
            <ApprovalCard key={a.id + a.status} approval={a} agentName={agents.get(a.agent_id)} onDecided={place} />
          ))}
        </>
      )}
    </section>
  );
}
