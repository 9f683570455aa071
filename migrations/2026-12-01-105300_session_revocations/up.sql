-- Each shop process keeps the revoked sessions in memory and asks only for
-- those revoked since its last poll, a few times a second: that read must
-- not scan the table.
CREATE INDEX sessions_revoked_at ON sessions (revoked_at) WHERE revoked_at IS NOT NULL;

-- A session cookie is trusted on its own (with the revocation list), and it
-- carries a copy of the account. Whatever changes the copy's role or email,
-- from the shop or by hand, revokes the account's sessions, so no cookie
-- keeps the old role: its owner signs in again and gets the new one.
CREATE FUNCTION revoke_sessions_of_changed_customer() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE sessions SET revoked_at = now()
    WHERE customer_id = NEW.id AND revoked_at IS NULL;
    RETURN NULL;
END
$$;
CREATE TRIGGER customers_revoke_sessions
    AFTER UPDATE OF role, email ON customers
    FOR EACH ROW
    WHEN (OLD.role IS DISTINCT FROM NEW.role OR OLD.email IS DISTINCT FROM NEW.email)
    EXECUTE FUNCTION revoke_sessions_of_changed_customer();

-- A deleted account used to take its sessions with it (ON DELETE CASCADE),
-- and a deleted row is something a poller cannot see. Now its sessions stay,
-- detached and revoked, until they expire and are purged.
ALTER TABLE sessions ALTER COLUMN customer_id DROP NOT NULL;
ALTER TABLE sessions DROP CONSTRAINT sessions_customer_id_fkey;
ALTER TABLE sessions ADD CONSTRAINT sessions_customer_id_fkey
    FOREIGN KEY (customer_id) REFERENCES customers (id) ON DELETE SET NULL;

CREATE FUNCTION revoke_detached_session() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.revoked_at := now();
    RETURN NEW;
END
$$;
CREATE TRIGGER sessions_revoke_detached
    BEFORE UPDATE OF customer_id ON sessions
    FOR EACH ROW
    WHEN (NEW.customer_id IS NULL AND NEW.revoked_at IS NULL)
    EXECUTE FUNCTION revoke_detached_session();
