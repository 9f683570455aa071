-- A message the mail server refused for good (a 5xx answer: no such
-- mailbox, a policy refusal) is not retried: retrying every minute for
-- ever would never deliver it. The admin's mail page shows the refusal.
ALTER TABLE mail_outbox ADD COLUMN refused_at TIMESTAMPTZ NULL;

DROP INDEX mail_outbox_due;
CREATE INDEX mail_outbox_due ON mail_outbox (next_attempt_at)
    WHERE sent_at IS NULL AND refused_at IS NULL;
