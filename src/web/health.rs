//! Endpoints for machines rather than people: liveness and readiness probes
//! and the Prometheus scrape. None of them needs a session.

use std::time::Duration;

use actix_web::http::header;
use actix_web::{get, web, HttpResponse};

use crate::error::AppError;
use crate::metrics;
use crate::services::readiness::Readiness;
use crate::services::Shop;
use crate::shutdown::Stopping;

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(healthz).service(readyz).service(metrics_text);
}

/// A probe answers within about this long even when a dependency hangs, so
/// an orchestrator's own probe timeout is not what decides.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Liveness: the process is up and serving HTTP. It asks nothing of
/// Postgres or Redis, so a dependency outage never gets a healthy process
/// restarted; `/readyz` is the probe that names what is down.
#[get("/healthz")]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/plain; charset=utf-8")
        .body("alive")
}

/// 200 "ready" when Postgres, a quorum of the lock servers and (if on) the
/// stock gate's Redis answer; 503 naming each one that did not. 503
/// "draining" from the moment the process is told to stop, without asking
/// anyone: a load balancer must take it out of rotation while it still
/// serves (see `crate::shutdown`).
#[get("/readyz")]
pub async fn readyz(shop: web::Data<Shop>, stopping: Option<web::Data<Stopping>>) -> HttpResponse {
    if stopping.is_some_and(|stopping| stopping.is_draining()) {
        return HttpResponse::ServiceUnavailable()
            .content_type("text/plain; charset=utf-8")
            .body("not ready: draining, this instance is stopping");
    }
    let down = down(&Readiness::check(&shop, PROBE_TIMEOUT).await);
    if down.is_empty() {
        HttpResponse::Ok()
            .content_type("text/plain; charset=utf-8")
            .body("ready")
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type("text/plain; charset=utf-8")
            .body(format!("not ready: {} unreachable", down.join(", ")))
    }
}

#[get("/metrics")]
pub async fn metrics_text(shop: web::Data<Shop>) -> Result<HttpResponse, AppError> {
    if !shop.settings.metrics {
        return Err(AppError::NotFound(crate::error::Missing::Page));
    }
    Ok(HttpResponse::Ok()
        .content_type(metrics::CONTENT_TYPE)
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(metrics::render()))
}

/// The names `/readyz` gives what did not answer.
fn down(readiness: &Readiness) -> Vec<&'static str> {
    [
        (readiness.postgres, "postgres"),
        (readiness.redis_locks, "redis lock quorum"),
        (readiness.stock_gate.unwrap_or(true), "stock gate redis"),
    ]
    .into_iter()
    .filter_map(|(ok, name)| (!ok).then_some(name))
    .collect()
}
