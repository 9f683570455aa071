DROP INDEX admin_actions_queue_state;
DELETE FROM admin_actions WHERE action IN ('queue_pause', 'queue_resume');
ALTER TABLE admin_actions DROP CONSTRAINT admin_actions_action_check;
ALTER TABLE admin_actions ADD CONSTRAINT admin_actions_action_check
    CHECK (action IN ('refund', 'stock_adjust', 'gate_resync', 'sale_create', 'sale_edit'));
