// The fleet (the platform admin's): the nodes serving this store, which one leads, and the
// cluster's load, from /v1/nodes/stream (one snapshot a second, the JSON of GET /v1/nodes). The
// page keeps the last five minutes of snapshots in memory and plots turns per second (the
// difference of each node's runs_finished between snapshots), runs executing and runs queued.
import { useState } from 'preact/hooks';
import type { Fleet, FleetNode } from '../api';
import { StreamBadge, Time, shortId } from '../components';
import { LineChart, PALETTE, formatValue, type Series } from '../plot';
import { useSse } from '../stream';

const KEEP_MS = 5 * 60 * 1000;

interface Sample {
  t: number; // the snapshot's `at`, in ms
  fleet: Fleet;
  // turns per second of each node since the snapshot before (null: no earlier one, or it restarted)
  rates: Map<string, number | null>;
}

function rateOf(node: FleetNode, before: Sample | undefined, t: number): number | null {
  if (!before) return null;
  const prev = before.fleet.nodes.find((n) => n.origin === node.origin);
  const dt = (t - before.t) / 1000;
  if (!prev || dt <= 0 || prev.started_at !== node.started_at || node.runs_finished < prev.runs_finished) return null;
  return (node.runs_finished - prev.runs_finished) / dt;
}

function nodeName(n: FleetNode): string {
  return n.address || shortId(n.origin);
}

