DROP TRIGGER sessions_revoke_detached ON sessions;
DROP FUNCTION revoke_detached_session();
DELETE FROM sessions WHERE customer_id IS NULL;
ALTER TABLE sessions DROP CONSTRAINT sessions_customer_id_fkey;
ALTER TABLE sessions ADD CONSTRAINT sessions_customer_id_fkey
    FOREIGN KEY (customer_id) REFERENCES customers (id) ON DELETE CASCADE;
ALTER TABLE sessions ALTER COLUMN customer_id SET NOT NULL;
DROP TRIGGER customers_revoke_sessions ON customers;
DROP FUNCTION revoke_sessions_of_changed_customer();
DROP INDEX sessions_revoked_at;
