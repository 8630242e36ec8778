-- A run's trigger: the schedule fire that posted its message, found by the run's id.
CREATE INDEX schedule_fires_run ON schedule_fires(tenant_id, run_id);
