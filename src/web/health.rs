use actix_web::{get, web, HttpResponse};
use diesel::RunQueryDsl;

use crate::db;
use crate::services::Shop;

/// 200 when Postgres and a quorum of Redis servers answer, 503 otherwise.
#[get("/healthz")]
pub async fn healthz(shop: web::Data<Shop>) -> HttpResponse {
    let database = db::run(&shop.pool, |conn| {
        diesel::sql_query("SELECT 1").execute(conn)?;
        Ok(())
    })
    .await
    .is_ok();
    let redis = shop.locks.quorum_reachable().await;
    let body = serde_json::json!({
        "postgres": if database { "ok" } else { "unreachable" },
        "redis": if redis { "ok" } else { "unreachable" },
    });
    if database && redis {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}
