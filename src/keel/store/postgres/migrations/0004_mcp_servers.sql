-- MCP servers registered per tenant.
CREATE TABLE mcp_servers(
  id TEXT COLLATE "C" PRIMARY KEY, tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id),
  name TEXT COLLATE "C" NOT NULL, transport TEXT NOT NULL, config TEXT NOT NULL,
  created_at BIGINT NOT NULL, UNIQUE(tenant_id, name));
ALTER TABLE mcp_servers ENABLE ROW LEVEL SECURITY;
ALTER TABLE mcp_servers FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON mcp_servers
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
