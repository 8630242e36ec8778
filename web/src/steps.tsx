// A run's steps: tool calls folded in <details>, and the run page's timeline rows.
import type { Step } from './api';
import { Json, Status, Time } from './components';
import { href } from './router';

export function ToolCall({ s }: { s: Step }) {
  const tool: string = s.input?.tool ?? s.tool_call?.tool ?? 'tool';
  const d = s.input?.decision;
  return (
    <details class="tool" data-testid="tool-call" data-status={s.status}>
      <summary>
        <span class="mono">{tool}</span> <Status s={s.status} />
        {d?.outcome && <span class="muted small"> {d.outcome}</span>}
      </summary>
      {d?.reason && (
        <p class="small">
          Decision: {String(d.outcome)}: {String(d.reason)}
        </p>
      )}
      {d?.approval_id && (
        <p class="small">
          <a href={href('approvals')}>Approvals</a>
        </p>
      )}
      <p class="label">Arguments</p>
      <Json value={s.input?.arguments ?? {}} label="Arguments" />
      {s.input?.amended_from !== undefined && (
        <>
          <p class="label">Arguments the model proposed</p>
          <Json value={s.input.amended_from} label="Proposed arguments" />
        </>
      )}
      <p class="label">Result</p>
      <Json value={s.output} label="Result" />
      {s.tool_call?.effect_class && <p class="small muted">effect class {s.tool_call.effect_class}</p>}
    </details>
  );
}

export function StepRow({ s }: { s: Step }) {
  return (
    <li class={'step step-' + s.kind} data-testid="step-row" data-kind={s.kind} data-status={s.status}>
      <div class="row-head">
        <strong>
          #{s.seq} {s.kind}
        </strong>
        <Status s={s.status} />
        {s.duration_ms != null && <span class="small muted">{s.duration_ms} ms</span>}
        <span class="small muted">
          <Time t={s.started_at} />
        </span>
      </div>
      {s.kind === 'model' && <ModelStep s={s} />}
      {s.kind === 'tool' && (
        <>
          {s.status === 'awaiting_approval' && (
            <p class="notice small">
              Waiting for a human: see <a href={href('approvals')}>Approvals</a>.
            </p>
          )}
          <ToolCall s={s} />
        </>
      )}
      {s.kind !== 'model' && s.kind !== 'tool' && (
        <details class="fold">
          <summary>Details</summary>
          <p class="label">Input</p>
          <Json value={s.input} />
          <p class="label">Output</p>
          <Json value={s.output} />
        </details>
      )}
    </li>
  );
}

function ModelStep({ s }: { s: Step }) {
  const out = s.output && typeof s.output === 'object' ? s.output : {};
  const usage = out.usage;
  const calls: { name?: string }[] = Array.isArray(out.tool_calls) ? out.tool_calls : [];
  return (
    <>
      <p class="small">
        model <span class="mono">{String(out.model ?? s.input?.model ?? '')}</span>
        {s.input?.messages != null && <> · {String(s.input.messages)} messages in context</>}
        {usage && (
          <>
            {' '}
            · tokens in {String(usage.input_tokens ?? 0)} / out {String(usage.output_tokens ?? 0)}
          </>
        )}
        {s.duration_ms != null && <> · latency {s.duration_ms} ms</>}
        {out.cached && <> · cached</>}
        {out.fallback && <> · fallback</>}
        {typeof out.cost_usd === 'number' && <> · ${out.cost_usd.toFixed(6)}</>}
      </p>
      {typeof out.text === 'string' && out.text && <div class="msg-text">{out.text}</div>}
      {calls.length > 0 && <p class="small">proposed: {calls.map((c) => c.name ?? '?').join(', ')}</p>}
      {out.error && <p class="error">{String(out.error)}</p>}
      {out.budget && <Json value={out.budget} label="Budget" />}
    </>
  );
}
