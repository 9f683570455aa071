DROP TABLE mail_outbox;
DROP TRIGGER customers_unconfirm_changed_email ON customers;
DROP FUNCTION customers_unconfirm_changed_email();
DROP INDEX customers_one_confirmed_account_per_person;
ALTER TABLE customers DROP COLUMN email_canonical, DROP COLUMN email_confirmed_at;