export function FleetPage() {
  const [samples, setSamples] = useState<Sample[]>([]);
  const [windowMs, setWindowMs] = useState(KEEP_MS);
  const live = useSse<Fleet>('/v1/nodes/stream', 'fleet', (fleet) => {
    const t = Date.parse(fleet.at);
    if (Number.isNaN(t)) return;
    setSamples((list) => {
      const before = list[list.length - 1];
      if (before && t <= before.t) return list; // a repeat
      const rates = new Map(fleet.nodes.map((n) => [n.origin, rateOf(n, before, t)] as [string, number | null]));
      const next = list.filter((s) => s.t >= t - KEEP_MS);
      next.push({ t, fleet, rates });
      return next;
    });
  });

  const last = samples[samples.length - 1];
  const to = last?.t ?? Date.now();
  const from = to - windowMs;
  const shown = samples.filter((s) => s.t >= from);
  const xs = shown.map((s) => s.t);

  // Every node seen in the window, in a stable order (by origin), with a colour each.
  const origins = new Map<string, FleetNode>();
  for (const s of shown) for (const n of s.fleet.nodes) origins.set(n.origin, n);
  const nodes = [...origins.values()].sort((a, b) => (a.origin < b.origin ? -1 : 1));
  const color = (i: number) => PALETTE[(i + 2) % PALETTE.length];
  const many = nodes.length > 1;

  const total: Series = {
    name: many ? 'all nodes' : nodes[0] ? nodeName(nodes[0]) : 'all nodes',
    color: PALETTE[0],
    values: shown.map((s) => {
      let sum = 0;
      let any = false;
      for (const v of s.rates.values())
        if (v !== null) {
          sum += v;
          any = true;
        }
      return any ? sum : null;
    }),
  };
  const turns: Series[] = [total];
  if (many)
    nodes.forEach((n, i) =>
      turns.push({ name: nodeName(n), color: color(i), values: shown.map((s) => s.rates.get(n.origin) ?? null) }),
    );
  const runs: Series[] = [
    { name: 'queued (all tenants)', color: PALETTE[1], values: shown.map((s) => s.fleet.runs_queued) },
    { name: many ? 'executing, all nodes' : 'executing', color: PALETTE[0], values: shown.map((s) => s.fleet.runs_executing) },
  ];
  if (many)
    nodes.forEach((n, i) =>
      runs.push({
        name: 'executing on ' + nodeName(n),
        color: color(i),
        values: shown.map((s) => s.fleet.nodes.find((x) => x.origin === n.origin)?.runs_executing ?? null),
      }),
    );

  const lastTotal = [...total.values].reverse().find((v) => v !== null) ?? null;
  const known = total.values.filter((v): v is number => v !== null);
  const mean = known.length ? known.reduce((a, b) => a + b, 0) / known.length : null;
  const minutes = windowMs / 60000;

  return (
    <section aria-labelledby="fleet-h">
      <div class="page-head">
        <h1 id="fleet-h">Fleet</h1>
        <StreamBadge state={live} />
      </div>
      <p class="muted small">
        Every tenant's load on the nodes that serve this store (those that reported in the last 10 s). Updated once a second; the plots
        hold what this page has seen since it opened, up to five minutes.
      </p>
      {!last && <p class="muted">Waiting for the first snapshot…</p>}
      {last && (
        <>
          <dl class="facts figures">
            <dt>Nodes</dt>
            <dd>{last.fleet.nodes.length}</dd>
            <dt>Runs queued</dt>
            <dd>{last.fleet.runs_queued}</dd>
            <dt>Runs executing</dt>
            <dd>{last.fleet.runs_executing}</dd>
            <dt>Turns per second</dt>
            <dd>
              {lastTotal === null ? '—' : formatValue(lastTotal, 'rate')}
              {mean !== null && <span class="muted"> (mean over the plot: {formatValue(mean, 'rate')})</span>}
            </dd>
            <dt>As of</dt>
            <dd>
              <Time t={last.fleet.at} /> UTC
            </dd>
          </dl>
          <h2 id="fleet-nodes-h">Nodes</h2>
          <div class="table-wrap">
            <table class="data" aria-labelledby="fleet-nodes-h">
              <thead>
                <tr>
                  <th scope="col">Node</th>
                  <th scope="col">Address</th>
                  <th scope="col">Role</th>
                  <th scope="col">Started</th>
                  <th scope="col">Last seen</th>
                  <th scope="col">Executing</th>
                  <th scope="col">Finished</th>
                  <th scope="col">Turns/s</th>
                </tr>
              </thead>
              <tbody>
                {last.fleet.nodes.map((n) => {
                  const rate = last.rates.get(n.origin) ?? null;
                  const ago = Math.max(0, Math.round((last.t - Date.parse(n.seen_at)) / 1000));
                  return (
                    <tr key={n.origin} data-testid="fleet-node" data-leader={n.leader ? 'true' : 'false'} data-this-node={n.this_node ? 'true' : 'false'}>
                      <th scope="row" class="mono" title={n.origin}>
                        {shortId(n.origin)}
                      </th>
                      <td class="mono">{n.address}</td>
                      <td>
                        {n.leader && <span class="badge badge-leader">leader</span>} {n.this_node && <span class="badge">this node</span>}
                        {!n.leader && !n.this_node && <span class="muted">—</span>}
                      </td>
                      <td>
                        <Time t={n.started_at} />
                      </td>
                      <td>
                        <Time t={n.seen_at} /> <span class="muted">({ago} s before)</span>
                      </td>
                      <td>{n.runs_executing}</td>
                      <td>{n.runs_finished}</td>
                      <td>{rate === null ? '—' : formatValue(rate, 'rate')}</td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
        </>
      )}
      <div class="filters narrow-filters">
        <div>
          <label for="fleet-window">Plot the last</label>
          <select id="fleet-window" data-testid="fleet-window" value={String(windowMs)} onChange={(e) => setWindowMs(Number(e.currentTarget.value))}>
            <option value={String(2 * 60000)}>2 minutes</option>
            <option value={String(5 * 60000)}>5 minutes</option>
          </select>
        </div>
      </div>
      <div class="plots">
        <LineChart
          id="fleet-turns"
          testid="fleet-plot-turns"
          title={`Turns per second, the last ${minutes} minutes`}
          xs={xs}
          from={from}
          to={to}
          series={turns}
          unit="rate"
          yTitle="turns/s"
          summary={
            `Runs finished per second, ${many ? 'for all nodes and for each node' : 'on the one node'}, from the difference of each node's finished runs between snapshots.` +
            (lastTotal !== null ? ` Now ${formatValue(lastTotal, 'rate')} per second` : '') +
            (mean !== null ? `, a mean of ${formatValue(mean, 'rate')}.` : '.')
          }
        />
        <LineChart
          id="fleet-runs"
          testid="fleet-plot-runs"
          title={`Runs executing and queued, the last ${minutes} minutes`}
          xs={xs}
          from={from}
          to={to}
          series={runs}
          unit="count"
          yTitle="runs"
          summary={last ? `Runs waiting for a node (every tenant's) and runs executing${many ? ', in all and on each node' : ''}. Now ${last.fleet.runs_queued} queued and ${last.fleet.runs_executing} executing.` : 'No snapshot yet.'}
        />
      </div>
    </section>
  );
}
