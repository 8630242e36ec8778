// One run: the run object, its steps as a timeline, live text while it streams, and Cancel.
import { useEffect, useState } from 'preact/hooks';
import { errorText, get, isFinished, seg, type Page, type Run, type Step } from '../api';
import { ErrorText, IdLink, Json, Loading, Status, StreamBadge, Time, shortId } from '../components';
import { hrefQuery } from '../router';
import { StepRow } from '../steps';
import { RUN_EVENT_TYPES, useCoalesce, useStream, type Delta, type Handlers } from '../stream';
import { CancelButton } from './Runs';

export function RunPage({ id }: { id: string }) {
  const [run, setRun] = useState<Run | null>(null);
  const [steps, setSteps] = useState<Step[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [delta, setDelta] = useState('');
  const coalesce = useCoalesce();

  function refetch() {
    coalesce('run', () => {
      get<Run>('/v1/runs/' + seg(id))
        .then(setRun)
        .catch((e) => setError(errorText(e)));
      get<Page<Step>>(`/v1/runs/${seg(id)}/steps`)
        .then((p) => setSteps(p.items))
        .catch((e) => setError(errorText(e)));
    });
  }

  useEffect(refetch, [id]);

  const handlers: Handlers = {
    'message.delta': (d: Delta) => setDelta((t) => t + d.text),
    'tool.call.started@v1': refetch,
    'tool.call.completed@v1': refetch,
    'tool.call.denied@v1': refetch,
    'tool.call.unknown@v1': refetch,
    'approval.requested@v1': refetch,
    'approval.decided@v1': refetch,
    'message.created@v1': refetch,
  };
  for (const t of RUN_EVENT_TYPES) {
    handlers[t] = () => {
      if (t === 'run.started@v1' || t === 'run.step@v1' || t === 'run.completed@v1' || t === 'run.failed@v1' || t === 'run.cancelled@v1') setDelta('');
      refetch();
    };
  }
  const live = useStream({ run_id: id }, handlers);

  if (!run) {
    return (
      <section>
        <h1>Run</h1>
        <ErrorText error={error} />
        {!error && <Loading what="run" />}
      </section>
    );
  }
  return (
    <section aria-labelledby="run-h">
      <p class="crumbs">
        <a href="#/runs">Runs</a> /
      </p>
      <div class="page-head">
        <h1 id="run-h">
          Run <span class="mono">{shortId(run.id)}</span>
        </h1>
        <Status s={run.status} />
        <StreamBadge state={live} />
        {!isFinished(run.status) && <CancelButton run={run} onChange={setRun} />}
      </div>
      <ErrorText error={error} />
      <dl class="facts">
        <dt>id</dt>
        <dd class="mono">{run.id}</dd>
        <dt>agent</dt>
        <dd>
          <IdLink kind="agents" id={run.agent_id} />
        </dd>
        <dt>session</dt>
        <dd>
          <IdLink kind="sessions" id={run.session_id} />
        </dd>
        <dt>attempt</dt>
        <dd>{run.attempt}</dd>
        <dt>created</dt>
        <dd>
          <Time t={run.created_at} />
        </dd>
        <dt>started</dt>
        <dd>
          <Time t={run.started_at} />
        </dd>
        <dt>finished</dt>
        <dd>
          <Time t={run.finished_at} />
        </dd>
        {run.usage && (
          <>
            <dt>usage</dt>
            <dd>
              tokens in {run.usage.input_tokens ?? 0} / out {run.usage.output_tokens ?? 0}
              {run.usage.model_calls != null && <> · {run.usage.model_calls} model calls</>}
              {run.usage.cached_calls ? <> · {run.usage.cached_calls} cached</> : null}
              {typeof run.usage.cost_usd === 'number' && <> · ${run.usage.cost_usd.toFixed(6)}</>}
            </dd>
          </>
        )}
        {run.cancel_requested && (
          <>
            <dt>cancel</dt>
            <dd>requested</dd>
          </>
        )}
        <dt>events</dt>
        <dd>
          <a href={hrefQuery(['events'], { run_id: run.id })}>this run's events</a>
        </dd>
      </dl>
      {run.error && (
        <p class="error">
          {run.error.code}: {run.error.message}
        </p>
      )}
      {run.output != null && (
        <>
          <h2>Output</h2>
          {typeof run.output === 'string' ? <div class="msg-text card">{run.output}</div> : <Json value={run.output} label="Output" />}
        </>
      )}
      <h2>Steps</h2>
      {!steps && <Loading what="steps" />}
      {steps && steps.length === 0 && <p class="muted">No steps recorded yet.</p>}
      {steps && (
        <ol class="timeline">
          {steps.map((s) => (
            <StepRow key={s.id} s={s} />
          ))}
        </ol>
      )}
      {delta && (
        <div class="msg msg-assistant msg-live" data-testid="delta-live">
          <div class="msg-meta">
            <span class="who">model</span> <span class="muted">streaming…</span>
          </div>
          <div class="msg-text">{delta}</div>
        </div>
      )}
    </section>
  );
}
