// Live updates from /v1/stream. Most pages hold one EventSource: events arrive named by their
// type, so each type a page needs is subscribed with addEventListener, and the browser reconnects
// with Last-Event-ID itself. The event log, which shows every type, reads the same stream over a
// WebSocket instead (one JSON message per event), resuming with ?after= itself.
import {useEffect, useRef, useState} from 'preact/hooks';
import {probeSession, qs, signedOut, type KeelEvent, type Query} from './api';

export interface Delta {
  run_id: string;
  session_id: string|null;
  agent_id: string|null;
  text: string;
}

export type Handlers = {
  [type: string]: ((ev: any) => void)|undefined;
};

export const RUN_EVENT_TYPES = [
  'run.queued@v1',
  'run.started@v1',
  'run.step@v1',
  'run.waiting_for_approval@v1',
  'run.cancel_requested@v1',
  'run.completed@v1',
  'run.failed@v1',
  'run.cancelled@v1',
  'run.crashed@v1',
  'run.stalled@v1',
];

export type StreamState = 'connecting'|'live'|'reconnecting'|'closed';

// An EventSource's life as a page shows it: its state, its own reconnects, and once the browser
// gives up, signed out (the sign-in form) or a new EventSource 3 s later (`retry` bumped).
// Returns the effect's cleanup.
function follow(es: EventSource, setState: (s: StreamState) => void,
                setRetry: (f: (n: number) => number) => void): () => void {
  let timer = 0;
  setState('connecting');
  es.onopen = () => setState('live');
  es.onerror = () => {
    if (es.readyState !== EventSource.CLOSED) {
      setState('reconnecting');
      return;
    }
    setState('closed');
    probeSession()
        .then((signedIn) => {
          if (!signedIn)
            signedOut();
          else
            timer = window.setTimeout(() => setRetry((n) => n + 1), 3000);
        })
        .catch(() => {});
  };
  return () => {
    clearTimeout(timer);
    es.close();
  };
}

// Subscribes while `filter` is non-null; reconnects when the filter or the set of types changes.
// Handlers may change identity on every render: the latest ones are called. The browser retries a
// dropped connection by itself; a refused one (an HTTP error) is opened again here after a pause,
// from the last event seen, once the session probe says the browser is still signed in.
export function useStream(filter: Query|null, handlers: Handlers): StreamState {
  const ref = useRef(handlers);
  ref.current = handlers;
  const filterRef = useRef(filter);
  filterRef.current = filter;
  const lastId = useRef('');
  const [state, setState] = useState<StreamState>('connecting');
  const [retry, setRetry] = useState(0);
  const types = Object.keys(handlers).sort().join(',');
  const base = filter ? qs(filter) : null;
  useEffect(() => {
    lastId.current = '';
  }, [base]);
  useEffect(() => {
    if (base === null || !filterRef.current) return;
    const q = lastId.current ? {...filterRef.current, after: lastId.current} : filterRef.current;
    const es = new EventSource('/v1/stream' + qs(q));
    const stop = follow(es, setState, setRetry);
    for (const type of types.split(',')) {
      if (!type) continue;
      es.addEventListener(type, (m: MessageEvent) => {
        if (m.lastEventId) lastId.current = m.lastEventId;
        let data: KeelEvent|Delta;
        try {
          data = JSON.parse(m.data);
        } catch {
          return;
        }
        ref.current[type]?.(data);
      });
    }
    return stop;
  }, [base, types, retry]);
  return state;
}

// Coalesces calls per key within `ms`, so a burst of events re-fetches an object once; the
// last function given for a key is the one called.
export function useCoalesce(ms = 150): (key: string, fn: () => void) => void {
  const pending = useRef(new Map<string, {
    timer: number;
    fn: () => void
  }>());
  useEffect(() => () => pending.current.forEach((p) => clearTimeout(p.timer)), []);
  return (key, fn) => {
    const p = pending.current.get(key);
    if (p) {
      p.fn = fn;
      return;
    }
    const entry = {
      fn,
      timer: window.setTimeout(
          () => {
            pending.current.delete(key);
            entry.fn();
          },
          ms),
    };
    pending.current.set(key, entry);
  };
}

const BACKOFF_FIRST_MS = 1000;
const BACKOFF_MAX_MS = 10000;

