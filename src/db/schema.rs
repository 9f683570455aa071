// @generated automatically by Diesel CLI.

diesel::table! {
    admin_actions (id) {
        id -> Int8,
        admin_id -> Int8,
        action -> Text,
        product_id -> Nullable<Int8>,
        order_id -> Nullable<Int8>,
        detail -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    customers (id) {
        id -> Int8,
        email -> Text,
        password_hash -> Text,
        role -> Text,
        created_at -> Timestamptz,
        email_confirmed_at -> Nullable<Timestamptz>,
        email_canonical -> Nullable<Text>,
    }
}

diesel::table! {
    deployment (singleton) {
        singleton -> Bool,
        redis_namespace -> Text,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    door_counts (door, event) {
        door -> Text,
        event -> Text,
        count -> Int8,
    }
}

diesel::table! {
    door_passes (id) {
        id -> Int8,
        door -> Text,
        client_ip -> Text,
        passed_at -> Timestamptz,
    }
}

diesel::table! {
    holdings (product_id, customer_id) {
        product_id -> Int8,
        customer_id -> Int8,
        units -> Int4,
        cap -> Nullable<Int4>,
    }
}

diesel::table! {
    idempotency_keys (customer_id, key) {
        customer_id -> Int8,
        key -> Text,
        fingerprint -> Text,
        response_status -> Nullable<Int2>,
        response_location -> Nullable<Text>,
        response_body -> Nullable<Text>,
        created_at -> Timestamptz,
        order_id -> Nullable<Int8>,
    }
}

diesel::table! {
    login_attempts (id) {
        id -> Int8,
        email -> Text,
        ip -> Text,
        attempted_at -> Timestamptz,
    }
}

diesel::table! {
    mail_outbox (id) {
        id -> Int8,
        event_key -> Text,
        kind -> Text,
        customer_id -> Int8,
        payload -> Jsonb,
        created_at -> Timestamptz,
        attempts -> Int4,
        next_attempt_at -> Timestamptz,
        claimed_until -> Nullable<Timestamptz>,
        sent_at -> Nullable<Timestamptz>,
        last_error -> Nullable<Text>,
        refused_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    order_items (id) {
        id -> Int8,
        order_id -> Int8,
        product_id -> Int8,
        quantity -> Int4,
        unit_price_cents -> Int8,
    }
}

diesel::table! {
    orders (id) {
        id -> Int8,
        customer_id -> Int8,
        status -> Text,
        total_cents -> Int8,
        payment_deadline -> Timestamptz,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        gate_key -> Nullable<Text>,
    }
}

diesel::table! {
    payments (id) {
        id -> Int8,
        order_id -> Int8,
        outcome -> Text,
        amount_cents -> Int8,
        card_last4 -> Text,
        created_at -> Timestamptz,
        attempt_key -> Text,
        settled_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    sandbox_charges (attempt_key) {
        attempt_key -> Text,
        approved -> Bool,
        reason -> Text,
        amount_cents -> Int8,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    products (id) {
        id -> Int8,
        name -> Text,
        description -> Text,
        price_cents -> Int8,
        stock -> Int4,
        initial_stock -> Int4,
        per_customer_limit -> Nullable<Int4>,
        sale_starts_at -> Timestamptz,
        sale_ends_at -> Nullable<Timestamptz>,
        created_at -> Timestamptz,
        updated_at -> Timestamptz,
        fence -> Int8,
        queue_mode -> Bool,
        queue_opens_at -> Nullable<Timestamptz>,
        join_check_work -> Int4,
    }
}

diesel::table! {
    queue_admissions (product_id, number) {
        product_id -> Int8,
        number -> Int4,
        ticket -> Text,
        issued_at -> Timestamptz,
        expires_at -> Timestamptz,
        state -> Text,
        order_id -> Nullable<Int8>,
        ended_at -> Nullable<Timestamptz>,
        customer_id -> Int8,
        units -> Int4,
    }
}

diesel::table! {
    queue_draws (product_id) {
        product_id -> Int8,
        seed -> Bytea,
        seed_sha256 -> Bytea,
        committed_at -> Timestamptz,
        drawn_at -> Nullable<Timestamptz>,
        frozen_at -> Nullable<Timestamptz>,
        entries_sha256 -> Nullable<Bytea>,
        last_position -> Int4,
        admission_paused -> Bool,
    }
}

diesel::table! {
    queue_entries (product_id, customer_id) {
        product_id -> Int8,
        customer_id -> Int8,
        ticket -> Text,
        seq -> Int8,
        joined_at -> Timestamptz,
        late -> Bool,
        drawn -> Bool,
        position -> Nullable<Int4>,
    }
}

diesel::table! {
    sessions (id_hash) {
        id_hash -> Bytea,
        customer_id -> Nullable<Int8>,
        created_at -> Timestamptz,
        last_seen_at -> Timestamptz,
        expires_at -> Timestamptz,
        revoked_at -> Nullable<Timestamptz>,
    }
}

diesel::table! {
    spent_challenges (nonce) {
        nonce -> Text,
        expires_at -> Timestamptz,
    }
}

diesel::table! {
    stock_history (id) {
        id -> Int8,
        product_id -> Int8,
        order_id -> Nullable<Int8>,
        delta -> Int4,
        stock_after -> Int4,
        reason -> Text,
        note -> Text,
        created_at -> Timestamptz,
    }
}

diesel::joinable!(admin_actions -> customers (admin_id));
diesel::joinable!(admin_actions -> orders (order_id));
diesel::joinable!(admin_actions -> products (product_id));
diesel::joinable!(holdings -> customers (customer_id));
diesel::joinable!(holdings -> products (product_id));
diesel::joinable!(idempotency_keys -> customers (customer_id));
diesel::joinable!(idempotency_keys -> orders (order_id));
diesel::joinable!(mail_outbox -> customers (customer_id));
diesel::joinable!(order_items -> orders (order_id));
diesel::joinable!(order_items -> products (product_id));
diesel::joinable!(orders -> customers (customer_id));
diesel::joinable!(payments -> orders (order_id));
diesel::joinable!(queue_admissions -> customers (customer_id));
diesel::joinable!(queue_admissions -> orders (order_id));
diesel::joinable!(queue_admissions -> products (product_id));
diesel::joinable!(queue_draws -> products (product_id));
diesel::joinable!(queue_entries -> customers (customer_id));
diesel::joinable!(queue_entries -> products (product_id));
diesel::joinable!(sessions -> customers (customer_id));
diesel::joinable!(stock_history -> orders (order_id));
diesel::joinable!(stock_history -> products (product_id));

diesel::allow_tables_to_appear_in_same_query!(
    admin_actions,
    customers,
    deployment,
    door_counts,
    door_passes,
    holdings,
    idempotency_keys,
    login_attempts,
    mail_outbox,
    order_items,
    orders,
    payments,
    products,
    queue_admissions,
    queue_draws,
    queue_entries,
    sessions,
    spent_challenges,
    stock_history,
);
