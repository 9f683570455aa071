DROP TRIGGER sessions_notify_inserted_revoked ON sessions;
DROP TRIGGER sessions_notify_revoked ON sessions;
DROP FUNCTION notify_session_revoked();
