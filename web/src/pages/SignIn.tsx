// Sign-in: the API token is sent once; the server answers with an HttpOnly session cookie.
import { useState } from 'preact/hooks';
import { errorText, post, type DashboardSession } from '../api';
import { ErrorText } from '../components';

export function SignIn({ message, onSignedIn }: { message?: string; onSignedIn: (s: DashboardSession) => void }) {
  const [token, setToken] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);

  async function submit(e: Event) {
    e.preventDefault();
    const t = token.trim();
    setToken('');
    if (!t) {
      setError('Enter an API token.');
      return;
    }
    setBusy(true);
    setError(null);
    try {
      const s = await post<DashboardSession>('/v1/dashboard/sign-in', { token: t }, { quiet401: true });
      onSignedIn(s);
    } catch (err) {
      setError(errorText(err));
    } finally {
      setBusy(false);
    }
  }

  return (
    <section class="signin" aria-labelledby="signin-h">
      <h1 id="signin-h">Sign in</h1>
      {message && <p class="notice">{message}</p>}
      <form onSubmit={submit} class="card">
        <label for="signin-token">API token</label>
        <input
          id="signin-token"
          data-testid="signin-token"
          type="password"
          autocomplete="off"
          spellcheck={false}
          placeholder="keel_…"
          value={token}
          onInput={(e) => setToken(e.currentTarget.value)}
        />
        <p class="muted small">The token is exchanged for a browser session and not kept by this page.</p>
        <button type="submit" class="primary" data-testid="signin-submit" disabled={busy}>
          Sign in
        </button>
        <ErrorText error={error} />
      </form>
    </section>
  );
}
