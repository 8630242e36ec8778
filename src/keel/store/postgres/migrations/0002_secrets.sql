-- Secrets (envelope encryption: a wrapped data key per tenant, sealed values).
CREATE TABLE tenant_keys(
  tenant_id TEXT COLLATE "C" PRIMARY KEY REFERENCES tenants(id), wrapped TEXT NOT NULL,
  kek_fingerprint TEXT NOT NULL, created_at BIGINT NOT NULL);
CREATE TABLE secrets(
  tenant_id TEXT COLLATE "C" NOT NULL REFERENCES tenants(id), name TEXT COLLATE "C" NOT NULL,
  sealed TEXT NOT NULL, created_at BIGINT NOT NULL, updated_at BIGINT NOT NULL,
  PRIMARY KEY(tenant_id, name));
ALTER TABLE tenant_keys ENABLE ROW LEVEL SECURITY;
ALTER TABLE tenant_keys FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenant_keys
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
ALTER TABLE secrets ENABLE ROW LEVEL SECURITY;
ALTER TABLE secrets FORCE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON secrets
  USING (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on')
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true) OR current_setting('app.system', true) = 'on');
