-- What only the platform admin grants a tenant: host execution, unsandboxed stdio MCP.
ALTER TABLE tenants ADD COLUMN allow_host_exec BIGINT NOT NULL DEFAULT 0;
ALTER TABLE tenants ADD COLUMN allow_stdio_mcp BIGINT NOT NULL DEFAULT 0;
