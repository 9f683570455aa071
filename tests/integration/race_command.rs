//! `flashsale race` as a library against the real server: 20 buyers, 5 units.
use crate::helpers::{spawn_app, PASSWORD};
use flashsale::qa::race::{run_race, PayMode, RaceConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn twenty_buyers_for_five_units_buy_exactly_five() {
    let app = spawn_app().await;
    app.admin().await;
    let product = app.product(5, None).await;

    let mut config = RaceConfig::new(&app.address, "admin@example.com", PASSWORD);
    config.product = Some(product);
    config.database_url = Some(app.db.url.clone());
    let report = run_race(config).await.unwrap();

    assert_eq!(report.purchased, 5, "{}", report.render());
    assert_eq!(report.sold_out, 15, "{}", report.render());
    assert_eq!(report.errors, 0, "{}", report.render());
    assert!(report.passed(), "{}", report.render());
    app.db.assert_audit_clean();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn race_creates_its_product_pays_refunds_and_checks_the_dashboard() {
    let app = spawn_app().await;
    app.admin().await;

    // Created through the database, then checked through the admin dashboard only.
    let mut config = RaceConfig::new(&app.address, "admin@example.com", PASSWORD);
    config.database_url = Some(app.db.url.clone());
    config.stock = 3;
    config.buyers = 6;
    config.pay = Some(PayMode::Mixed);
    config.refund = 1;
    let report = run_race(config).await.unwrap();
    assert_eq!(report.purchased, 3, "{}", report.render());
    assert_eq!((report.paid, report.declined, report.refunded), (2, 1, 1));
    assert!(report.passed(), "{}", report.render());

    let mut again = RaceConfig::new(&app.address, "admin@example.com", PASSWORD);
    again.product = Some(report.product);
    again.stock = 3;
    again.buyers = 4;
    let second = run_race(again).await.unwrap();
    // Two units came back (one decline, one refund) and the reused accounts buy them.
    assert_eq!(second.purchased, 2, "{}", second.render());
    assert_eq!(second.checked_via, "admin dashboard");
    assert!(second.passed(), "{}", second.render());
    app.db.assert_audit_clean();
}
