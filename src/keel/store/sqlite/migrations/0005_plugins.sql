-- Plugins registered per tenant, the agents they are enabled for ('*': all of the
-- tenant's), and the webhook deliveries they owe. Both go with their plugin.
CREATE TABLE plugins(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), id TEXT NOT NULL, name TEXT NOT NULL,
  version TEXT NOT NULL, kind TEXT NOT NULL, manifest TEXT NOT NULL, source TEXT NOT NULL,
  config TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,
  PRIMARY KEY(tenant_id, id));
CREATE TABLE agent_plugins(
  tenant_id TEXT NOT NULL, plugin_id TEXT NOT NULL, agent_id TEXT NOT NULL,
  created_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, plugin_id, agent_id),
  FOREIGN KEY(tenant_id, plugin_id) REFERENCES plugins(tenant_id, id) ON DELETE CASCADE);
CREATE INDEX agent_plugins_agent ON agent_plugins(tenant_id, agent_id);
CREATE TABLE plugin_deliveries(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL, plugin_id TEXT NOT NULL, agent_id TEXT NOT NULL,
  event_type TEXT NOT NULL, payload TEXT NOT NULL, status TEXT NOT NULL,
  attempts INTEGER NOT NULL, next_attempt_at INTEGER NOT NULL, last_status INTEGER NOT NULL,
  last_error TEXT NOT NULL, created_at INTEGER NOT NULL, delivered_at INTEGER,
  FOREIGN KEY(tenant_id, plugin_id) REFERENCES plugins(tenant_id, id) ON DELETE CASCADE);
CREATE INDEX plugin_deliveries_due ON plugin_deliveries(status, next_attempt_at);
CREATE INDEX plugin_deliveries_plugin ON plugin_deliveries(tenant_id, plugin_id, created_at, id);
