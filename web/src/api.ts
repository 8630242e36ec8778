// Fetch wrapper for the Keel API: same-origin cookies, the CSRF header on writes, and one
// place that turns a 401 into "signed out".

export interface DashboardSession {
  signed_in: true;
  tenant_id: string;
  token_id: string;
  role: string;
  // Whether the token is the platform admin's (an owner of the first tenant): the fleet is theirs.
  platform_admin?: boolean;
  expires_at: string;
  csrf_token: string;
}

export interface Page<T> {
  items: T[];
  next_cursor: string|null;
}

export interface Agent {
  id: string;
  name: string;
  model: string;
  instructions: string;
  tools: string[];
  config: Record<string, unknown>;
  status: string;
  created_at: string;
  updated_at: string;
}

export interface Session {
  id: string;
  agent_id: string;
  status: string;
  title: string;
  description: string;
  instructions: string;
  created_at: string;
  updated_at: string;
}

export interface Message {
  id: string;
  session_id: string;
  role: string;
  content: string;
  run_id: string|null;
  created_at: string;
}

export interface Usage {
  input_tokens?: number;
  output_tokens?: number;
  model_calls?: number;
  cached_calls?: number;
  cost_usd?: number;
  cache_savings_usd?: number;
}

export interface Run {
  id: string;
  session_id: string;
  agent_id: string;
  message_id: string;
  status: string;
  attempt: number;
  output: unknown;
  error: {code: string; message: string}|null;
  usage: Usage|null;
  trigger?: unknown;
  cancel_requested: boolean;
  created_at: string;
  started_at: string|null;
  finished_at: string|null;
}

export interface Step {
  id: string;
  seq: number;
  kind: string;
  status: string;
  input: any;
  output: any;
  started_at: string|null;
  finished_at?: string|null;
  duration_ms?: number|null;
  tool_call?: {tool: string; effect_class: string; status: string; call_id: string};
}

export interface Approval {
  id: string;
  run_id: string;
  session_id: string;
  agent_id: string;
  call_id: string;
  tool: string;
  arguments: unknown;
  amended_arguments: unknown;
  reason: string;
  status: string;
  requested_by: string;
  decided_by: string|null;
  decision_reason: string|null;
  decided_at: string|null;
  expires_at: string;
  created_at: string;
}

export interface KeelEvent {
  position: number;
  id: string;
  type: string;
  agent_id: string|null;
  session_id: string|null;
  run_id: string|null;
  payload: any;
  occurred_at: string;
}

export interface Tool {
  name: string;
  description: string;
  parameters: unknown;
  rights: string[];
  effect_class: string;
}

export interface ScheduleFire {
  slot: string;
  fired_at: string|null;
  outcome: string;
  session_id: string|null;
  run_id: string|null;
  message_id: string|null;
  error: string|null;
}

export interface Schedule {
  id: string;
  agent_id: string;
  name: string;
  kind: 'cron'|'once'|string;
  cron: string|null;
  at: string|null;
  timezone: string;
  prompt: string;
  session_id: string|null;
  missed: string;
  status: string;
  suspended_reason: string|null;
  next_fire_at: string|null;
  last_fired_at: string|null;
  created_by: string;
  created_at: string;
  updated_at: string;
  recent_fires?: ScheduleFire[];
}

// 200 for any expression and zone: an invalid one has no slots and the parser's message.
export interface CronPreview {
  cron: string;
  timezone: string;
  slots: string[];
  error: string|null;
}

export interface QueryCheck {
  valid: boolean;
  error: string|null;
}

export interface UsageTotals {
  model_calls: number;
  cached_calls: number;
  input_tokens: number;
  output_tokens: number;
  cost_usd: number;
  cache_savings_usd: number;
}

export interface AgentUsage extends UsageTotals {
  agent_id: string;
}

export interface UsageNow {
  period: string;
  period_start: string;
  tenant: UsageTotals;
  agents: AgentUsage[];
}

export interface UsageHistory {
  period: string;
  items: {period_start: string; tenant: UsageTotals; agents: AgentUsage[]}[];
}

export interface Budget {
  scope: string;  // "tenant" or an agent id
  period: string;
  limit_usd: number;
  spent_usd: number;
  period_start: string;
  created_at: string;
  updated_at: string;
}

export interface FleetNode {
  origin: string;
  address: string;
  started_at: string;
  seen_at: string;
  runs_executing: number;
  runs_finished: number;
  leader: boolean;
  this_node: boolean;
}

export interface Fleet {
  at: string;
  leader: string|null;
  runs_queued: number;
  runs_executing: number;
  nodes: FleetNode[];
}

export interface Plugin {
  id: string;
  name: string;
  version: string;
  kind: string;
  manifest: {description?: string; events?: string[]; failure_mode?: string; [k: string]: unknown};
  config: unknown;
  enabled_for: string[];
  created_at: string;
  updated_at: string;
  source?: string;
}

export interface Delivery {
  id: string;
  plugin_id: string;
  agent_id: string|null;
  event: string;
  payload: unknown;
  status: string;
  attempts: number;
  next_attempt_at: string|null;
  last_status: number;
  last_error: string;
  created_at: string;
  delivered_at: string|null;
}

// A channel: one of an agent's doors besides the API (webhook, telegram, slack, discord).
// `status`: ready, disabled, or error with the reason in `error`.
export interface Channel {
  id: string;
  agent_id: string;
  kind: string;
  name: string;
  enabled: boolean;
  status: string;
  error: string;
  settings: Record<string, unknown>;
  url: string;  // "/v1/hooks/ID", or "" for a polled telegram channel
  created_by: string;
  created_at: string;
  updated_at: string;
}

