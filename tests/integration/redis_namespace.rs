//! Every Redis key carries the namespace the database got at migration, so a
//! reset database never inherits the old one's gate counts or markers, and two
//! deployments sharing one Redis (and one key prefix) never share stock.

use crate::helpers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reset_database_ignores_what_redis_kept_from_the_old_one() {
    let db = TestDb::new();
    let url = db.url.clone();
    let prefix = unique_prefix();
    let settle =
        |prefix: String| move |s: &mut flashsale::config::Settings| s.redis_key_prefix = prefix;

    let before = spawn_app_on(TestDb::attach(&url), settle(prefix.clone())).await;
    let product = before.product(5, None).await;
    let buyers = before.customers(6, "old").await;
    let statuses = burst(buyers, product, 6).await;
    assert_eq!(tally(&statuses).get(&303), Some(&5));
    let old_namespace = db.redis_namespace();
    let old_prefix = before.shop.redis_prefix.clone();
    drop(before);

    // The operator resets the database; Redis keeps the old keys.
    db.reset();
    let new_namespace = db.redis_namespace();
    assert_ne!(
        old_namespace, new_namespace,
        "a fresh database, a fresh namespace"
    );

    let after = spawn_app_on(db, settle(prefix)).await;
    let reused = after.product(3, None).await;
    assert_eq!(
        reused, product,
        "the reset database hands out the same id again"
    );
    if after.settings.stock_gate {
        // The old database's gate still says this id is sold out.
        let mut redis = redis::Client::open(after.settings.redis_urls[0].as_str())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let old_stock: Option<i64> = redis::cmd("GET")
            .arg(format!("{old_prefix}gate:{{product:{product}}}:stock"))
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(old_stock, Some(0), "the old gate count is still in Redis");
    }
    let buyers = after.customers(5, "new").await;
    let statuses = burst(buyers, reused, 5).await;
    let counts = tally(&statuses);
    assert_eq!(counts.get(&303), Some(&3), "answers: {counts:?}");
    assert_eq!(counts.get(&409), Some(&2), "answers: {counts:?}");
    assert_eq!(after.db.stock(reused), 0);
    after.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_deployments_on_one_redis_and_prefix_keep_their_own_stock() {
    // Same Redis, same (empty) key prefix, the same product id in each database.
    let first = spawn_app_with(|s| s.redis_key_prefix = String::new()).await;
    let second = spawn_app_with(|s| s.redis_key_prefix = String::new()).await;
    assert_ne!(first.shop.redis_prefix, second.shop.redis_prefix);
    let a = first.product(4, None).await;
    let b = second.product(6, None).await;
    assert_eq!(a, b, "both databases start their ids at the same number");

    let (first_buyers, second_buyers) = (
        first.customers(10, "first").await,
        second.customers(10, "second").await,
    );
    let (first_answers, second_answers) =
        tokio::join!(burst(first_buyers, a, 10), burst(second_buyers, b, 10));
    assert_eq!(tally(&first_answers).get(&303), Some(&4));
    assert_eq!(tally(&second_answers).get(&303), Some(&6));
    assert_eq!(
        tally(&first_answers)
            .get(&503)
            .or(tally(&second_answers).get(&503)),
        None
    );
    assert_eq!(first.db.stock(a), 0);
    assert_eq!(second.db.stock(b), 0);
    first.db.assert_audit_clean();
    second.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tests_redis_keys_leave_with_its_database() {
    // The suite shares the machine's Redis and never flushes it, so each test
    // takes its own keys away when its database goes, pass or fail.
    let app = spawn_app().await;
    let product = app.product(3, Some(1)).await;
    let statuses = burst(app.customers(4, "leaving").await, product, 4).await;
    assert_eq!(tally(&statuses).get(&303), Some(&3));
    let pattern = format!("{}*", app.shop.redis_prefix);
    assert!(keys_matching(&pattern) > 0, "the sale left keys in Redis");
    drop(app);
    assert_eq!(keys_matching(&pattern), 0, "keys left under {pattern}");
}

/// How many keys of the machine's Redis match `pattern`.
fn keys_matching(pattern: &str) -> usize {
    use redis::Commands;
    let url = std::env::var("REDIS_URL")
        .unwrap_or_else(|_| flashsale::config::Settings::DEFAULT_REDIS_URL.into());
    let first = url.split(',').next().unwrap().trim().to_owned();
    let mut conn = redis::Client::open(first)
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Result<Vec<String>, _> = conn.scan_match(pattern).unwrap().collect();
    keys.unwrap().len()
}
