// Plots as inline SVG built by Preact (no chart library, nothing the page's CSP refuses): bars by
// category (stacked when there are several series) and lines over time. Each plot is a
// <figure> with a caption, a legend, an <svg role="img"> named by its <title> and <desc>, and
// its figures as a table in a <details> for whoever does not see the drawing. The drawing is
// laid out in the pixels its box has (a ResizeObserver, not a timer), so its text stays legible
// at a phone's width.
import type { RefObject } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';

export interface Series {
  name: string;
  color: string;
  values: (number | null)[];
}

// Colours with at least 3:1 contrast against the white plot area.
export const PALETTE = ['#1d4ed8', '#c2410c', '#15803d', '#7e22ce', '#b91c1c', '#0f766e', '#a16207', '#be185d', '#4338ca', '#374151'];

const HEIGHT = 220;
const M = { top: 12, right: 14, bottom: 40, left: 62 };

function useWidth(initial = 640): [RefObject<HTMLDivElement>, number] {
  const ref = useRef<HTMLDivElement>(null);
  const [width, setWidth] = useState(initial);
  useEffect(() => {
    const el = ref.current;
    if (!el || typeof ResizeObserver === 'undefined') return;
    const ro = new ResizeObserver((entries) => {
      const w = Math.floor(entries[0].contentRect.width);
      if (w > 0) setWidth((old) => (Math.abs(old - w) >= 1 ? w : old));
    });
    ro.observe(el);
    return () => ro.disconnect();
  }, []);
  return [ref, Math.max(240, width)];
}