// Follows the event log over a WebSocket on /v1/stream from position `after` (null: not yet),
// with the filter's agent_id / session_id / run_id. Every stored event goes to `onEvent` once, in
// order; token deltas are left out. A closed socket is opened again with ?after= the last
// position received, after 1 s, then 2, 4, 8, up to 10 s while it keeps failing; when the session
// probe says the browser is signed out, the page shows the sign-in form instead.
export function useEventSocket(
    filter: Query, after: number|null, onEvent: (ev: KeelEvent) => void): StreamState {
  const ref = useRef(onEvent);
  ref.current = onEvent;
  const [state, setState] = useState<StreamState>('connecting');
  const base = qs(filter);
  const filterRef = useRef(filter);
  filterRef.current = filter;
  useEffect(() => {
    if (after === null) return;
    let last = after;
    let delay = BACKOFF_FIRST_MS;
    let disposed = false;
    let timer = 0;
    let ws: WebSocket|null = null;

    function connect() {
      if (disposed) return;
      const scheme = location.protocol === 'https:' ? 'wss://' : 'ws://';
      const sock = new WebSocket(
          scheme + location.host + '/v1/stream' + qs({...filterRef.current, after: last}));
      ws = sock;
      let openedAt = 0;
      setState('connecting');
      sock.onopen = () => {
        openedAt = Date.now();
        setState('live');
      };
      sock.onmessage = (m: MessageEvent) => {
        if (typeof m.data !== 'string') return;
        let data: any;
        try {
          data = JSON.parse(m.data);
        } catch {
          return;
        }
        if (!data || typeof data.position !== 'number') return;  // a token delta
        if (data.position <= last) return;
        last = data.position;
        ref.current(data as KeelEvent);
      };
      sock.onclose = () => {
        if (disposed) return;
        ws = null;
        // A socket that stayed open a while starts the backoff over.
        if (openedAt && Date.now() - openedAt > BACKOFF_MAX_MS) delay = BACKOFF_FIRST_MS;
        setState('reconnecting');
        const again = () => {
          if (disposed) return;
          timer = window.setTimeout(connect, delay);
          delay = Math.min(delay * 2, BACKOFF_MAX_MS);
        };
        probeSession()
            .then((signedIn) => {
              if (disposed) return;
              if (!signedIn) {
                setState('closed');
                signedOut();
              } else
                again();
            })
            .catch(again);
      };
    }

    connect();
    return () => {
      disposed = true;
      clearTimeout(timer);
      const sock = ws;
      if (!sock) return;
      sock.onmessage = null;
      sock.onclose = null;
      // Closing a socket that is still connecting makes the browser log an error: close it
      // once it is open instead.
      if (sock.readyState === WebSocket.CONNECTING)
        sock.onopen = () => sock.close();
      else
        sock.close();
    };
  }, [base, after]);
  return state;
}

// Calls `fn` at most once every `ms`: the first call of a burst waits until `ms` has passed since
// the last run (at least `min`), and the calls that arrive meanwhile join it.
export function useThrottle(ms: number, min = 250): (fn: () => void) => void {
  const timer = useRef(0);
  const last = useRef(0);
  const latest = useRef<() => void>(() => {});
  useEffect(() => () => clearTimeout(timer.current), []);
  return (fn) => {
    latest.current = fn;
    if (timer.current) return;
    const wait = Math.max(min, last.current + ms - Date.now());
    timer.current = window.setTimeout(() => {
      timer.current = 0;
      last.current = Date.now();
      latest.current();
    }, wait);
  };
}

// One named event of a Server-Sent Events route other than /v1/stream (the fleet's
// /v1/nodes/stream), parsed as JSON. `url` null: not connected. A connection the server
// refuses is opened again after 3 s once the session probe says the browser is still signed in.
export function useSse<T>(url: string|null, event: string, onData: (data: T) => void): StreamState {
  const ref = useRef(onData);
  ref.current = onData;
  const [state, setState] = useState<StreamState>('connecting');
  const [retry, setRetry] = useState(0);
  useEffect(() => {
    if (!url) return;
    const es = new EventSource(url);
    const stop = follow(es, setState, setRetry);
    es.addEventListener(event, (m: MessageEvent) => {
      let data: T;
      try {
        data = JSON.parse(m.data);
      } catch {
        return;
      }
      ref.current(data);
    });
    return stop;
  }, [url, event, retry]);
  return state;
}
