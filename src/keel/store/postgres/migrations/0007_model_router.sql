-- The model router: each model call's usage, running totals per tenant (agent_id '') and
-- agent for each UTC day and month, budgets, and the response cache.
CREATE TABLE model_usage(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  agent_id TEXT COLLATE "C" NOT NULL, run_id TEXT COLLATE "C" NOT NULL,
  step_id TEXT COLLATE "C" NOT NULL, model TEXT COLLATE "C" NOT NULL,
  input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL, cost_micros BIGINT NOT NULL,
  saved_micros BIGINT NOT NULL, cached BIGINT NOT NULL, fallback BIGINT NOT NULL,
  created_at BIGINT NOT NULL);
CREATE INDEX model_usage_run ON model_usage(tenant_id, run_id);
CREATE TABLE usage_totals(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), agent_id TEXT COLLATE "C" NOT NULL,
  period TEXT COLLATE "C" NOT NULL, period_start BIGINT NOT NULL, calls BIGINT NOT NULL,
  cached_calls BIGINT NOT NULL, input_tokens BIGINT NOT NULL, output_tokens BIGINT NOT NULL,
  cost_micros BIGINT NOT NULL, saved_micros BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, period, period_start, agent_id));
CREATE TABLE budgets(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), scope TEXT COLLATE "C" NOT NULL,
  period TEXT COLLATE "C" NOT NULL, limit_micros BIGINT NOT NULL, created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL, PRIMARY KEY(tenant_id, scope, period));
CREATE TABLE model_cache(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  cache_group TEXT COLLATE "C" NOT NULL, key TEXT COLLATE "C" NOT NULL,
  model TEXT COLLATE "C" NOT NULL, response TEXT NOT NULL, input_tokens BIGINT NOT NULL,
  output_tokens BIGINT NOT NULL, created_at BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, cache_group, key));
CREATE INDEX model_cache_created ON model_cache(created_at);
ALTER TABLE model_usage ENABLE ROW LEVEL SECURITY;
ALTER TABLE model_usage FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON model_usage
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE usage_totals ENABLE ROW LEVEL SECURITY;
ALTER TABLE usage_totals FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON usage_totals
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE budgets ENABLE ROW LEVEL SECURITY;
ALTER TABLE budgets FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON budgets
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE model_cache ENABLE ROW LEVEL SECURITY;
ALTER TABLE model_cache FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON model_cache
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
