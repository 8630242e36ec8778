// Hash routing: the server serves index.html at `/` only, so every page lives after `#`.
import {useEffect, useState} from 'preact/hooks';

export interface Route {
  parts: string[];  // decoded path segments: "#/runs/ID" -> ["runs", "ID"]
  query: URLSearchParams;
}

export function parseHash(hash: string): Route {
  const raw = hash.replace(/^#\/?/, '');
  const q = raw.indexOf('?');
  const path = q < 0 ? raw : raw.slice(0, q);
  const parts = path.split('/').filter(Boolean).map((p) => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  });
  return {parts, query: new URLSearchParams(q < 0 ? '' : raw.slice(q + 1))};
}

export function useRoute(): Route {
  const [route, setRoute] = useState(() => parseHash(location.hash));
  useEffect(() => {
    const on = () => setRoute(parseHash(location.hash));
    window.addEventListener('hashchange', on);
    return () => window.removeEventListener('hashchange', on);
  }, []);
  return route;
}

// An in-app href: always starts with "#/", every segment percent-encoded.
export function href(...parts: string[]): string {
  return '#/' + parts.map(encodeURIComponent).join('/');
}

export function hrefQuery(parts: string[], q: Record<string, string>): string {
  const s = new URLSearchParams(Object.entries(q).filter(([, v]) => v)).toString();
  return href(...parts) + (s ? '?' + s : '');
}

export function navigate(to: string): void {
  location.hash = to.startsWith('#') ? to.slice(1) : to;
}
