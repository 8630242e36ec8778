-- MCP servers registered per tenant.
CREATE TABLE mcp_servers(
  id TEXT PRIMARY KEY, tenant_id TEXT NOT NULL REFERENCES tenants(id), name TEXT NOT NULL,
  transport TEXT NOT NULL, config TEXT NOT NULL, created_at INTEGER NOT NULL,
  UNIQUE(tenant_id, name));
