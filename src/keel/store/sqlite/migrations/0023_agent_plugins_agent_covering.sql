-- An agent's plugin stamps (intake's read and the run's, each turn) are two lookups of this
-- index, the agent's own plugins and the tenant-wide ones ('*'), joined to plugins by id.
-- Without the plugin id in it, SQLite read the assignments through the primary key instead,
-- all of the tenant's.
DROP INDEX agent_plugins_agent;
CREATE INDEX agent_plugins_agent ON agent_plugins(tenant_id, agent_id, plugin_id);
