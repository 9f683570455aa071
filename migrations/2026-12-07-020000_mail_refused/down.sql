DROP INDEX mail_outbox_due;
CREATE INDEX mail_outbox_due ON mail_outbox (next_attempt_at) WHERE sent_at IS NULL;
ALTER TABLE mail_outbox DROP COLUMN refused_at;
