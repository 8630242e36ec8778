// Usage and budgets: tokens and cost per day (last 30) or month (last 12), for the tenant or one
// agent, as plots; the current period's totals per agent; the budgets with how much of each is
// spent, and for owners the form that sets, changes and deletes them. Live: a run that ends
// (run.completed@v1, run.failed@v1, run.cancelled@v1: each carries its usage) or a budget that
// changes reads the figures again, at most once every 2 s.
import { useEffect, useRef, useState } from 'preact/hooks';
import {
  del,
  errorText,
  get,
  getAll,
  put,
  qs,
  type Agent,
  type Budget,
  type Page,
  type UsageHistory,
  type UsageNow,
  type UsageTotals,
} from '../api';
import { ErrorText, Loading, StreamBadge, Time, shortId } from '../components';
import { BarChart, Gauge, PALETTE, compact, formatUsd } from '../plot';
import { href } from '../router';
import { useStream, useThrottle } from '../stream';
import { isOwner, useWho } from '../who';

type Period = 'day' | 'month';
const COUNT: Record<Period, number> = { day: 30, month: 12 };
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const ZERO: UsageTotals = { model_calls: 0, cached_calls: 0, input_tokens: 0, output_tokens: 0, cost_usd: 0, cache_savings_usd: 0 };
const MAX_LIMIT = 1_000_000_000;

function periodLabel(start: string, period: Period): string {
  return period === 'day' ? start.slice(0, 10) : start.slice(0, 7);
}
function axisLabel(start: string, period: Period): string {
  const m = MONTHS[Number(start.slice(5, 7)) - 1] ?? start.slice(5, 7);
  return period === 'day' ? `${m} ${Number(start.slice(8, 10))}` : m;
}

