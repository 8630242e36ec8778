-- The audit chain (store/audit.h): each event's hash, each chain's signed head (tenant
-- data: row security as everywhere). Events from before it are hashed at the first start
-- (BackfillChains), which needs the key; keel_unhashed_tenants names their tenants.
DO $$ BEGIN EXECUTE format('SET LOCAL search_path = %I, pg_temp', current_schema()); END $$;
ALTER TABLE events ADD COLUMN hash TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX events_unhashed ON events(position) WHERE hash = '';
CREATE TABLE audit_heads(
  tenant_id TEXT COLLATE "C" NOT NULL, origin TEXT COLLATE "C" NOT NULL,
  last_id TEXT COLLATE "C" NOT NULL, last_seq BIGINT NOT NULL, hash TEXT COLLATE "C" NOT NULL,
  anchor TEXT COLLATE "C" NOT NULL, mac TEXT COLLATE "C" NOT NULL,
  PRIMARY KEY(tenant_id, origin));
ALTER TABLE audit_heads ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON audit_heads
  USING (tenant_id = current_setting('app.tenant_id', true))
  WITH CHECK (tenant_id = current_setting('app.tenant_id', true));
CREATE FUNCTION keel_unhashed_tenants() RETURNS TABLE(tenant_id text)
  LANGUAGE sql STABLE SECURITY DEFINER SET search_path FROM CURRENT
  AS 'SELECT DISTINCT tenant_id FROM events WHERE hash = ''''';
REVOKE ALL ON FUNCTION keel_unhashed_tenants() FROM PUBLIC;
