// One approval: its call, the policy's reason, and for a pending one the owner's actions.
import { useState } from 'preact/hooks';
import { errorText, post, seg, type Approval } from './api';
import { ErrorText, IdLink, Json, Status, Time, pretty, shortId } from './components';
import { validate, type SchemaError } from './schema';
import { useAgentTools, type AgentTools } from './tools';
import { isOwner, useWho } from './who';

export interface ArgumentCheck {
  value?: Record<string, unknown>;
  // Why the text cannot be sent: not JSON, or not an object.
  error?: string;
  // The tool's schema is still being read.
  waiting?: string;
  // Where the value does not match the tool's schema.
  problems: SchemaError[];
  // How it was checked, when not against the schema.
  note?: string;
}

// Checks the amended arguments: valid JSON, an object, and valid against the tool's `parameters`
// schema when the agent still offers the tool. Approve is enabled only when all of it holds.
export function checkArguments(text: string, tools: AgentTools, tool: string): ArgumentCheck {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    return { error: 'Arguments are not valid JSON: ' + errorText(e), problems: [] };
  }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) {
    return { error: 'Arguments must be a JSON object.', problems: [] };
  }
  const value = v as Record<string, unknown>;
  if (tools.state === 'loading') return { waiting: `Reading the schema of ${tool}…`, problems: [] };
  if (tools.state === 'error') {
    return { value, problems: [], note: `The tool's schema could not be read (${tools.error}): only checked that the arguments are a JSON object.` };
  }
  const t = tools.tools.find((x) => x.name === tool);
  if (!t) {
    return { value, problems: [], note: `The agent no longer offers ${tool} (removed since?): only checked that the arguments are a JSON object.` };
  }
  const problems = validate(t.parameters, value);
  return problems.length ? { problems } : { value, problems };
}

interface Props {
  approval: Approval;
  agentName?: string;
  showSession?: boolean;
  onDecided: (a: Approval) => void;
}