// A "nice" step (1, 2, 2.5 or 5 times a power of ten) giving about `ticks` intervals up to max.
function niceScale(max: number, ticks = 4): { top: number; step: number } {
  if (!(max > 0)) return { top: 1, step: 0.25 };
  const raw = max / ticks;
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / p;
  const step = (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  return { top: Math.ceil(max / step - 1e-9) * step, step };
}

export type Unit = 'tokens' | 'usd' | 'count' | 'rate';

// A number as a reader wants it: 1.2k tokens, $0.0042, 3.5/s.
export function formatValue(v: number, unit: Unit): string {
  if (unit === 'usd') return formatUsd(v);
  if (unit === 'rate') return (v >= 10 ? v.toFixed(0) : v >= 1 ? v.toFixed(1) : v.toFixed(2)).replace(/\.0+$/, '');
  return compact(v);
}

export function compact(v: number): string {
  const a = Math.abs(v);
  if (a >= 1e9) return trim(v / 1e9) + 'G';
  if (a >= 1e6) return trim(v / 1e6) + 'M';
  if (a >= 1e4) return trim(v / 1e3) + 'k';
  return Number.isInteger(v) ? String(v) : trim(v);
}

function trim(v: number): string {
  return v.toFixed(Math.abs(v) >= 100 ? 0 : 1).replace(/\.0$/, '');
}

export function formatUsd(v: number): string {
  if (v === 0) return '$0';
  const a = Math.abs(v);
  if (a >= 100) return '$' + v.toFixed(0);
  if (a >= 1) return '$' + v.toFixed(2);
  // Small amounts (a model call costs fractions of a cent): two significant digits.
  return '$' + Number(v.toPrecision(2)).toString();
}

// The decimals that show every multiple of `step` exactly (0.25 -> 2, 5 -> 0).
function decimalsOf(step: number): number {
  for (let d = 0; d < 10; d++) {
    const scaled = step * Math.pow(10, d);
    if (Math.abs(scaled - Math.round(scaled)) < 1e-6 * scaled) return d;
  }
  return 10;
}

// Tick labels at the step's precision, so that 0.25 and 0.5 do not both print as 0.3.
function tickLabel(v: number, step: number, unit: Unit): string {
  if (unit === 'usd') return v === 0 ? '$0' : '$' + v.toFixed(decimalsOf(step));
  if (step < 1) return v.toFixed(decimalsOf(step));
  return compact(v);
}

function YAxis({ top, step, plotW, plotH, unit, title }: { top: number; step: number; plotW: number; plotH: number; unit: Unit; title: string }) {
  const ticks: number[] = [];
  for (let v = 0; v <= top + step / 2; v += step) ticks.push(v);
  return (
    <g class="axis">
      {ticks.map((v) => {
        const y = M.top + plotH - (v / top) * plotH;
        return (
          <g key={v}>
            <line x1={M.left} x2={M.left + plotW} y1={y} y2={y} class={v === 0 ? 'axis-line' : 'grid-line'} />
            <text x={M.left - 6} y={y + 4} text-anchor="end">
              {tickLabel(v, step, unit)}
            </text>
          </g>
        );
      })}
      <line x1={M.left} x2={M.left} y1={M.top} y2={M.top + plotH} class="axis-line" />
      <text class="axis-title" transform={`translate(12 ${M.top + plotH / 2}) rotate(-90)`} text-anchor="middle">
        {title}
      </text>
    </g>
  );
}

function Legend({ series }: { series: { name: string; color: string }[] }) {
  if (series.length < 2) return null;
  return (
    <ul class="legend">
      {series.map((s) => (
        <li key={s.name}>
          <svg width="12" height="12" aria-hidden="true" focusable="false">
            <rect width="12" height="12" rx="2" fill={s.color} />
          </svg>
          {s.name}
        </li>
      ))}
    </ul>
  );
}

// The figures as a table, built only while its <details> is open (a plot that changes every
// second does not rebuild a hidden table every second).
function DataTable({ caption, head, rows }: { caption: string; head: string[]; rows: () => string[][] }) {
  const [open, setOpen] = useState(false);
  return (
    <details class="plot-data" onToggle={(e) => setOpen((e.currentTarget as HTMLDetailsElement).open)}>
      <summary>The figures as a table</summary>
      {open && (
        <div class="table-wrap">
          <table class="data">
            <caption class="sr-only">{caption}</caption>
            <thead>
              <tr>
                {head.map((h, i) => (
                  <th key={i} scope="col">
                    {h}
                  </th>
                ))}
              </tr>
            </thead>
            <tbody>
              {rows().map((r, i) => (
                <tr key={i}>
                  {r.map((c, j) =>
                    j === 0 ? (
                      <th key={j} scope="row">
                        {c}
                      </th>
                    ) : (
                      <td key={j}>{c}</td>
                    ),
                  )}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
    </details>
  );
}

export interface BarChartProps {
  id: string;
  title: string;
  testid?: string;
  labels: string[]; // one per category, for the table and the axis
  axisLabels?: string[]; // shorter ones for the axis
  series: Series[]; // stacked in this order, bottom first
  unit: Unit;
  xTitle: string;
  yTitle: string;
  summary: string;
}

export function BarChart(p: BarChartProps) {
  const [ref, width] = useWidth();
  const n = p.labels.length;
  const plotW = width - M.left - M.right;
  const plotH = HEIGHT - M.top - M.bottom;
  const totals = p.labels.map((_, i) => p.series.reduce((sum, s) => sum + (s.values[i] ?? 0), 0));
  const { top, step } = niceScale(Math.max(0, ...totals));
  const band = n ? plotW / n : plotW;
  const barW = Math.max(1, Math.min(40, band * 0.72));
  const every = Math.max(1, Math.ceil(n / Math.max(1, Math.floor(plotW / 52))));
  const axis = p.axisLabels ?? p.labels;
  const tid = p.id + '-t';
  const did = p.id + '-d';
  return (
    <figure class="plot" data-testid={p.testid}>
      <figcaption>{p.title}</figcaption>
      <Legend series={p.series} />
      <div ref={ref} class="plot-box">
        <svg width={width} height={HEIGHT} viewBox={`0 0 ${width} ${HEIGHT}`} role="img" aria-labelledby={`${tid} ${did}`}>
          <title id={tid}>{p.title}</title>
          <desc id={did}>{p.summary}</desc>
          <rect x={M.left} y={M.top} width={plotW} height={plotH} class="plot-area" />
          <YAxis top={top} step={step} plotW={plotW} plotH={plotH} unit={p.unit} title={p.yTitle} />
          {p.labels.map((label, i) => {
            const x = M.left + i * band + (band - barW) / 2;
            let y0 = M.top + plotH;
            return (
              <g key={label}>
                {p.series.map((s) => {
                  const v = s.values[i] ?? 0;
                  if (v <= 0) return null;
                  const h = (v / top) * plotH;
                  y0 -= h;
                  return (
                    <rect key={s.name} x={x} y={y0} width={barW} height={Math.max(h, 0.5)} fill={s.color}>
                      <title>{`${label}: ${s.name} ${formatValue(v, p.unit)}`}</title>
                    </rect>
                  );
                })}
                {i % every === 0 && (
                  <text x={M.left + i * band + band / 2} y={M.top + plotH + 16} text-anchor="middle">
                    {axis[i]}
                  </text>
                )}
              </g>
            );
          })}
          <text class="axis-title" x={M.left + plotW / 2} y={HEIGHT - 4} text-anchor="middle">
            {p.xTitle}
          </text>
        </svg>
      </div>
      <DataTable
        caption={p.title}
        head={[p.xTitle, ...p.series.map((s) => s.name), ...(p.series.length > 1 ? ['total'] : [])]}
        rows={() =>
          p.labels.map((label, i) => [
            label,
            ...p.series.map((s) => formatValue(s.values[i] ?? 0, p.unit)),
            ...(p.series.length > 1 ? [formatValue(totals[i], p.unit)] : []),
          ])
        }
      />
    </figure>
  );
}

export interface LineChartProps {
  id: string;
  title: string;
  testid?: string;
  xs: number[]; // times (ms), one per point, ascending
  from: number; // the x axis' span (ms)
  to: number;
  series: Series[];
  unit: Unit;
  yTitle: string;
  summary: string;
}

function ago(ms: number): string {
  if (ms <= 500) return 'now';
  const s = Math.round(ms / 1000);
  return s % 60 === 0 ? `−${s / 60} min` : `−${s} s`;
}

export function LineChart(p: LineChartProps) {
  const [ref, width] = useWidth();
  const plotW = width - M.left - M.right;
  const plotH = HEIGHT - M.top - M.bottom;
  let max = 0;
  for (const s of p.series) for (const v of s.values) if (v !== null && v > max) max = v;
  const { top, step } = niceScale(max);
  const span = Math.max(1, p.to - p.from);
  const xOf = (t: number) => M.left + ((t - p.from) / span) * plotW;
  const yOf = (v: number) => M.top + plotH - (v / top) * plotH;
  const tickEvery = span > 150000 ? 60000 : 30000;
  const xTicks: number[] = [];
  for (let t = p.to; t >= p.from - 1; t -= tickEvery) xTicks.push(t);
  const tid = p.id + '-t';
  const did = p.id + '-d';
  return (
    <figure class="plot" data-testid={p.testid}>
      <figcaption>{p.title}</figcaption>
      <Legend series={p.series} />
      <div ref={ref} class="plot-box">
        <svg width={width} height={HEIGHT} viewBox={`0 0 ${width} ${HEIGHT}`} role="img" aria-labelledby={`${tid} ${did}`}>
          <title id={tid}>{p.title}</title>
          <desc id={did}>{p.summary}</desc>
          <rect x={M.left} y={M.top} width={plotW} height={plotH} class="plot-area" />
          <YAxis top={top} step={step} plotW={plotW} plotH={plotH} unit={p.unit} title={p.yTitle} />
          {xTicks.map((t) => (
            <g key={t} class="axis">
              <line x1={xOf(t)} x2={xOf(t)} y1={M.top + plotH} y2={M.top + plotH + 4} class="axis-line" />
              <text x={xOf(t)} y={M.top + plotH + 16} text-anchor={t === p.to ? 'end' : 'middle'}>
                {ago(p.to - t)}
              </text>
            </g>
          ))}
          {p.series.map((s) => {
            let d = '';
            let pen = false;
            s.values.forEach((v, i) => {
              const t = p.xs[i];
              if (v === null || t < p.from) {
                pen = false;
                return;
              }
              d += `${pen ? 'L' : 'M'}${xOf(t).toFixed(1)} ${yOf(v).toFixed(1)}`;
              pen = true;
            });
            return d ? <path key={s.name} d={d} fill="none" stroke={s.color} stroke-width="2" stroke-linejoin="round" /> : null;
          })}
          <text class="axis-title" x={M.left + plotW / 2} y={HEIGHT - 4} text-anchor="middle">
            time
          </text>
        </svg>
      </div>
      <DataTable
        caption={p.title}
        head={['time (UTC)', ...p.series.map((s) => s.name)]}
        rows={() =>
          p.xs
            .map((t, i) => [new Date(t).toISOString().slice(11, 19), ...p.series.map((s) => (s.values[i] === null ? '—' : formatValue(s.values[i]!, p.unit)))])
            .reverse()
        }
      />
    </figure>
  );
}

// How close a budget is: a bar of spent over limit, and the share as text beside it.
export function Gauge({ fraction, label }: { fraction: number; label: string }) {
  const f = Math.max(0, Math.min(1, fraction));
  const cls = fraction >= 1 ? 'gauge-over' : fraction >= 0.8 ? 'gauge-near' : 'gauge-ok';
  return (
    <svg class={'gauge ' + cls} viewBox="0 0 100 10" preserveAspectRatio="none" role="img" aria-label={label}>
      <rect class="gauge-track" x="0" y="0" width="100" height="10" rx="2" />
      <rect class="gauge-fill" x="0" y="0" width={100 * f} height="10" rx="2" />
    </svg>
  );
}
