//! Building and running the HTTP server. Tests call `Application::build` with
//! `bind = 127.0.0.1:0` and read the port the OS picked.

use std::net::TcpListener;

use crate::web::session_cookie::SessionCookies;
use actix_web::dev::Server;
use actix_web::middleware::{from_fn, DefaultHeaders};
use actix_web::{web, App, HttpServer};

use crate::config::Settings;
use crate::services::Shop;

pub struct Application {
    port: u16,
    server: Server,
    shop: Shop,
    /// The background jobs; they stop with the server, so a stopped shop
    /// lets go of its database connections.
    jobs: Vec<tokio::task::JoinHandle<()>>,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Application> {
        let listener = TcpListener::bind(&settings.bind)?;
        let port = listener.local_addr()?.port();
        let shop = Shop::new(settings).await?;
        // Before the first page, so cookies are trusted from the start; if
        // Postgres cannot answer yet, pages ask the sessions table meanwhile.
        if let Err(error) = crate::services::revocations::poll_revocations(&shop).await {
            tracing::warn!(%error, "could not load revoked sessions at start-up");
        }
        let server = serve(listener, shop.clone())?;
        crate::services::stock_gate::seed_all(&shop).await;
        let mut jobs = vec![crate::services::jobs::spawn(
            shop.clone(),
            shop.settings.jobs_interval,
        )];
        jobs.push(crate::services::revocations::spawn_revocation_watcher(
            shop.clone(),
        ));
        jobs.extend(crate::services::jobs::spawn_reconcile(
            shop.clone(),
            shop.settings.reconcile_interval,
        ));
        Ok(Application {
            port,
            server,
            shop,
            jobs,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server from outside (tests stop theirs when they end).
    pub fn handle(&self) -> actix_web::dev::ServerHandle {
        self.server.handle()
    }

    pub fn shop(&self) -> &Shop {
        &self.shop
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = self.server.await;
        for job in self.jobs {
            job.abort();
        }
        served
    }
}

fn serve(listener: TcpListener, shop: Shop) -> anyhow::Result<Server> {
    let cookies = web::Data::new(SessionCookies::new(
        &shop.settings.session_key,
        shop.settings.cookie_secure,
    ));
    let shop = web::Data::new(shop);
    let server = HttpServer::new(move || {
        App::new()
            .wrap(from_fn(crate::web::session::check_session))
            .wrap(security_headers())
            .wrap(from_fn(crate::web::session_cookie::carry))
            // Outermost, so the id covers the session middleware and every page.
            .wrap(from_fn(crate::web::request_id::tag_request))
            .app_data(shop.clone())
            .app_data(cookies.clone())
            .configure(crate::web::routes)
    })
    .workers(
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
            .clamp(2, 8),
    )
    .listen(listener)?
    .run();
    Ok(server)
}

fn security_headers() -> DefaultHeaders {
    DefaultHeaders::new()
        .add((
            "Content-Security-Policy",
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'",
        ))
        .add(("X-Content-Type-Options", "nosniff"))
        .add(("Referrer-Policy", "same-origin"))
        .add(("X-Frame-Options", "DENY"))
}
