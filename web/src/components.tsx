// Small shared pieces. Everything from the API is rendered as text.
import { Component, type ComponentChildren, type FunctionComponent } from 'preact';
import { href } from './router';

// A component that re-renders only when a prop changes (shallow), for long lists.
export function memo<P extends object>(fn: FunctionComponent<P>) {
  return class Memo extends Component<P> {
    shouldComponentUpdate(next: P): boolean {
      const a = this.props as Record<string, unknown>;
      const b = next as Record<string, unknown>;
      for (const k in a) if (a[k] !== b[k]) return true;
      for (const k in b) if (!(k in a)) return true;
      return false;
    }
    render(p: P) {
      return fn(p);
    }
  };
}

// Ids are UUIDv7: the leading characters are a timestamp, the last ones random.
export function shortId(id: string | null | undefined): string {
  return id ? id.slice(-8) : '';
}

export function ErrorText({ error }: { error: string | null | undefined }) {
  if (!error) return null;
  return (
    <p class="error" role="alert">
      {error}
    </p>
  );
}

export function Status({ s }: { s: string }) {
  return <span class={'status status-' + s.replace(/[^a-z_]/g, '')}>{s.replace(/_/g, ' ')}</span>;
}

// "2026-11-30T12:04:00.020Z" -> "2026-11-30 12:04:00"; cheap enough for long lists.
export function Time({ t }: { t: string | null | undefined }) {
  if (!t) return null;
  return (
    <time dateTime={t} title={t}>
      {t.slice(0, 10) + ' ' + t.slice(11, 19)}
    </time>
  );
}

export function pretty(value: unknown): string {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

export function Json({ value, label }: { value: unknown; label?: string }) {
  return (
    <pre class="json" aria-label={label}>
      {pretty(value)}
    </pre>
  );
}

export function Fold({ summary, children, testid }: { summary: ComponentChildren; children: ComponentChildren; testid?: string }) {
  return (
    <details class="fold" data-testid={testid}>
      <summary>{summary}</summary>
      {children}
    </details>
  );
}

// A link to an object page, showing the short id (the full id as its title).
export function IdLink({ kind, id }: { kind: 'agents' | 'sessions' | 'runs'; id: string | null | undefined }) {
  if (!id) return null;
  return (
    <a href={href(kind, id)} title={id} class="mono">
      {shortId(id)}
    </a>
  );
}

export function Loading({ what }: { what?: string }) {
  return <p class="muted">Loading{what ? ' ' + what : ''}…</p>;
}

export function StreamBadge({ state }: { state: string }) {
  return (
    <span class={'live live-' + state} title="Live updates">
      {state === 'live' ? 'live' : state}
    </span>
  );
}

// The browser's own IANA zone ("Europe/Berlin"), or UTC when it does not say.
export function localZone(): string {
  try {
    return Intl.DateTimeFormat().resolvedOptions().timeZone || 'UTC';
  } catch {
    return 'UTC';
  }
}

const formats = new Map<string, Intl.DateTimeFormat | null>();

// "Mon 2026-12-07 09:00" for an RFC 3339 time in an IANA zone (the browser's when none is
// given); null when the browser does not know the zone.
export function formatIn(iso: string, zone?: string): string | null {
  const key = zone ?? '';
  let f = formats.get(key);
  if (f === undefined) {
    try {
      f = new Intl.DateTimeFormat('en-GB', {
        timeZone: zone,
        weekday: 'short',
        year: 'numeric',
        month: '2-digit',
        day: '2-digit',
        hour: '2-digit',
        minute: '2-digit',
        hourCycle: 'h23',
      });
    } catch {
      f = null;
    }
    formats.set(key, f);
  }
  if (!f) return null;
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return null;
  const p: Record<string, string> = {};
  for (const part of f.formatToParts(d)) p[part.type] = part.value;
  return `${p.weekday} ${p.year}-${p.month}-${p.day} ${p.hour}:${p.minute}`;
}
