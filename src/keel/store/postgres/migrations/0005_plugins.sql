-- Plugins registered per tenant, the agents they are enabled for ('*': all of the
-- tenant's), and the webhook deliveries they owe. Both go with their plugin.
CREATE TABLE plugins(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), id TEXT COLLATE "C" NOT NULL,
  name TEXT COLLATE "C" NOT NULL, version TEXT NOT NULL, kind TEXT COLLATE "C" NOT NULL,
  manifest TEXT NOT NULL, source TEXT NOT NULL, config TEXT NOT NULL,
  created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL, PRIMARY KEY(tenant_id, id));
CREATE TABLE agent_plugins(
  tenant_id TEXT COLLATE "C" NOT NULL, plugin_id TEXT COLLATE "C" NOT NULL,
  agent_id TEXT COLLATE "C" NOT NULL, created_at BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, plugin_id, agent_id),
  FOREIGN KEY(tenant_id, plugin_id) REFERENCES plugins(tenant_id, id) ON DELETE CASCADE);
CREATE INDEX agent_plugins_agent ON agent_plugins(tenant_id, agent_id);
CREATE TABLE plugin_deliveries(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL,
  plugin_id TEXT COLLATE "C" NOT NULL, agent_id TEXT COLLATE "C" NOT NULL,
  event_type TEXT COLLATE "C" NOT NULL, payload TEXT NOT NULL, status TEXT COLLATE "C" NOT NULL,
  attempts BIGINT NOT NULL, next_attempt_at BIGINT NOT NULL, last_status BIGINT NOT NULL,
  last_error TEXT NOT NULL, created_at BIGINT NOT NULL, delivered_at BIGINT,
  FOREIGN KEY(tenant_id, plugin_id) REFERENCES plugins(tenant_id, id) ON DELETE CASCADE);
CREATE INDEX plugin_deliveries_due ON plugin_deliveries(status, next_attempt_at);
CREATE INDEX plugin_deliveries_plugin ON plugin_deliveries(tenant_id, plugin_id, created_at, id);
ALTER TABLE plugins ENABLE ROW LEVEL SECURITY;
ALTER TABLE plugins FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON plugins
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE agent_plugins ENABLE ROW LEVEL SECURITY;
ALTER TABLE agent_plugins FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON agent_plugins
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE plugin_deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE plugin_deliveries FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON plugin_deliveries
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
