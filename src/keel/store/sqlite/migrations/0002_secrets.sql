-- Secrets (envelope encryption: a wrapped data key per tenant, sealed values).
CREATE TABLE tenant_keys(
  tenant_id TEXT PRIMARY KEY REFERENCES tenants(id), wrapped TEXT NOT NULL,
  kek_fingerprint TEXT NOT NULL, created_at INTEGER NOT NULL);
CREATE TABLE secrets(
  tenant_id TEXT NOT NULL REFERENCES tenants(id), name TEXT NOT NULL, sealed TEXT NOT NULL,
  created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL, PRIMARY KEY(tenant_id, name));