// One entry of a channel's outbox: an answer, or an approval card.
export interface ChannelReply {
  id: string;
  channel_id: string;
  session_id: string;
  run_id: string;
  delivery_id: string;
  kind: 'answer'|'approval_card'|string;
  approval_id: string|null;
  user_id: string|null;
  // waiting, pending, sending, shown, sent, skipped, dead, unknown
  status: string;
  text: string;
  parts_sent: number;
  attempts: number;
  error: string;
  created_at: string;
  updated_at: string;
}

export interface McpTool {
  name: string;
  description: string;
  rights: string[];
  effect_class: string;
}

export interface McpServer {
  id: string;
  name: string;
  transport: string;
  command?: string[];
  url?: string;
  env?: Record<string, unknown>;
  headers?: Record<string, unknown>;
  timeout_ms?: number;
  created_at: string;
  status: string;
  error?: string;
  tools?: McpTool[];
}

export interface SkillSummary {
  name: string;
  description: string;
  hash: string;
  bytes: number;
  updated_at: string;
  assigned_to?: string[];
}

export interface Memory {
  id: string;
  agent_id: string;
  text: string;
  tags: string[];
  source: string;
  created_at: string;
  updated_at: string;
  score?: number;
}

export interface WorkingMemory {
  agent_id: string;
  text: string;
  updated_at: string|null;
}

export class ApiError extends Error {
  constructor(
      readonly status: number,
      readonly code: string,
      message: string,
  ) {
    super(message);
  }
}

// The CSRF token lives only in this variable: never in storage or cookies.
let csrf: string|null = null;
let unauthorized: (message: string) => void = () => {};

export function setCsrf(token: string|null): void {
  csrf = token;
}

export function onUnauthorized(fn: (message: string) => void): void {
  unauthorized = fn;
}

// Drops the CSRF token and shows the sign-in form.
export function signedOut(message = 'Your session has ended. Sign in again.'): void {
  csrf = null;
  unauthorized(message);
}

// The sign-in the cookie holds, or null when signed out (answered 200 either way).
export async function probeSession(): Promise<DashboardSession|null> {
  const s = await get<DashboardSession|{signed_in: false}|null>(
      '/v1/dashboard/session', {quiet401: true});
  return s && s.signed_in === true && s.csrf_token ? s : null;
}

export type Query = Record<string, string|number|undefined|null>;

export function qs(q: Query): string {
  const parts: string[] = [];
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined || v === null || v === '') continue;
    parts.push(encodeURIComponent(k) + '=' + encodeURIComponent(String(v)));
  }
  return parts.length ? '?' + parts.join('&') : '';
}

export function seg(id: string): string {
  return encodeURIComponent(id);
}

interface Options {
  headers?: Record<string, string>;
  // Sign-in answers 401 for a bad token as part of its contract: not a lost session.
  quiet401?: boolean;
}

export async function request<T>(
    method: string, path: string, body?: unknown, opts: Options = {}): Promise<T> {
  const headers: Record<string, string> = {Accept: 'application/json', ...opts.headers};
  if (method !== 'GET' && csrf) headers['X-Keel-CSRF'] = csrf;
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  let res: Response;
  try {
    res = await fetch(path, {
      method,
      headers,
      credentials: 'same-origin',
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch {
    throw new ApiError(0, 'network', 'the server could not be reached');
  }
  if (res.status === 204) return undefined as T;
  let data: any = null;
  const text = await res.text();
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = null;
    }
  }
  if (!res.ok) {
    const err = data && typeof data === 'object' && data.error ? data.error : null;
    const code = err && typeof err.code === 'string' ? err.code : 'http_' + res.status;
    const message = err && typeof err.message === 'string' ? err.message : `HTTP ${res.status}`;
    if (res.status === 401 && !opts.quiet401) signedOut();
    throw new ApiError(res.status, code, message);
  }
  return data as T;
}

export const get = <T>(path: string, opts?: Options) => request<T>('GET', path, undefined, opts);
export const post = <T>(path: string, body?: unknown, opts?: Options) =>
    request<T>('POST', path, body, opts);
export const patch = <T>(path: string, body: unknown) => request<T>('PATCH', path, body);
export const put = <T>(path: string, body: unknown) => request<T>('PUT', path, body);
export const del = (path: string) => request<void>('DELETE', path);

// Every item of a paginated list, following next_cursor.
export async function getAll<T>(path: string, q: Query = {}, max = Infinity): Promise<T[]> {
  const out: T[] = [];
  let cursor: string|null = null;
  do {
    const page: Page<T> = await get<Page<T>>(path + qs({...q, limit: 500, cursor}));
    out.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && out.length < max);
  return out;
}

export function errorText(e: unknown): string {
  if (e instanceof ApiError) return e.message;
  if (e instanceof Error) return e.message;
  return String(e);
}

export function isFinished(status: string): boolean {
  return status === 'done' || status === 'failed' || status === 'cancelled';
}

export function upsertRun(list: Run[], r: Run): Run[] {
  const i = list.findIndex((x) => x.id === r.id);
  if (i < 0) {
    // Ids are time-ordered: keep the newest first.
    const out = [...list, r];
    out.sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0));
    return out;
  }
  const out = list.slice();
  out[i] = {...list[i], ...r};
  return out;
}
