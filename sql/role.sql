-- outbox-relay: a least-privilege role for the relay. Run as a superuser (or a role that may
-- create roles and owns the outbox table), in the application's database, after the table
-- and the publication exist (sql/outbox.sql, or `outbox-relay setup --print-sql`: a DBA may
-- run its table and publication steps and leave the slot to the relay's `setup`).
--
-- Replace `outbox_relay`, `app` and `public.outbox` with your names (the role's
-- `outbox_relay`, not the state table's `outbox_relay_state`, which only begins like it).
-- Set the password separately, never in a file like this one: in psql, \password outbox_relay
--
-- What each privilege is for:
--   LOGIN REPLICATION            the replication connection; `setup` creates the slot and
--                                `teardown` drops it (both need REPLICATION)
--   CONNECT on the database      PUBLIC has it unless a DBA revoked it
--   USAGE on the schema          reaching the table
--   SELECT on the table          `status` (backlog), `resync`
--   DELETE on the table          the cleanup job of `run`
--   TEMPORARY on the database    `run --shards`: its row-filter check renders the expected
--                                filter through a temporary table; PUBLIC has it by default
--   EXECUTE pg_logical_emit_message   `run`'s heartbeats; PUBLIC has it by default in
--                                PostgreSQL 15, the grant matters where a DBA revoked it
--                                (without it the relay warns and runs without heartbeats)
-- No INSERT, UPDATE, TRUNCATE or ownership: the relay never writes outbox rows in WAL mode.
-- (Polling mode, `outbox-relay poll`, also needs UPDATE (published_at) on the table.)
--
-- pg_hba.conf needs one line for it. Logical replication connections match the DATABASE NAME
-- like ordinary connections do; the `replication` keyword matches only physical replication.
-- So one line covers both of the relay's connections:
--
--   # TYPE  DATABASE  USER          ADDRESS       METHOD
--   host    app       outbox_relay  10.0.0.0/8    scram-sha-256
--
-- (scram-sha-256 keeps the password off the wire; the connection itself is not encrypted
-- unless it runs over TLS: see docs/security.md, "TLS").
--
-- What this role can still do (docs/security.md, "The least-privilege role"):
--   * REPLICATION lets it create its own logical slot with any output plugin and read every
--     change of every table in this database, not only the outbox. No grant narrows that:
--     guard its credentials like read access to the whole database.
--   * It cannot drop a publication a DBA owns: `outbox-relay teardown` drops the slot and
--     tells you to have the owner run DROP PUBLICATION.

CREATE ROLE outbox_relay LOGIN REPLICATION;

GRANT CONNECT ON DATABASE app TO outbox_relay;
GRANT USAGE ON SCHEMA public TO outbox_relay;
GRANT SELECT, DELETE ON TABLE public.outbox TO outbox_relay;
-- The relay's own state (the last acknowledged commit, kept for --on-slot-lost recreate),
-- created by `outbox-relay setup` / sql/outbox.sql; without it a recovery backfills the
-- whole table.
DO $$
BEGIN
    IF to_regclass('public.outbox_relay_state') IS NOT NULL THEN
        GRANT SELECT, INSERT, UPDATE ON TABLE public.outbox_relay_state TO outbox_relay;
    END IF;
END
$$;
-- The text overload is pg_logical_emit_message(boolean, text, text) up to PostgreSQL 16;
-- 17 added a fourth argument (flush boolean), so there it is (boolean, text, text, boolean).
DO $$
BEGIN
    EXECUTE format('GRANT EXECUTE ON FUNCTION pg_catalog.pg_logical_emit_message(%s) TO outbox_relay',
        CASE WHEN current_setting('server_version_num')::int >= 170000
            THEN 'boolean, text, text, boolean'
            ELSE 'boolean, text, text' END);
END
$$;
