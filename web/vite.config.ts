// Build: `vite build` writes dist/ (or --outDir DIR). Dev: `vite` serves the sources and proxies
// /v1 (HTTP and the stream's WebSocket) to a running keel server (KEEL_DEV_URL, default
// http://127.0.0.1:7990), where the page signs in with its cookie as it does when the server
// serves it.
import {defineConfig} from 'vite';

const target = process.env.KEEL_DEV_URL ?? 'http://127.0.0.1:7990';
// The server refuses a cookie sent from another Origin: the proxied requests carry the
// server's own origin, as if the page were served by it.
const targetOrigin = new URL(target).origin;

export default defineConfig({
  oxc: {jsx: {runtime: 'automatic', importSource: 'preact'}},
  build: {
    modulePreload: {polyfill: false},
    target: 'es2022',
    assetsInlineLimit: 0,
  },
  server: {
    proxy: {
      '/v1': {
        target,
        changeOrigin: true,
        ws: true,
        headers: {origin: targetOrigin},
      },
    },
  },
});
