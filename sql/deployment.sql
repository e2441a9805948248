-- database_identity --
-- What names a database whatever address reached it: its cluster's system identifier
-- (shared by the cluster's physical standbys, new after initdb or pg_upgrade) and its name.
SELECT system_identifier::text AS system_identifier, current_database() AS database FROM pg_control_system()