export function UsagePage() {
  const who = useWho();
  const owner = isOwner(who);
  const [period, setPeriod] = useState<Period>('day');
  const [scope, setScope] = useState(''); // '' the tenant, else an agent id
  const [agents, setAgents] = useState<Agent[]>([]);
  const [history, setHistory] = useState<UsageHistory | null>(null);
  const [now, setNow] = useState<UsageNow | null>(null);
  const [budgets, setBudgets] = useState<Budget[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [budgetError, setBudgetError] = useState<string | null>(null);
  const [edit, setEdit] = useState<{ scope: string; period: string; limit: string; n: number } | null>(null);
  const throttle = useThrottle(2000);
  const periodRef = useRef(period);
  periodRef.current = period;

  function readAgents() {
    getAll<Agent>('/v1/agents')
      .then(setAgents)
      .catch(() => {});
  }
  function readUsage() {
    const p = periodRef.current;
    Promise.all([get<UsageHistory>('/v1/usage/history' + qs({ period: p, count: COUNT[p] })), get<UsageNow>('/v1/usage' + qs({ period: p }))])
      .then(([h, n]) => {
        if (p !== periodRef.current) return; // switched meanwhile
        setHistory(h);
        setNow(n);
        setError(null);
      })
      .catch((e) => setError(errorText(e)));
  }
  function readBudgets() {
    if (!owner) return; // GET /v1/budgets is the owner's
    get<Page<Budget>>('/v1/budgets')
      .then((p) => {
        setBudgets(p.items);
        setBudgetError(null);
      })
      .catch((e) => setBudgetError(errorText(e)));
  }

  useEffect(() => {
    readAgents();
    readBudgets();
  }, []);
  useEffect(() => {
    setHistory(null);
    setNow(null);
    readUsage();
  }, [period]);

  const refresh = () =>
    throttle(() => {
      readUsage();
      readBudgets();
    });
  const live = useStream(
    {},
    {
      'run.completed@v1': refresh,
      'run.failed@v1': refresh,
      'run.cancelled@v1': refresh,
      'budget.set@v1': refresh,
      'budget.deleted@v1': refresh,
      'agent.created@v1': readAgents,
      'agent.updated@v1': readAgents,
    },
  );

  const names = new Map(agents.map((a) => [a.id, a.name]));
  const nameOf = (id: string) => names.get(id) ?? 'agent ' + shortId(id);
  // Agents that used something in the shown periods but are deleted now are listed by id.
  const scopes = new Map(agents.map((a) => [a.id, a.name]));
  for (const it of history?.items ?? []) for (const a of it.agents) if (!scopes.has(a.agent_id)) scopes.set(a.agent_id, nameOf(a.agent_id));

  return (
    <section aria-labelledby="usage-h">
      <div class="page-head">
        <h1 id="usage-h">Usage and budgets</h1>
        <StreamBadge state={live} />
      </div>
      <p class="muted small">Model usage in UTC days and months. Calls answered from the response cache count in calls and tokens, not in cost.</p>
      <div class="filters">
        <div>
          <label for="usage-period">Periods</label>
          <select id="usage-period" data-testid="usage-period" value={period} onChange={(e) => setPeriod(e.currentTarget.value === 'month' ? 'month' : 'day')}>
            <option value="day">days (the last 30)</option>
            <option value="month">months (the last 12)</option>
          </select>
        </div>
        <div>
          <label for="usage-agent">Whose usage</label>
          <select id="usage-agent" data-testid="usage-agent" value={scope} onChange={(e) => setScope(e.currentTarget.value)}>
            <option value="">the whole tenant</option>
            {[...scopes].map(([id, name]) => (
              <option key={id} value={id}>
                {name}
              </option>
            ))}
          </select>
        </div>
      </div>
      <ErrorText error={error} />
      {!history && !error && <Loading what="usage" />}
      {history && <Plots history={history} period={period} scope={scope} who={scope ? nameOf(scope) : 'the tenant'} />}
      {now && <NowTable now={now} period={period} nameOf={nameOf} />}

      <h2 id="budgets-h">Budgets</h2>
      {!owner && <p class="muted small">Budgets are shown to owners only: the API answers a {who.role} token 403 for them.</p>}
      {owner && (
        <div class="cols">
          <div>
            <ErrorText error={budgetError} />
            {!budgets && !budgetError && <Loading what="budgets" />}
            {budgets && budgets.length === 0 && <p class="muted">No budgets: runs are never stopped for cost.</p>}
            {budgets && budgets.length > 0 && (
              <ul class="list" aria-labelledby="budgets-h">
                {budgets.map((b) => (
                  <BudgetRow
                    key={b.scope + '/' + b.period}
                    b={b}
                    name={b.scope === 'tenant' ? 'the whole tenant' : nameOf(b.scope)}
                    onEdit={() => setEdit({ scope: b.scope, period: b.period, limit: String(b.limit_usd), n: Date.now() })}
                    onDeleted={() => setBudgets((l) => l && l.filter((x) => x !== b))}
                  />
                ))}
              </ul>
            )}
          </div>
          <BudgetForm
            key={edit ? String(edit.n) : 'new'}
            agents={agents}
            initial={edit}
            onSaved={(b) => {
              setBudgets((l) => {
                const rest = (l ?? []).filter((x) => !(x.scope === b.scope && x.period === b.period));
                return [...rest, b].sort((x, y) => (x.scope + x.period < y.scope + y.period ? -1 : 1));
              });
            }}
          />
        </div>
      )}
    </section>
  );
}

function Plots({ history, period, scope, who }: { history: UsageHistory; period: Period; scope: string; who: string }) {
  const items = history.items;
  const totals = items.map((it) => (scope ? it.agents.find((a) => a.agent_id === scope) ?? ZERO : it.tenant));
  const labels = items.map((it) => periodLabel(it.period_start, period));
  const axis = items.map((it) => axisLabel(it.period_start, period));
  const unit = period === 'day' ? 'day' : 'month';
  const span = period === 'day' ? `the last ${items.length} days` : `the last ${items.length} months`;
  const input = totals.map((t) => t.input_tokens);
  const output = totals.map((t) => t.output_tokens);
  const cost = totals.map((t) => t.cost_usd);
  const sum = (xs: number[]) => xs.reduce((a, b) => a + b, 0);
  const peak = (xs: number[]) => xs.reduce((best, v, i) => (v > xs[best] ? i : best), 0);
  const tokensPeak = peak(totals.map((t) => t.input_tokens + t.output_tokens));
  const costPeak = peak(cost);
  return (
    <div class="plots">
      <BarChart
        id="usage-tokens"
        testid="usage-plot-tokens"
        title={`Tokens per ${unit}, ${who}, ${span}`}
        labels={labels}
        axisLabels={axis}
        series={[
          { name: 'input tokens', color: PALETTE[0], values: input },
          { name: 'output tokens', color: PALETTE[1], values: output },
        ]}
        unit="tokens"
        xTitle={unit + ' (UTC)'}
        yTitle="tokens"
        summary={
          `Stacked bars of input and output tokens per ${unit}. In all: ${compact(sum(input))} input and ${compact(sum(output))} output tokens.` +
          (sum(input) + sum(output) > 0 ? ` The most on ${labels[tokensPeak]}: ${compact(input[tokensPeak] + output[tokensPeak])}.` : '')
        }
      />
      <BarChart
        id="usage-cost"
        testid="usage-plot-cost"
        title={`Cost per ${unit} in USD, ${who}, ${span}`}
        labels={labels}
        axisLabels={axis}
        series={[{ name: 'cost', color: PALETTE[2], values: cost }]}
        unit="usd"
        xTitle={unit + ' (UTC)'}
        yTitle="USD"
        summary={`Bars of the cost per ${unit}. In all ${formatUsd(sum(cost))}.` + (sum(cost) > 0 ? ` The most on ${labels[costPeak]}: ${formatUsd(cost[costPeak])}.` : '')}
      />
    </div>
  );
}

function NowTable({ now, period, nameOf }: { now: UsageNow; period: Period; nameOf: (id: string) => string }) {
  const rows = [...now.agents].sort((a, b) => b.cost_usd - a.cost_usd || b.input_tokens + b.output_tokens - (a.input_tokens + a.output_tokens));
  const cells = (t: UsageTotals) => [
    <td key="c">{t.model_calls}</td>,
    <td key="k">{t.cached_calls}</td>,
    <td key="i">{t.input_tokens}</td>,
    <td key="o">{t.output_tokens}</td>,
    <td key="u">{formatUsd(t.cost_usd)}</td>,
    <td key="s">{formatUsd(t.cache_savings_usd)}</td>,
  ];
  return (
    <>
      <h2 id="usage-now-h">
        {period === 'day' ? 'Today' : 'This month'} by agent{' '}
        <span class="small muted">
          (since <Time t={now.period_start} /> UTC)
        </span>
      </h2>
      {rows.length === 0 && <p class="muted">No model calls yet in this {period}.</p>}
      <div class="table-wrap">
        <table class="data" aria-labelledby="usage-now-h">
          <thead>
            <tr>
              <th scope="col">Agent</th>
              <th scope="col">Model calls</th>
              <th scope="col">From cache</th>
              <th scope="col">Input tokens</th>
              <th scope="col">Output tokens</th>
              <th scope="col">Cost</th>
              <th scope="col">Cache savings</th>
            </tr>
          </thead>
          <tbody>
            {rows.map((a) => (
              <tr key={a.agent_id} data-testid="usage-agent-row">
                <th scope="row">
                  <a href={href('agents', a.agent_id)} title={a.agent_id}>
                    {nameOf(a.agent_id)}
                  </a>
                </th>
                {cells(a)}
              </tr>
            ))}
          </tbody>
          <tfoot>
            <tr>
              <th scope="row">Tenant total</th>
              {cells(now.tenant)}
            </tr>
          </tfoot>
        </table>
      </div>
    </>
  );
}

function BudgetRow({ b, name, onEdit, onDeleted }: { b: Budget; name: string; onEdit: () => void; onDeleted: () => void }) {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const fraction = b.limit_usd > 0 ? b.spent_usd / b.limit_usd : b.spent_usd > 0 ? 1 : 0;
  const pct = b.limit_usd > 0 ? Math.round(fraction * 1000) / 10 : b.spent_usd > 0 ? 100 : 0;
  async function remove() {
    setBusy(true);
    setError(null);
    try {
      await del('/v1/budgets' + qs({ scope: b.scope, period: b.period }));
      onDeleted();
    } catch (e) {
      setError(errorText(e));
      setBusy(false);
    }
  }
  const label = `${name}, ${b.period}: ${formatUsd(b.spent_usd)} of ${formatUsd(b.limit_usd)} spent (${pct}%)`;
  return (
    <li class="card" data-testid="budget-row" data-scope={b.scope} data-period={b.period}>
      <div class="row-head">
        <strong>{name}</strong>
        <span class="tag">{b.period === 'day' ? 'per day' : 'per month'}</span>
        <span class="grow" />
        <button type="button" class="small-btn" onClick={onEdit} aria-label={`Change the budget of ${name} per ${b.period}`}>
          Change
        </button>
        <button
          type="button"
          class="danger small-btn"
          data-testid="budget-delete"
          disabled={busy}
          onClick={remove}
          aria-label={`Delete the budget of ${name} per ${b.period}`}
        >
          Delete
        </button>
      </div>
      <div class="budget-line">
        <Gauge fraction={fraction} label={label} />
        <span class={fraction >= 1 ? 'error-text small' : 'small'}>
          {formatUsd(b.spent_usd)} of {formatUsd(b.limit_usd)} · {pct}%
        </span>
      </div>
      <p class="muted small">
        this {b.period} since <Time t={b.period_start} /> UTC{b.scope !== 'tenant' && <span class="mono"> · {b.scope}</span>}
      </p>
      <ErrorText error={error} />
    </li>
  );
}

function BudgetForm({
  agents,
  initial,
  onSaved,
}: {
  agents: Agent[];
  initial: { scope: string; period: string; limit: string } | null;
  onSaved: (b: Budget) => void;
}) {
  const [scope, setScope] = useState(initial?.scope ?? 'tenant');
  const [period, setPeriod] = useState(initial?.period ?? 'day');
  const [limit, setLimit] = useState(initial?.limit ?? '');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [done, setDone] = useState<string | null>(null);
  const known = scope === 'tenant' || agents.some((a) => a.id === scope);

  async function submit(e: Event) {
    e.preventDefault();
    setError(null);
    setDone(null);
    const usd = Number(limit);
    if (limit.trim() === '' || !Number.isFinite(usd) || usd < 0 || usd > MAX_LIMIT) {
      return setError(`The limit is a number of US dollars from 0 to ${MAX_LIMIT}.`);
    }
    setBusy(true);
    try {
      const b = await put<Budget>('/v1/budgets', { scope, period, limit_usd: usd });
      setDone(`Saved: ${formatUsd(b.limit_usd)} per ${b.period}.`);
      onSaved(b);
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  return (
    <form class="card form" onSubmit={submit} aria-labelledby="budget-form-h">
      <h3 id="budget-form-h">{initial ? 'Change a budget' : 'Set a budget'}</h3>
      <p class="muted small">A run stops before a model call that would cross a budget. Setting one that exists changes its limit.</p>
      <label for="budget-scope">For</label>
      <select id="budget-scope" data-testid="budget-scope" value={scope} onChange={(e) => setScope(e.currentTarget.value)}>
        <option value="tenant">the whole tenant</option>
        {!known && <option value={scope}>{scope}</option>}
        {agents.map((a) => (
          <option key={a.id} value={a.id}>
            agent {a.name}
          </option>
        ))}
      </select>
      <label for="budget-period">Period</label>
      <select id="budget-period" data-testid="budget-period" value={period} onChange={(e) => setPeriod(e.currentTarget.value)}>
        <option value="day">per UTC day</option>
        <option value="month">per UTC month</option>
      </select>
      <label for="budget-limit">Limit (USD)</label>
      <input
        id="budget-limit"
        data-testid="budget-limit"
        type="number"
        inputMode="decimal"
        min={0}
        max={MAX_LIMIT}
        step="any"
        value={limit}
        onInput={(e) => setLimit(e.currentTarget.value)}
      />
      <button type="submit" class="primary" data-testid="budget-save" disabled={busy}>
        Save budget
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
