-- The model router: each model call's usage, running totals per tenant (agent_id '') and
-- agent for each UTC day and month, budgets, and the response cache.
CREATE TABLE model_usage(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL,
  run_id TEXT NOT NULL, step_id TEXT NOT NULL, model TEXT NOT NULL,
  input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,
  saved_micros INTEGER NOT NULL, cached INTEGER NOT NULL, fallback INTEGER NOT NULL,
  created_at INTEGER NOT NULL);
CREATE INDEX model_usage_run ON model_usage(tenant_id, run_id);
CREATE TABLE usage_totals(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), agent_id TEXT NOT NULL, period TEXT NOT NULL,
  period_start INTEGER NOT NULL, calls INTEGER NOT NULL, cached_calls INTEGER NOT NULL,
  input_tokens INTEGER NOT NULL, output_tokens INTEGER NOT NULL, cost_micros INTEGER NOT NULL,
  saved_micros INTEGER NOT NULL, PRIMARY KEY(tenant_id, period, period_start, agent_id));
CREATE TABLE budgets(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), scope TEXT NOT NULL, period TEXT NOT NULL,
  limit_micros INTEGER NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  PRIMARY KEY(tenant_id, scope, period));
CREATE TABLE model_cache(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), cache_group TEXT NOT NULL, key TEXT NOT NULL,
  model TEXT NOT NULL, response TEXT NOT NULL, input_tokens INTEGER NOT NULL,
  output_tokens INTEGER NOT NULL, created_at INTEGER NOT NULL,
  PRIMARY KEY(tenant_id, cache_group, key));
CREATE INDEX model_cache_created ON model_cache(created_at);
