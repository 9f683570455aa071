-- Every shop process LISTENs on this channel, so a revocation reaches each
-- of them as its transaction commits, whoever wrote it (the shop, the
-- triggers on customers, an edit by hand) and however long it was open,
-- and no process needs to poll the table to learn of it. The payload is
-- the session's token digest and its expiry (microseconds since the epoch).
CREATE FUNCTION notify_session_revoked() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(
        'flashsale_session_revoked',
        encode(NEW.id_hash, 'hex') || ' ' ||
            (extract(epoch FROM NEW.expires_at) * 1000000)::bigint
    );
    RETURN NULL;
END
$$;
-- Not `UPDATE OF revoked_at`: a detached session is revoked by a BEFORE
-- trigger on an update of customer_id alone.
CREATE TRIGGER sessions_notify_revoked
    AFTER UPDATE ON sessions
    FOR EACH ROW
    WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION notify_session_revoked();
CREATE TRIGGER sessions_notify_inserted_revoked
    AFTER INSERT ON sessions
    FOR EACH ROW
    WHEN (NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION notify_session_revoked();
