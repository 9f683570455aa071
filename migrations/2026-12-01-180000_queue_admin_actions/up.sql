-- Pausing and resuming a waiting room's admission are admin actions
-- (issue #16): logged like the others, and the latest of them is what a
-- queue rebuilt after Redis lost it must come back as.
ALTER TABLE admin_actions DROP CONSTRAINT admin_actions_action_check;
ALTER TABLE admin_actions ADD CONSTRAINT admin_actions_action_check
    CHECK (action IN ('refund', 'stock_adjust', 'gate_resync', 'sale_create', 'sale_edit',
                      'queue_pause', 'queue_resume'));
CREATE INDEX admin_actions_queue_state ON admin_actions (product_id, id DESC)
    WHERE action IN ('queue_pause', 'queue_resume');
