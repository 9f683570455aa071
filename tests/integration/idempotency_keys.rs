//! A request's key claim against the same key being freed at that moment:
//! a double send whose first copy failed closed releases the key while the
//! second copy is still polling it.

use std::time::{Duration, Instant};

use flashsale::domain::{CustomerId, IdempotencyKey};
use flashsale::services::idempotency::{claim, fingerprint, release, Claim};

use crate::helpers::spawn_app;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_racing_the_keys_release_never_answers_not_found() {
    let app = spawn_app().await;
    app.customer("claim-race@example.com").await;
    let customer = CustomerId(
        app.db
            .count("SELECT id AS n FROM customers WHERE email = 'claim-race@example.com'"),
    );
    let key = IdempotencyKey::parse("claim-race-key").unwrap();
    let print = fingerprint(&app.shop.fingerprint_key, "POST /cart/checkout\n");
    let pool = app.shop.bookkeeping.clone();

    // One copy claims and, having changed nothing, releases, over and over;
    // the other keeps claiming. Every claim must be an answer about the key.
    let releaser = {
        let (pool, key, print) = (pool.clone(), key.clone(), print.clone());
        tokio::spawn(async move {
            let until = Instant::now() + Duration::from_secs(4);
            while Instant::now() < until {
                if let Ok(Claim::Run) = claim(&pool, customer, &key, &print, "").await {
                    release(&pool, customer, &key).await.unwrap();
                }
            }
        })
    };
    let until = Instant::now() + Duration::from_secs(4);
    let (mut claims, mut runs) = (0, 0);
    while Instant::now() < until {
        match claim(&pool, customer, &key, &print, "").await {
            Ok(Claim::Run) => {
                runs += 1;
                release(&pool, customer, &key).await.unwrap();
            }
            Ok(Claim::InProgress) => {}
            Ok(other) => panic!("a key only ever in progress was answered {other:?}"),
            Err(error) => panic!("claim {claims} failed: {error}"),
        }
        claims += 1;
    }
    releaser.await.unwrap();
    assert!(claims > 100, "only {claims} claims ran");
    assert!(runs > 0, "the key was never free in {claims} claims");
    assert_eq!(
        app.db
            .count("SELECT count(*) AS n FROM idempotency_keys WHERE key = 'claim-race-key'"),
        0
    );
}
