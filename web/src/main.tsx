import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { errorText, onUnauthorized, post, probeSession, setCsrf, type DashboardSession } from './api';
import { shortId } from './components';
import { useRoute } from './router';
import { SignIn } from './pages/SignIn';
import { Agents } from './pages/Agents';
import { AgentPage } from './pages/Agent';
import { SessionPage } from './pages/Session';
import { Approvals } from './pages/Approvals';
import { Runs } from './pages/Runs';
import { RunPage } from './pages/Run';
import { Events } from './pages/Events';
import { Schedules } from './pages/Schedules';
import { MemoryPage } from './pages/Memory';
import './style.css';

type Auth = { state: 'loading' } | { state: 'out'; message?: string } | { state: 'in'; session: DashboardSession };

function App() {
  const [auth, setAuth] = useState<Auth>({ state: 'loading' });

  useEffect(() => {
    onUnauthorized((message) => setAuth({ state: 'out', message }));
    // 200 {"signed_in": false} when signed out: a signed-out load has no failed request.
    probeSession()
      .then((s) => {
        if (!s) {
          setAuth({ state: 'out' });
          return;
        }
        setCsrf(s.csrf_token);
        setAuth({ state: 'in', session: s });
      })
      .catch((e) => {
        setCsrf(null);
        setAuth({ state: 'out', message: errorText(e) });
      });
  }, []);

  async function signOut() {
    try {
      await post('/v1/dashboard/sign-out', undefined, { quiet401: true });
    } catch {
      // Signed out either way: the page drops its state.
    }
    setCsrf(null);
    setAuth({ state: 'out' });
  }

  const signedIn = auth.state === 'in' ? auth.session : null;
  return (
    <>
      <header class="top">
        <div class="brand">
          <a href="#/agents">Keel</a>
        </div>
        {signedIn && <Nav role={signedIn.role} />}
        {signedIn && (
          <div class="account">
            <span title={signedIn.tenant_id}>
              tenant <span class="mono">{shortId(signedIn.tenant_id)}</span>
            </span>
            <span data-testid="role">{signedIn.role}</span>
            <button type="button" data-testid="signout" onClick={signOut}>
              Sign out
            </button>
          </div>
        )}
      </header>
      <main id="main">
        {auth.state === 'loading' && <p class="muted">Loading…</p>}
        {auth.state === 'out' && (
          <SignIn
            message={auth.message}
            onSignedIn={(s) => {
              setCsrf(s.csrf_token);
              setAuth({ state: 'in', session: s });
            }}
          />
        )}
        {signedIn && <Pages role={signedIn.role} />}
      </main>
    </>
  );
}

const NAV: [string, string, string][] = [
  ['agents', 'Agents', 'nav-agents'],
  ['runs', 'Runs', 'nav-runs'],
  ['approvals', 'Approvals', 'nav-approvals'],
  ['schedules', 'Schedules', 'nav-schedules'],
  ['memory', 'Memory', 'nav-memory'],
  ['events', 'Events', 'nav-events'],
];

// Pages a guest token may not read (the API answers 403): left out of a guest's navigation.
const MEMBERS_ONLY = new Set(['approvals', 'schedules']);

function Nav({ role }: { role: string }) {
  const route = useRoute();
  const top = route.parts[0] ?? 'agents';
  const section = top === 'sessions' ? 'agents' : top;
  return (
    <nav aria-label="Main">
      <ul>
        {NAV.filter(([path]) => role !== 'guest' || !MEMBERS_ONLY.has(path)).map(([path, label, testid]) => (
          <li key={path}>
            <a href={'#/' + path} data-testid={testid} aria-current={section === path ? 'page' : undefined}>
              {label}
            </a>
          </li>
        ))}
      </ul>
    </nav>
  );
}

function Pages({ role }: { role: string }) {
  const { parts, query } = useRoute();
  const [top, id] = parts;
  useEffect(() => window.scrollTo(0, 0), [top, id]);
  if (role === 'guest' && top && MEMBERS_ONLY.has(top)) return <MembersOnly />;
  switch (top) {
    case undefined:
    case 'agents':
      return id ? <AgentPage key={id} id={id} role={role} /> : <Agents role={role} />;
    case 'sessions':
      return id ? <SessionPage key={id} id={id} /> : <NotFound />;
    case 'approvals':
      return <Approvals />;
    case 'runs':
      return id ? <RunPage key={id} id={id} /> : <Runs />;
    case 'schedules':
      return <Schedules />;
    case 'memory':
      return <MemoryPage agentId={query.get('agent_id') ?? ''} role={role} />;
    case 'events':
      return <Events key={query.toString()} query={query} />;
    default:
      return <NotFound />;
  }
}

function MembersOnly() {
  return (
    <section>
      <h1>Not for guests</h1>
      <p>This page needs an owner or user token. Sign in with one to see it.</p>
    </section>
  );
}

function NotFound() {
  return (
    <section>
      <h1>Not found</h1>
      <p>
        No such page. <a href="#/agents">Go to the agents.</a>
      </p>
    </section>
  );
}

render(<App />, document.getElementById('app')!);
