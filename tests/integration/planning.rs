//! How the shop's connections plan: a statement prepared while a sale's
//! tables were empty must not keep the plan it got then. Postgres plans a
//! purchase's foreign-key checks that way (once per connection, kept), and
//! a sequential scan kept from an empty `orders` reads the whole table on
//! every check as a sale fills it.

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::sql_types::Text;

use crate::helpers::spawn_app;

#[derive(QueryableByName)]
struct PlanLine {
    #[diesel(sql_type = Text, column_name = "QUERY PLAN")]
    line: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_prepared_on_an_empty_table_uses_the_index_once_the_table_has_grown() {
    let app = spawn_app().await;
    app.customer("planning@example.com").await;
    let mut admin = app.db.conn();
    // The state of a new shop after autovacuum: the tables analyzed empty.
    admin.batch_execute("VACUUM ANALYZE orders").unwrap();

    let plan = flashsale::db::run(&app.shop.pool, |conn| {
        // The foreign-key check a purchase's order item fires, as Postgres
        // words it, prepared and run while `orders` is empty: past five
        // runs Postgres would settle on a generic plan and keep it.
        conn.batch_execute(
            "PREPARE order_exists(bigint) AS SELECT 1 FROM ONLY orders x WHERE id = $1 FOR KEY SHARE OF x",
        )?;
        for _ in 0..8 {
            conn.batch_execute("EXECUTE order_exists(1)")?;
        }
        conn.batch_execute(
            "INSERT INTO orders (customer_id, status, total_cents, payment_deadline) \
             SELECT (SELECT id FROM customers WHERE email = 'planning@example.com'), 'expired', 100, now() \
             FROM generate_series(1, 20000)",
        )?;
        let lines: Vec<PlanLine> = diesel::sql_query("EXPLAIN EXECUTE order_exists(1)").load(conn)?;
        conn.batch_execute("DEALLOCATE order_exists")?;
        Ok(lines.into_iter().map(|l| l.line).collect::<Vec<_>>().join("\n"))
    })
    .await
    .unwrap();
    assert!(
        plan.contains("Index Scan using orders_pkey") && !plan.contains("Seq Scan"),
        "after 20,000 orders the check still plans as:\n{plan}"
    );
}