export function ApprovalCard({ approval: a, agentName, showSession = true, onDecided }: Props) {
  const original = pretty(a.arguments ?? {});
  const [reason, setReason] = useState('');
  const [amend, setAmend] = useState(original);
  const [standing, setStanding] = useState(false);
  const [standingSecs, setStandingSecs] = useState('3600');
  const [standingMatch, setStandingMatch] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const pending = a.status === 'pending';
  // Only an owner decides (the API answers a user 403): a user sees the call and why it waits.
  const owner = isOwner(useWho());
  const tools = useAgentTools(pending && owner ? a.agent_id : null);
  const checked = checkArguments(amend, tools, a.tool);
  const invalid = !checked.value;
  const secs = Number(standingSecs);
  const secsOk = Number.isInteger(secs) && secs >= 1 && secs <= 31536000;
  const idp = 'ap-' + a.id;

  async function decide(kind: 'approve' | 'reject') {
    setBusy(true);
    setError(null);
    try {
      const body: Record<string, unknown> = {};
      if (reason.trim()) body.reason = reason.trim();
      if (kind === 'approve' && checked.value) {
        if (JSON.stringify(checked.value) !== JSON.stringify(a.arguments)) body.arguments = checked.value;
        if (standing) {
          const s: Record<string, unknown> = { expires_in: secs };
          if (standingMatch) s.match = checked.value;
          body.standing = s;
        }
      }
      const out = await post<Approval>(`/v1/approvals/${seg(a.id)}/${kind}`, body);
      onDecided(out);
    } catch (e) {
      setError(errorText(e));
    } finally {
      setBusy(false);
    }
  }

  return (
    <article class="card approval" data-testid="approval-row" data-status={a.status} aria-label={'Approval for ' + a.tool}>
      <div class="row-head">
        <strong class="mono">{a.tool}</strong>
        <Status s={a.status} />
        <span class="muted">
          agent {agentName ?? ''} <IdLink kind="agents" id={a.agent_id} />
        </span>
        {showSession && (
          <span class="muted">
            session <IdLink kind="sessions" id={a.session_id} />
          </span>
        )}
        <span class="muted">
          run <IdLink kind="runs" id={a.run_id} />
        </span>
      </div>
      <p class="reason">{a.reason}</p>
      <p class="muted small">
        asked <Time t={a.created_at} />
        {pending ? (
          <>
            {' '}
            · expires <Time t={a.expires_at} />
          </>
        ) : (
          <>
            {' '}
            · decided <Time t={a.decided_at} /> by {a.decided_by === 'system' ? 'system' : shortId(a.decided_by)}
            {a.decision_reason ? ': ' + a.decision_reason : ''}
          </>
        )}
      </p>
      {!pending && (
        <>
          <Json value={a.arguments} label="Arguments" />
          {a.amended_arguments != null && (
            <>
              <p class="small">Amended to:</p>
              <Json value={a.amended_arguments} label="Amended arguments" />
            </>
          )}
        </>
      )}
      {pending && !owner && (
        <div class="decide">
          <p class="label">Arguments as proposed</p>
          <Json value={a.arguments} label="Arguments as proposed" />
          <p id={idp + '-owner'} class="notice small">
            Deciding needs an owner token: you can read this approval, not approve or reject it.
          </p>
          <div class="actions">
            <button type="button" class="primary" data-testid="approval-approve" disabled aria-describedby={idp + '-owner'}>
              Approve
            </button>
            <button type="button" class="danger" data-testid="approval-reject" disabled aria-describedby={idp + '-owner'}>
              Reject
            </button>
          </div>
        </div>
      )}
      {pending && owner && (
        <div class="decide">
          <p class="label">Arguments as proposed</p>
          <Json value={a.arguments} label="Arguments as proposed" />
          <label for={idp + '-args'}>Arguments (edit to approve with amended arguments)</label>
          <textarea
            id={idp + '-args'}
            data-testid="approval-amend"
            class="mono"
            rows={Math.min(12, original.split('\n').length + 1)}
            value={amend}
            spellcheck={false}
            aria-invalid={invalid ? 'true' : 'false'}
            aria-describedby={idp + '-check'}
            onInput={(e) => setAmend(e.currentTarget.value)}
          />
          <div id={idp + '-check'} class="arg-check" aria-live="polite">
            {checked.error && <p class="error">{checked.error}</p>}
            {checked.waiting && <p class="muted small">{checked.waiting}</p>}
            {checked.problems.length > 0 && (
              <div class="error" data-testid="approval-schema-errors">
                <p class="small">The arguments do not match the schema of {a.tool}:</p>
                <ul class="schema-errors">
                  {checked.problems.map((p, i) => (
                    <li key={i}>
                      <code>{p.path}</code> {p.message}
                    </li>
                  ))}
                </ul>
              </div>
            )}
            {checked.note && <p class="notice small">{checked.note}</p>}
          </div>
          <label for={idp + '-reason'}>Reason (optional; the model sees a rejection's reason)</label>
          <input
            id={idp + '-reason'}
            data-testid="approval-reason"
            type="text"
            maxLength={1000}
            value={reason}
            onInput={(e) => setReason(e.currentTarget.value)}
          />
          <div class="check">
            <input
              id={idp + '-standing'}
              data-testid="approval-standing"
              type="checkbox"
              checked={standing}
              onChange={(e) => setStanding(e.currentTarget.checked)}
            />
            <label for={idp + '-standing'}>Standing approval: let later {a.tool} calls of this agent through</label>
          </div>
          {standing && (
            <div class="standing">
              <label for={idp + '-secs'}>For how many seconds</label>
              <input
                id={idp + '-secs'}
                type="number"
                min={1}
                max={31536000}
                value={standingSecs}
                onInput={(e) => setStandingSecs(e.currentTarget.value)}
              />
              <div class="check">
                <input
                  id={idp + '-match'}
                  type="checkbox"
                  checked={standingMatch}
                  onChange={(e) => setStandingMatch(e.currentTarget.checked)}
                />
                <label for={idp + '-match'}>Only for these arguments</label>
              </div>
              {!secsOk && <ErrorText error="Seconds must be a whole number from 1 to 31536000." />}
            </div>
          )}
          <div class="actions">
            <button
              type="button"
              class="primary"
              data-testid="approval-approve"
              disabled={busy || invalid || (standing && !secsOk)}
              onClick={() => decide('approve')}
            >
              Approve
            </button>
            <button type="button" class="danger" data-testid="approval-reject" disabled={busy} onClick={() => decide('reject')}>
              Reject
            </button>
          </div>
          <ErrorText error={error} />
        </div>
      )}
    </article>
  );
}
