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
import { UsagePage } from './pages/Usage';
import { FleetPage } from './pages/Fleet';
import { PluginsPage } from './pages/Plugins';
import { ChannelPage, ChannelsPage } from './pages/Channels';
import { WhoContext, type Who } from './who';
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
    // The pages (and their streams) go first: a stream still open when the sign-in ends would
    // be refused (401) as it reconnects.
    setAuth({ state: 'loading' });
    await new Promise((r) => setTimeout(r, 0));
    try {
      await post('/v1/dashboard/sign-out', undefined, { quiet401: true });
    } catch {
      // Signed out either way: the page drops its state.
    }
    setCsrf(null);
    setAuth({ state: 'out' });
  }

  const signedIn = auth.state === 'in' ? auth.session : null;
  const who: Who = { role: signedIn?.role ?? 'guest', platformAdmin: signedIn?.platform_admin === true };
  return (
    <WhoContext.Provider value={who}>
      <header class="top">
        <div class="brand">
          <a href="#/agents">Keel</a>
        </div>
        {signedIn && <Nav who={who} />}
        {signedIn && (
          <div class="account">
            <span title={signedIn.tenant_id}>
              tenant <span class="mono">{shortId(signedIn.tenant_id)}</span>
            </span>
            <span data-testid="role">{signedIn.role}</span>
            {who.platformAdmin && <span class="badge">platform admin</span>}
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
        {signedIn && <Pages who={who} />}
      </main>
    </WhoContext.Provider>
  );
}

const NAV: [string, string, string][] = [
  ['agents', 'Agents', 'nav-agents'],
  ['runs', 'Runs', 'nav-runs'],
  ['approvals', 'Approvals', 'nav-approvals'],
  ['schedules', 'Schedules', 'nav-schedules'],
  ['memory', 'Memory', 'nav-memory'],
  ['usage', 'Usage', 'nav-usage'],
  ['plugins', 'Plugins', 'nav-plugins'],
  ['channels', 'Channels', 'nav-channels'],
  ['events', 'Events', 'nav-events'],
  ['fleet', 'Fleet', 'nav-fleet'],
];

// Pages a guest token may not read (the API answers 403): left out of a guest's navigation.
const MEMBERS_ONLY = new Set(['approvals', 'schedules', 'usage', 'plugins', 'channels']);
// The fleet shows every tenant's load: the platform admin's alone.
const ADMIN_ONLY = new Set(['fleet']);

function allowed(path: string, who: Who): boolean {
  if (ADMIN_ONLY.has(path)) return who.platformAdmin;
  if (MEMBERS_ONLY.has(path)) return who.role !== 'guest';
  return true;
}

function Nav({ who }: { who: Who }) {
  const route = useRoute();
  const top = route.parts[0] ?? 'agents';
  const section = top === 'sessions' ? 'agents' : top;
  return (
    <nav aria-label="Main">
      <ul>
        {NAV.filter(([path]) => allowed(path, who)).map(([path, label, testid]) => (
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

function Pages({ who }: { who: Who }) {
  const { parts, query } = useRoute();
  const [top, id] = parts;
  const role = who.role;
  useEffect(() => window.scrollTo(0, 0), [top, id]);
  if (top && ADMIN_ONLY.has(top) && !who.platformAdmin) return <AdminOnly />;
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
    case 'usage':
      return <UsagePage />;
    case 'plugins':
      return <PluginsPage />;
    case 'channels':
      return id ? <ChannelPage key={id} id={id} /> : <ChannelsPage />;
    case 'fleet':
      return <FleetPage />;
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

function AdminOnly() {
  return (
    <section>
      <h1>The platform admin's page</h1>
      <p>The fleet shows every tenant's load, so only the platform admin (an owner token of the first tenant) sees it.</p>
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
