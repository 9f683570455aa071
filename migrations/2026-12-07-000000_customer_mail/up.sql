-- Confirmed addresses (issue #41). An account's email is confirmed by a
-- link before it may queue; `email_canonical` is the address as one person
-- (no +tag, no dots where the provider ignores them), and one person may
-- have one confirmed account. Unconfirmed accounts may share it: whoever
-- confirms first keeps it. The shop writes the canonical form itself
-- (`domain::canonical_email`); this fill mirrors it for accounts made before.
ALTER TABLE customers
    ADD COLUMN email_confirmed_at TIMESTAMPTZ NULL,
    ADD COLUMN email_canonical TEXT NULL;

UPDATE customers SET email_canonical =
    CASE WHEN split_part(lower(email), '@', 2) IN ('gmail.com', 'googlemail.com')
        THEN replace(split_part(split_part(lower(email), '@', 1), '+', 1), '.', '') || '@gmail.com'
        ELSE split_part(split_part(lower(email), '@', 1), '+', 1) || '@' || split_part(lower(email), '@', 2)
    END;

CREATE UNIQUE INDEX customers_one_confirmed_account_per_person
    ON customers (email_canonical) WHERE email_confirmed_at IS NOT NULL;

-- A confirmation is of one address: an account whose address changes
-- (however it is changed) must confirm the new one.
CREATE FUNCTION customers_unconfirm_changed_email() RETURNS trigger AS $$
BEGIN
    NEW.email_confirmed_at := NULL;
    RETURN NEW;
END
$$ LANGUAGE plpgsql;

CREATE TRIGGER customers_unconfirm_changed_email
    BEFORE UPDATE OF email ON customers
    FOR EACH ROW WHEN (OLD.email IS DISTINCT FROM NEW.email)
    EXECUTE FUNCTION customers_unconfirm_changed_email();

-- The customer's mail, written in the same transaction as the event it
-- reports and sent later by the mail job (`services::mail`). `event_key`
-- names the event, so a message is written once per event however often
-- its transaction's code runs; it also makes the Message-ID, so a resend
-- after a crash between the SMTP server's answer and `sent_at` carries
-- the same one. The payload holds the facts to render, never a secret:
-- the confirmation link is computed when the message is rendered.
CREATE TABLE mail_outbox (
    id BIGSERIAL PRIMARY KEY,
    event_key TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    customer_id BIGINT NOT NULL REFERENCES customers (id) ON DELETE CASCADE,
    payload JSONB NOT NULL DEFAULT '{}',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts INT NOT NULL DEFAULT 0,
    next_attempt_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A sender's lease on the row, so two instances never send it at once.
    claimed_until TIMESTAMPTZ NULL,
    sent_at TIMESTAMPTZ NULL,
    last_error TEXT NULL
);

-- The job's question: what is due and not sent, oldest first.
CREATE INDEX mail_outbox_due ON mail_outbox (next_attempt_at) WHERE sent_at IS NULL;
-- The resend limit's question: this account's latest confirmation link.
CREATE INDEX mail_outbox_customer_kind ON mail_outbox (customer_id, kind, created_at);
