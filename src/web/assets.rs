//! The stylesheet and the page script, compiled into the binary.

use actix_web::{get, http::header, web, HttpResponse};

pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(stylesheet).service(script);
}

#[get("/static/app.css")]
pub async fn stylesheet() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(include_str!("../../templates/static/app.css"))
}

#[get("/static/app.js")]
pub async fn script() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "public, max-age=3600"))
        .body(include_str!("../../templates/static/app.js"))
}
