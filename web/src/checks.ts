// Input checked as it is typed, by the server's own parsers: a cron expression and zone
// (GET /v1/cron/preview, which answers 200 with `error` for one it cannot take) and a memory
// search query (GET /v1/memory-query). The page has no grammar of its own, so what it says is
// exactly what a schedule or a search would be told. Only the routes' size limits are checked
// here, since a value over them is a refused request (400).
import {get, qs, type CronPreview, type QueryCheck} from './api';

const encoder = new TextEncoder();
export const byteLength = (s: string) => encoder.encode(s).length;

// /v1/cron/preview takes at most 256 bytes of `cron` and of `timezone`.
export const PREVIEW_MAX_BYTES = 256;

export function previewTooLong(cron: string, timezone: string): string|null {
  if (byteLength(cron) > PREVIEW_MAX_BYTES)
    return `The expression is longer than ${PREVIEW_MAX_BYTES} bytes.`;
  if (byteLength(timezone) > PREVIEW_MAX_BYTES)
    return `The time zone is longer than ${PREVIEW_MAX_BYTES} bytes.`;
  return null;
}

// The next `count` slots, or the parser's message in `error`.
export function cronPreview(cron: string, timezone: string, count = 5): Promise<CronPreview> {
  const tooLong = previewTooLong(cron, timezone);
  if (tooLong) return Promise.resolve({cron, timezone, slots: [], error: tooLong});
  return get<CronPreview>('/v1/cron/preview' + qs({cron, timezone, count}));
}

// A query's verdict never changes: kept for the page's life (the last 200).
const queries = new Map<string, Promise<QueryCheck>>();

// The server's message for a search query it would refuse, or null when it takes it.
export function queryProblem(q: string): Promise<string|null> {
  let p = queries.get(q);
  if (!p) {
    p = get<QueryCheck>('/v1/memory-query' + qs({q}));
    queries.set(q, p);
    p.catch(() => queries.delete(q));
    if (queries.size > 200) queries.delete(queries.keys().next().value!);
  }
  return p.then((r) => (r.valid ? null : r.error ?? 'the query is not valid'));
}
